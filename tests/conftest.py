"""Session checks shared by every test folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compiled_folders() -> tuple[str, ...]:
    """The folders setup.py compiles: all of core/, and those of COMPILED_WORKER there."""
    import ast

    for node in ast.parse((ROOT / "setup.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "COMPILED_WORKER"
                for target in node.targets):
            return ("core", *ast.literal_eval(node.value))
    raise AssertionError("setup.py has no COMPILED_WORKER")


COMPILED_FOLDERS = _compiled_folders()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to test compiled modules older than their sources.

    setup.py compiles core/ and the worker's per-record modules with mypyc and the
    extension modules shadow the .py files: a source edited since would not be what runs.
    """
    compiled = [path for folder in COMPILED_FOLDERS for path in (ROOT / folder).glob("*.so")]
    if not compiled:
        return  # a pure-Python install (ONCEFLOW_PURE_PYTHON=1)
    built = max(path.stat().st_mtime for path in compiled)  # the newest holds all the code
    # Every core source counts (the core is compiled whole); elsewhere a module's source.
    sources = list((ROOT / "core").glob("*.py")) + [
        path.with_name(path.name.split(".")[0] + ".py") for path in compiled
        if path.parent.name != "core"]
    changed = sorted(f"{path.parent.name}/{path.name}" for path in sources
                     if path.stat().st_mtime > built)
    if changed:
        pytest.exit(f"{', '.join(changed)} changed after the modules were compiled: run "
                    f"`make test` (it recompiles) or `.venv/bin/pip install -e .`",
                    returncode=2)


# The tests' workers and commands are forks of a process that has imported them
# (tests/forkserver.py): about 0.5 s of CPU less a worker, some 110 workers a run.
# ONCEFLOW_TEST_FORKSERVER=0 starts them as the product does.
def _launch_forked(args: list[str], env: dict[str, str], log: Any) -> Any:
    from forkserver import shared

    server = shared()
    assert server is not None
    return server.spawn(args, env, Path(log.name))


def pytest_configure(config: pytest.Config) -> None:
    """Start the tests' workers from the fork server unless ONCEFLOW_TEST_FORKSERVER=0."""
    from forkserver import shared

    if shared() is not None:
        from onceflow.app import process

        process.launch = _launch_forked


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `pytest -n N --dist loadscope` (make test runs so): a test module goes to one
    process, so its module-scoped fixtures (the live scenario runs, a worker and its
    topics) are made once, and the Spark tests that use the session fixture go to a few
    processes (SPARK_SCOPES), so one JVM serves each group.

    Work goes out in collection order (pytest_collection_modifyitems puts the longest
    chains first), not by number of tests, and a process gets its next module only when
    it has one test left to run, not two: the container module has two tests, and a module
    queued behind its image build waited the whole build while other processes ran dry.
    """
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModulesAndSpark(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return SPARK_SCOPES.get(module, module)

        def _assign_work_unit(self, node: Any) -> None:
            # A process given a module while it holds the last test of a long one runs
            # that test first: the module queued behind it is the shortest there is (the
            # end of the queue), not the next long one (a 63 s module waited 204 s behind
            # the standalone cluster's only test).
            held = [nodeid for unit in self.assigned_work.get(node, {}).values()
                    for nodeid, done in unit.items() if not done]
            if len(held) == 1 and held[0].startswith(LONGEST_FIRST) and self.workqueue:
                self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            # xdist's, with 1 for its "2 tests left" heuristic (a process runs a test once
            # it knows the next one, so 1 is the least that keeps it busy).
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return ModulesAndSpark(config, log)


# The Spark modules that use the session fixture, in two groups (one JVM each).  A JVM's
# first replay and first audit cost three to five times its later ones (JIT, class
# loading): with three groups the report module spent 49-57 s of CPU in a JVM of its
# own, and 21-26 s after the generated archive's tests in the same JVM (2026-11-27:
# 3m45s against 4m08s, the image rebuilt both times).  The others start Spark in
# processes of their own (a standalone cluster, the command line): each is a module like
# any other.
SPARK_SCOPES = {
    "tests/spark/test_spark_generated.py": "spark-1",
    "tests/spark/test_spark_plan.py": "spark-1",
    "tests/spark/test_spark_audit_keys.py": "spark-1",
    "tests/spark/test_spark_report.py": "spark-1",
    "tests/spark/test_spark_scenarios.py": "spark-2",
    "tests/spark/test_spark_archive.py": "spark-2",
}
# The order modules go out in (measured on 2 cores, 2026-11-25): the container build (CPU-
# bound, ~80 s alone) beside the live scenarios (they mostly wait), then the Spark groups,
# the standalone cluster and the command-line runs, then the longest of the rest.
LONGEST_FIRST = (
    "tests/deploy/test_container.py",
    "tests/integration/test_live_scenarios.py",
    "tests/spark/test_spark_generated.py", "tests/spark/test_spark_plan.py",
    "tests/spark/test_spark_audit_keys.py",
    "tests/spark/test_spark_report.py", "tests/spark/test_spark_scenarios.py",
    "tests/spark/test_spark_archive.py",
    "tests/spark/test_spark_cluster.py",
    "tests/spark/test_spark_session.py",
    "tests/integration/test_security.py",
    "tests/integration/test_crash_safety.py",
    "tests/integration/test_cli_live.py",
)


# Then (measured in a whole run on 2 cores, 2026-11-26: 8 to 21 s each) the longer of the
# rest: modules that mostly wait for their workers and brokers go while the Spark and
# container modules keep the cores busy, so that the end of a run is the short modules,
# which keep both cores busy to the last, not a few slow ones that wait.
LONGER_NEXT = (
    "tests/core/test_properties.py",
    "tests/integration/test_bridge.py",
    "tests/integration/test_hostile_records.py",
    "tests/integration/test_trigger_fingerprint.py",
    "tests/integration/test_probes.py",
    "tests/integration/test_console.py",
    "tests/integration/test_web_and_ops.py",
    "tests/integration/test_clock.py",
    "tests/integration/test_bad_internal_records.py",
    "tests/integration/test_rolling_triggers.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest chains first (LONGEST_FIRST), then LONGER_NEXT, then the other
    integration modules, then the rest, so that with several processes the short modules
    fill in around the long ones and end the run."""
    order = (*LONGEST_FIRST, *LONGER_NEXT)
    # A module on the shared session outside SPARK_SCOPES would start a JVM of its own in
    # whichever process it lands (about 7 s of CPU, and a cold JVM's slower first jobs).
    strays = sorted({item.nodeid.split("::")[0] for item in items
                     if "spark" in getattr(item, "fixturenames", ())
                     and item.nodeid.split("::")[0] not in SPARK_SCOPES})
    if strays:
        raise pytest.UsageError("modules on the shared Spark session that SPARK_SCOPES "
                                f"(tests/conftest.py) does not place: {', '.join(strays)}")

    def rank(item: pytest.Item) -> int:
        for place, start in enumerate(order):
            if item.nodeid.startswith(start):
                return place
        return len(order) + (0 if item.nodeid.startswith("tests/integration/") else 1)
    items.sort(key=rank)
