"""Session checks shared by every test folder."""

from __future__ import annotations

from pathlib import Path

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
