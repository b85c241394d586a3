"""Durations as trigger files write them: "250ms", "10s", "5m", "2h", "1d", or "none".

Inside onceflow a duration is a whole number of milliseconds, as record times are.
"""

from __future__ import annotations

import re
from typing import Final

from .tomltext import toml_text

_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")

DURATION_HELP: Final = ('a duration such as "250ms", "10s", "5m", "2h" or "1d" '
                        '(or a number of seconds)')


def parse_duration(value: object, *, allow_none: bool = False) -> int | None:
    """Return the duration in whole milliseconds; None for "none" when allowed.

    A number is a number of seconds.  A duration is rounded to the nearest millisecond
    ("1.0005s" is 1000 ms, ties to even).  Raises ValueError with a message saying what
    was expected.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected {DURATION_HELP}, got {toml_text(value)}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"expected a duration of zero or more, got {toml_text(value)}")
        return _whole_ms(float(value) * 1000, value)
    if isinstance(value, str):
        if value.strip().lower() == "none":
            if allow_none:
                return None
            raise ValueError(f'"none" is not allowed here; expected {DURATION_HELP}')
        match = _PATTERN.match(value)
        if match:
            number = match.group(1)
            unit = _UNITS[match.group(2)]
            if "." not in number:
                return int(number) * unit
            return _whole_ms(float(number) * unit, value)
    extra = ' or "none"' if allow_none else ""
    raise ValueError(f"expected {DURATION_HELP}{extra}, got {toml_text(value)}")


def _whole_ms(scaled: float, value: object) -> int:
    if scaled - scaled != 0.0:  # infinite or NaN
        raise ValueError(f"expected {DURATION_HELP}, got {toml_text(value)}")
    return round(scaled)


def format_duration(ms: int | None) -> str:
    """Render milliseconds back in the trigger-file form (for views and docs)."""
    if ms is None:
        return "none"
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    if ms < 1000:
        return f"{ms}ms"
    return f"{ms / 1000:g}s"
