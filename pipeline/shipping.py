"""Trigger definitions on their way to Spark's Python workers.

Spark pickles a stage's function together with everything it holds.  The core's frozen
dataclasses may be compiled (mypyc), and pickle cannot restore a compiled frozen dataclass
(it sets the attributes one by one, which the frozen class refuses), so a stage carries
them as constructor arguments and builds them again in the worker.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Shipped(Generic[T]):
    """A value whose dataclasses travel as their classes and constructor arguments."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _unship, (_plain(self.value),)


def _unship(state: Any) -> Shipped[Any]:
    return Shipped(_build(state))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ("dataclass", type(value),
                tuple(_plain(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, tuple):
        return ("tuple", tuple(_plain(v) for v in value))
    if isinstance(value, list):
        return ("list", [_plain(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(_plain(k), _plain(v)) for k, v in value.items()])
    return ("value", value)


def _build(state: Any) -> Any:
    kind = state[0]
    if kind == "dataclass":
        return state[1](*(_build(v) for v in state[2]))
    if kind == "tuple":
        return tuple(_build(v) for v in state[1])
    if kind == "list":
        return [_build(v) for v in state[1]]
    if kind == "dict":
        return {_build(k): _build(v) for k, v in state[1]}
    return state[1]
