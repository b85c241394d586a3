"""An engine built from trigger tables, and a feed that sends records through it: shared by
the engine tests and the per-partition rule tests.
"""

from __future__ import annotations

from typing import Any

from onceflow.calls import Callee
from onceflow.engine import Engine
from onceflow.envelope import Record, record_time
from onceflow.store import MemoryState
from onceflow.triggers import parse_triggers


def engine_for(*tables: dict[str, Any], state: MemoryState | None = None,
               services: dict[str, Any] | None = None) -> Engine:
    triggers = parse_triggers({"trigger": list(tables)})
    callees = None
    if services is not None:
        callees = {name: (Callee("test", fn, True, False), None)
                   for name, fn in services.items()}
    return Engine(triggers, state=state, callees=callees)


class Feed:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.offsets: dict[str, int] = {}
        self.position = 0
        self.outputs: list[Any] = []

    def send(self, topic: str, ts: float, headers: dict[str, str] | None = None,
             offset: int | None = None, **value: Any) -> list[tuple[Any, ...]]:
        """Send a record whose time is `ts` seconds (the core keeps milliseconds)."""
        if offset is None:
            offset = self.offsets.get(topic, -1) + 1
        self.offsets[topic] = max(offset, self.offsets.get(topic, -1))
        record = Record(topic, 0, offset, record_time(ts), value, value.get("uuid"), headers or {})
        out = self.engine.process(record, self.position)
        self.position += 1
        self.outputs.extend(out.outputs or [])
        return [(r.trigger, r.outcome, r.identity) for r in out.journal]
