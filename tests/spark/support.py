"""Helpers shared by the Spark tests."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from onceflow.journal import contract_key

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "scenarios"
SHARED = ROOT.parent / "shared" / "examples"

if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))


def scenario_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "triggers.toml").exists())


def multiset(lines: list[bytes]) -> Counter[tuple[Any, ...]]:
    return Counter(contract_key(orjson.loads(line)) for line in lines if line.strip())
