"""Pickling for the core's value classes.

Compiled with mypyc, a class does not pickle by itself (a frozen dataclass cannot have its
fields set back, a written-out __init__ is called without arguments).  The value classes
that runners and users may ship between processes (trigger definitions, records,
documents, journal records, outputs) reduce to their class and their fields in order,
which is the order of their __init__ arguments.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def by_fields(value: Any) -> tuple[Any, tuple[Any, ...]]:
    """`__reduce__` of a dataclass whose __init__ takes every field, in field order."""
    return type(value), tuple(getattr(value, field.name) for field in fields(value))
