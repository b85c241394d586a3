"""Durations as trigger files write them: "250ms", "10s", "5m", "2h", "1d", or "none"."""

from __future__ import annotations

import re
from typing import Final

from .tomltext import toml_text

_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")

DURATION_HELP: Final = ('a duration such as "250ms", "10s", "5m", "2h" or "1d" '
                        '(or a number of seconds)')


def parse_duration(value: object, *, allow_none: bool = False) -> float | None:
    """Return the duration in seconds; None for "none" when allowed.

    Raises ValueError with a message saying what was expected.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected {DURATION_HELP}, got {toml_text(value)}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"expected a duration of zero or more, got {toml_text(value)}")
        return float(value)
    if isinstance(value, str):
        if value.strip().lower() == "none":
            if allow_none:
                return None
            raise ValueError(f'"none" is not allowed here; expected {DURATION_HELP}')
        match = _PATTERN.match(value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2)]
    extra = ' or "none"' if allow_none else ""
    raise ValueError(f"expected {DURATION_HELP}{extra}, got {toml_text(value)}")


def format_duration(seconds: float | None) -> str:
    """Render seconds back in the trigger-file form (for views and docs)."""
    if seconds is None:
        return "none"
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:g}s"
