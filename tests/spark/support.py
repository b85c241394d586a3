"""Helpers shared by the Spark tests."""

from __future__ import annotations

import sys
from pathlib import Path

from onceflow.journal import contract_multiset as multiset  # noqa: F401 - for the tests

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "scenarios"
SHARED = ROOT.parent / "shared" / "examples"

if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))


def scenario_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "triggers.toml").exists())

