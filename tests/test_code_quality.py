"""Conventions the code keeps: ruff everywhere, mypy strict on what is compiled, one-way imports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean() -> None:
    folders = [f for f in ("core", "app", "agents", "tables", "pipeline", "bench", "tests")
               if (ROOT / f).is_dir()]
    result = run(str(BIN / "ruff"), "check", *folders)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_core() -> None:
    result = run(str(BIN / "mypy"), "core")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_compiled_worker_modules(tmp_path: Path) -> None:
    # They are laid out as setup.py stages them for mypyc (onceflow/, onceflow/tables/,
    # onceflow/agents/): the repository's folders do not carry the package's names.
    namespace: dict[str, dict[str, list[str]]] = {}
    source = (ROOT / "setup.py").read_text(encoding="utf-8")
    for name in ("COMPILED_WORKER", "READ_ONLY_WORKER"):
        start = source.index(f"{name} = {{")
        exec(source[start:source.index("}", start) + 1], namespace)  # noqa: S102
    stage = tmp_path / "onceflow"
    shutil.copytree(ROOT / "core", stage, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    paths = []
    for package, names in namespace["COMPILED_WORKER"].items():
        (stage / package).mkdir()
        for name in names + namespace["READ_ONLY_WORKER"][package]:
            shutil.copy2(ROOT / package / f"{name}.py", stage / package / f"{name}.py")
        paths += [f"onceflow/{package}/{name}.py" for name in names]
    # With the repository's settings, as setup.py hands them to mypyc.
    result = subprocess.run([str(BIN / "mypy"), "--strict", "--config-file",
                             str(ROOT / "pyproject.toml"), "--cache-dir",
                             str(tmp_path / "cache"), *paths], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_core_imports_no_runner() -> None:
    # Dependencies point one way: core <- tables <- agents <- app.
    for path in (ROOT / "core").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for runner in ("faust", "pyspark", "aiokafka", "onceflow.agents", "onceflow.tables",
                       "onceflow.app", "onceflow.pipeline"):
            assert f"import {runner}" not in text and f"from {runner}" not in text, (
                f"{path.name} imports {runner}")


# Which onceflow packages each package may not import: dependencies point one way,
# core <- tables <- agents <- app, and core <- pipeline <- app (app is the top).
FORBIDDEN = {
    "tables": ("onceflow.agents", "onceflow.app", "onceflow.pipeline"),
    "agents": ("onceflow.app", "onceflow.pipeline"),
    "pipeline": ("onceflow.agents", "onceflow.app", "onceflow.tables"),
}


def test_every_package_imports_only_the_layers_below_it() -> None:
    for package, forbidden in FORBIDDEN.items():
        for path in (ROOT / package).glob("*.py"):
            text = path.read_text(encoding="utf-8")
            for name in forbidden:
                assert f"import {name}" not in text and f"from {name}" not in text, (
                    f"{package}/{path.name} imports {name}")


def test_every_core_module_but_the_exceptions_is_compiled() -> None:
    # A core module left out of setup.py's list runs interpreted on every document
    # (keys.py once was: its key building took 14% of a replay).
    namespace: dict[str, object] = {}
    source = (ROOT / "setup.py").read_text(encoding="utf-8")
    start = source.index("COMPILED = [")
    exec(source[start:source.index("]", start) + 1], namespace)  # noqa: S102
    modules = {path.stem for path in (ROOT / "core").glob("*.py")}
    assert set(namespace["COMPILED"]) == modules - {"__init__", "errors"}  # type: ignore[arg-type]


def test_build_jobs_refuses_a_setting_that_is_not_a_count() -> None:
    # setup.py's ONCEFLOW_BUILD_JOBS: a bad value stops the install with a message that
    # names the setting, not a ValueError traceback from inside pip's build.
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    (function,) = [node for node in tree.body
                   if isinstance(node, ast.FunctionDef) and node.name == "build_jobs"]
    namespace: dict[str, Any] = {"os": os}
    exec(compile(ast.Module([function], []), "setup.py", "exec"), namespace)  # noqa: S102
    build_jobs = namespace["build_jobs"]
    assert build_jobs("3") == 3 and build_jobs(" 2 ") == 2
    assert build_jobs(None) >= 1 and build_jobs("") == build_jobs(None)
    for bad in ("abc", "0", "-4", "2.5", "1e3", "99999999999", "\x00", "x" * 5000):
        with pytest.raises(SystemExit, match="BUILD_JOBS must be a whole number") as caught:
            build_jobs(bad)
        assert len(str(caught.value)) < 200


# The source folders and the packages they are installed as.
PACKAGES = {"core": "onceflow", "tables": "onceflow.tables", "agents": "onceflow.agents",
            "app": "onceflow.app", "pipeline": "onceflow.pipeline"}


def import_graph() -> dict[str, set[str]]:
    """Every onceflow module and the onceflow modules it imports, anywhere in its body.

    Function-local imports count: a cycle hidden inside a function is still a cycle.
    """
    import ast

    modules: dict[str, tuple[Path, bool]] = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).glob("*.py"):
            is_package = path.stem == "__init__"
            modules[package if is_package else f"{package}.{path.stem}"] = (path, is_package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = here.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1])
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def test_no_module_takes_part_in_an_import_cycle() -> None:
    graph = import_graph()
    cycles = []
    for start in graph:
        # Every module reachable from start; a path back to start is a cycle.
        seen: set[str] = set()
        todo = [(start, [start])]
        while todo:
            name, path = todo.pop()
            for after in graph[name]:
                if after == start:
                    cycles.append(" -> ".join([*path, start]))
                elif after not in seen:
                    seen.add(after)
                    todo.append((after, [*path, after]))
    assert cycles == []


def test_only_the_replay_driver_imports_the_engine() -> None:
    # The worker and Spark drive the core's partition, not the replay's Engine.
    graph = import_graph()
    users = sorted(name for name, imported in graph.items() if "onceflow.engine" in imported)
    assert users == ["onceflow.app.replay"]


def source_files() -> list[Path]:
    return [path for folder in PACKAGES for path in sorted((ROOT / folder).glob("*.py"))]


# Where the routing key and the history keys may be built (each rule lives in one place):
# core/partition.py (route_of, routing_key, seed_route) and core/history.py (state_keys).
KEY_RULES = {
    r"\broutes_by_activation\b": {"core/triggers.py", "core/partition.py", "core/history.py",
                             # names the join triggers for the Spark column that mirrors
                             # state_keys (history_key_column, tested against it)
                             "pipeline/audit_checks.py"},
    r"\bhistory_key\(": {"core/history.py"},
    r"\bentry_key\(": {"core/history.py"},
    r"\bpair_key\(": {"core/history.py", "core/keys.py"},
}


def test_no_module_is_longer_than_500_lines() -> None:
    """A module past that is split by responsibility (CONVENTIONS: modules under ~400)."""
    long = {f"{path.relative_to(ROOT)}": n for folder in PACKAGES
            for path in (ROOT / folder).glob("*.py")
            if (n := len(path.read_text().splitlines())) > 500}
    assert not long, long


# The rules of one partition (issue 27): each is written in its core home alone, and the
# runners drive it.  A pattern that writes a rule -> the files that may hold it.
RULE_HOMES = {
    # a trigger's suspension: TriggerProcessor.suspend and resume set the flags; the worker
    # and Spark suspend through Partition (suspend, suspend_by_command, the restart's
    # restore from the Holding)
    r"\.suspended(_reason)?\s*=(?!=)": {"core/processor.py"},
    # the clock limit: its decision and its message (ClockLimit.ahead)
    r"worker's clock, more than": {"core/partition.py"},
    r"\bClockLimit\(": {"core/partition.py", "agents/clock.py"},
    # the sweep horizon: computed by SweepHorizon, and described there once
    r"\bSweepHorizon\(": {"core/partition.py", "agents/faust_app.py"},
    r"lowest partition time": set(),
    # key separators and ingress's stored keys: core/keys.py
    r"\bdef (partition_scope|dup_id_key|id_slot_key|id_next_key|redelivered_key)\(":
        {"core/keys.py"},
    # the dead-letter, rejection and error-output documents: core/outputs.py, but for the
    # worker's last resort (agents/rejects.raw_letter), which reads a record's bytes alone
    # (module-level functions: wire.Names.dead_letter is the topic's name; membership's
    # refusal is the message of a worker refused by its group)
    r"\ndef (dead_letter|document_letter|output_letter|unread_letter|error_output|"
    r"rejection|refusal)\(": {"core/outputs.py", "app/membership.py"},
    r"Output\(\s*DEAD_LETTER_TOPIC": {"core/outputs.py", "agents/rejects.py"},
}


@pytest.mark.parametrize("pattern", sorted({**KEY_RULES, **RULE_HOMES}))
def test_each_rule_is_written_only_in_its_core_home(pattern: str) -> None:
    """The routing and history keys (KEY_RULES) and the partition rules (RULE_HOMES)."""
    import re

    homes = {**KEY_RULES, **RULE_HOMES}[pattern]
    found = {str(path.relative_to(ROOT)) for path in source_files()
             if re.search(pattern, path.read_text(encoding="utf-8"))}
    assert found <= homes, found - homes


# What a runner's module must call (the core home of a rule), and what it must not write
# itself: file -> (patterns that must be there, patterns that must not).
RULE_CALLS = {
    # the clock limit: the worker's ingress and load, and its ticks, ask the core
    "agents/partition_worker.py": ([r"\.time_refused\(ts\)", r"\.start_at\(",
                                    r"clock\.clock_limit\(", r"\.sweep_due\(now, self\.rt\."
                                    r"sweep_horizon\(\)"],
                                   [r"\.suspended\s*=", r"\bclock\.(ahead|limit)\(",
                                    r"skew\s*[+<>]"]),
    "agents/controls.py": ([r"\.time_refused\(ts, tick=True\)"],
                           [r"\bclock\.", r"max_clock_skew", r"wall_clock\(\)\s*\+"]),
    # the worker's side of the clock: its wall clock and the setting, no decision
    "agents/clock.py": ([r"\bClockLimit\("],
                        [r"def ahead\b", r"def limit\b", r"[<>]=?\s*\w*limit"]),
    # the sweep horizon: the Faust app hands records and commits to the core's SweepHorizon
    "agents/faust_app.py": ([r"\bSweepHorizon\(\)",
                             r"\.oldest\(app\.consumer\._committed_offset\)"],
                            [r"_committed_offset\.get\(", r"class \w*Uncommitted"]),
    # Spark moves partition time on the core's record times (record_time, in the read
    # stage), converting nothing
    "pipeline/read_stage.py": ([r"\brecord_time\("], [r"float\(splits\.high"]),
    "pipeline/trigger_stage.py": ([r"\.partition\.advance\(", r"\.partition\.suspend\("],
                                  [r"\bround\(", r"\bint\(", r"\.suspended\s*="]),
    # a rejected record's journal record and dead letter, a refused document's record and
    # error document: one call each to the core (onceflow.outputs)
    "agents/rejects.py": ([r"\brejection\(record,", r"\brefusal\(processor\.trigger,",
                           r"\bdocument_letter\("], [r"def (rejection|refusal)\b"]),
    "core/processor.py": ([r"\berror_output\(", r"\brefusal\(", r"\bdocument_letter\("],
                          [r"Output\(\s*DEAD_LETTER_TOPIC"]),
    # ingress's keys come from core/keys.py: no separator of its own
    "core/ingress.py": ([r"\bdup_id_key\(", r"\bid_slot_key\(", r"\bpartition_scope\("],
                        [r"""["'][|#]""", r"""\+\s*["'][|#/]""", r"\{topic\}/\{partition\}"]),
}


@pytest.mark.parametrize("path", sorted(RULE_CALLS))
def test_runners_call_the_core_home_of_each_rule(path: str) -> None:
    import re

    text = (ROOT / path).read_text(encoding="utf-8")
    required, forbidden = RULE_CALLS[path]
    missing = [pattern for pattern in required if not re.search(pattern, text)]
    written = [pattern for pattern in forbidden if re.search(pattern, text, re.MULTILINE)]
    assert not missing and not written, f"{path}: missing {missing}, writes {written}"
