"""Helpers shared by the Spark tests."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "scenarios"
SHARED = ROOT.parent / "shared" / "examples"
FIELDS = ("trigger", "outcome", "identity", "activation", "ts")

if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))


def scenario_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "triggers.toml").exists())


def five(record: dict[str, Any]) -> tuple[Any, ...]:
    """The contract fields, with the type of ts (an int ts stays an int)."""
    return tuple(record[f] for f in FIELDS) + (type(record["ts"]).__name__,)


def multiset(lines: list[bytes]) -> Counter[tuple[Any, ...]]:
    return Counter(five(orjson.loads(line)) for line in lines if line.strip())
