"""Values as a TOML file writes them, for messages about trigger files (`got true`)."""

from __future__ import annotations

import json
import math
from typing import Any


def toml_text(value: Any) -> str:
    """`value` in TOML syntax: true, "text", [1, 2], { a = 1 }; None (absent) is nothing."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_text(item) for item in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(str(k))} = {toml_text(v)}"
                                for k, v in value.items()) + " }"
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return str(isoformat())
    return str(value)


def _key(key: str) -> str:
    if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key):
        return key
    return json.dumps(key, ensure_ascii=False)
