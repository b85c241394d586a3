"""The trigger stage's service and resolver calls: kept by the first pass, then answered.

The second pass answers them from the first pass's record, so that no service is called
twice for one document.

A second pass re-runs the trigger stage with the suspension cut-offs the first one found
(`trigger_stage.py`).  Up to its cut-off, a trigger's groups see the same documents in the
same order in both passes, so the second pass makes the same calls (or fewer: documents
after a cut-off are held).  The first pass records each call's outcome under (trigger,
position of the document being run), in call order (retries, the resolver); the second
takes the outcomes from there instead of calling.  A call the record lacks (none should)
is made for real.

What is kept of an outcome is what the core reads from it: a service's value as the JSON
text it is published as, a resolver's answer, or an exception's type name, message and
whether it is a TransientError.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from onceflow.calls import CallContext, Callee
from onceflow.errors import TransientError
from onceflow.running import AwaitRunner
from onceflow.triggers import ON_FAILURE_SUSPEND, TriggerSet

from .rows import json_default

# A record: {(trigger, position): [outcome, ...]}, each outcome a JSON-able list:
# ["value", JSON text or None] (a service), ["answer", value] or ["repr", text] (a
# resolver), ["raise", type name, transient, message].
Record = dict[tuple[str, int], list[list[Any]]]


def may_suspend(triggers: TriggerSet) -> bool:
    """Whether a run may need a second pass (only such a trigger suspends)."""
    return any(t.on_retry_failure == ON_FAILURE_SUSPEND for t in triggers.triggers)


class _Answer:
    """A resolver's answer that is not plain data, as its repr."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _raised(name: str, transient: bool, message: str) -> Exception:
    """An exception the core reads as the recorded one (type name, message, kind)."""
    base: type[Exception] = TransientError if transient else Exception
    kind = type(name, (base,), {"__str__": lambda self: message, "__module__": __name__})
    return kind(message)


class CallBook:
    """A task's services and resolvers: their outcomes recorded, or answered from a record.

    `position` is set by the trigger stage before each document it runs.
    """

    def __init__(self, record: bool, answers: Record | None = None) -> None:
        self.record = record
        self.answers = answers or {}
        self.position = -1
        self.kept: Record = {}
        self._taken: dict[tuple[str, int], int] = {}
        self._loop = AwaitRunner()

    def wrap(self, callees: dict[str, tuple[Callee, Callee | None]]
             ) -> dict[str, tuple[Callee, Callee | None]]:
        """The callees the engine calls instead of the trigger file's."""
        if not self.record and not self.answers:
            return callees
        return {name: (self._wrap(name, service, True),
                       None if resolver is None else self._wrap(name, resolver, False))
                for name, (service, resolver) in callees.items()}

    def _wrap(self, trigger: str, callee: Callee, service: bool) -> Callee:
        def call(document: Any, context: CallContext) -> Any:
            return self._call(trigger, callee, service, document, context)

        return Callee(callee.spec, call, True, False)

    def _call(self, trigger: str, callee: Callee, service: bool, document: Any,
              context: CallContext) -> Any:
        key = (trigger, self.position)
        recorded = self.answers.get(key)
        if recorded is not None:
            index = self._taken.get(key, 0)
            if index < len(recorded):
                self._taken[key] = index + 1
                return self._replay(recorded[index])
        try:
            value = callee.call(document, context)
            if callee.is_async:
                value = self._loop.run(value)
        except Exception as exc:
            if self.record:
                self.kept.setdefault(key, []).append(
                    ["raise", type(exc).__name__, isinstance(exc, TransientError),
                     str(exc)])
            raise
        if self.record:
            self.kept.setdefault(key, []).append(
                self._value(value) if service else self._answer(value))
        return value

    @staticmethod
    def _value(value: Any) -> list[Any]:
        if value is None:
            return ["value", None]
        return ["value", orjson.dumps(value, default=json_default).decode()]

    @staticmethod
    def _answer(answer: Any) -> list[Any]:
        plain = getattr(answer, "value", answer)
        if plain is None or isinstance(plain, str | int | float | bool):
            return ["answer", plain]
        return ["repr", repr(plain)]

    @staticmethod
    def _replay(outcome: list[Any]) -> Any:
        kind = outcome[0]
        if kind == "raise":
            raise _raised(outcome[1], bool(outcome[2]), outcome[3])
        if kind == "value":
            return None if outcome[1] is None else orjson.Fragment(outcome[1])
        if kind == "repr":
            return _Answer(outcome[1])
        return outcome[1]

    def take(self) -> Iterator[tuple[str, int, str]]:
        """The record kept so far, as (trigger, position, JSON text) rows."""
        kept, self.kept = self.kept, {}
        for (trigger, position), outcomes in kept.items():
            yield trigger, position, orjson.dumps(outcomes).decode()

    def close(self) -> None:
        """Release the event loop used for async services."""
        self._loop.close()


def read_record(rows: Iterator[tuple[str, int, str]]) -> Record:
    """A record from (trigger, position, JSON text) rows (CallBook.take)."""
    return {(trigger, position): orjson.loads(text) for trigger, position, text in rows}
