"""Session checks shared by every test folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CORE = Path(__file__).resolve().parents[1] / "core"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to test a compiled core older than its sources.

    setup.py compiles core/ with mypyc and the extension modules shadow the .py files: a
    source edited since would not be what runs.
    """
    compiled = list(CORE.glob("*.so"))
    if not compiled:
        return  # a pure-Python install (ONCEFLOW_PURE_PYTHON=1)
    built = max(path.stat().st_mtime for path in compiled)  # the newest holds all the code
    changed = sorted(path.name for path in CORE.glob("*.py") if path.stat().st_mtime > built)
    if changed:
        pytest.exit(f"core/{', core/'.join(changed)} changed after the core was compiled: "
                    f"run `make test` (it recompiles) or `.venv/bin/pip install -e .`",
                    returncode=2)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `pytest -n N --dist loadscope` (make test runs so): a test module goes to one
    process, so its module-scoped fixtures (the live scenario runs, a worker and its
    topics) are made once, and every Spark test goes to the same process, so one JVM (the
    session fixture) serves them all."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndSpark(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "spark" if nodeid.startswith("tests/spark/") else nodeid.split("::")[0]

    return ModulesAndSpark(config, log)


LONGEST_FIRST = ("tests/spark/", "tests/deploy/test_container.py",
                 "tests/integration/test_live_scenarios.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest chains first (the Spark tests, the container build, the live scenario
    runs), so that with several processes the short modules fill in around them."""
    def rank(item: pytest.Item) -> int:
        for place, start in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(start):
                return place
        return len(LONGEST_FIRST)
    items.sort(key=rank)
