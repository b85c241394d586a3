"""Control messages on the repartition topic: ticks, suspension, history seeds, barriers.

They reach each partition in order with its documents, so "suspend", "resume" or "remove
this history entry" takes effect exactly between two documents, and a barrier is
acknowledged only once everything before it on that partition is durable.
"""

from __future__ import annotations

from typing import Any

import orjson
from onceflow import journal as J
from onceflow.journal import JournalRecord
from onceflow.processor import TriggerProcessor
from onceflow.tables.outbox import Outbox

from . import wire
from .context import Shared


class ControlMixin:
    """How a partition answers control messages, and how it tells the other partitions."""

    rt: Shared
    partition: int
    now: float | None
    outbox: Outbox
    journal: list[JournalRecord]
    processors: dict[str, TriggerProcessor]

    # Provided by the partition worker.
    def tick(self, ts: float) -> None: ...  # noqa: D102
    def seed(self, message: dict[str, Any]) -> None: ...  # noqa: D102
    def forget(self, trigger: str, key: str, only: str) -> bool: ...  # noqa: D102
    def sweep_due(self, now: float, force: str | None = None) -> int: ...  # noqa: D102
    def set_suspended(self, processor: TriggerProcessor, reason: str) -> None: ...  # noqa: D102
    async def resume(self, processor: TriggerProcessor, reason: str,  # noqa: D102
                     journal: bool) -> None: ...

    async def handle_control(self, kind: str, message: dict[str, Any]) -> None:
        """Apply one control message to this partition."""
        if kind == wire.TICK:
            self.tick(float(message["ts"]))
            return
        if kind == wire.BARRIER:
            self.outbox.add(self.rt.names.acks, None, str(message["id"]).encode(),
                            orjson.dumps({"id": message["id"], "partition": self.partition}))
            return
        if kind == wire.SEED:
            self.seed(message)
            return
        processor = self.processors.get(str(message.get("trigger")))
        if kind == wire.SWEEP:
            if self.now is not None:
                for name in ([processor.trigger.name] if processor else list(self.processors)):
                    self.sweep_due(self.now, force=name)
            return
        if processor is None:
            return
        if kind == wire.SUSPEND:
            self._suspend(processor, str(message.get("reason") or "suspended"),
                          bool(message.get("journal")))
        elif kind == wire.RESUME:
            await self.resume(processor, str(message.get("reason") or "resumed by command"),
                              bool(message.get("journal")))
        elif kind == wire.FORGET:
            self.forget(processor.trigger.name, str(message["key"]),
                        str(message.get("only", "processing")))

    def _suspend(self, processor: TriggerProcessor, reason: str, journal: bool) -> None:
        if processor.suspended:
            return
        self.set_suspended(processor, reason)
        if journal:
            self.journal.append(JournalRecord(processor.trigger.name, J.SUSPENDED, None, None,
                                              self.now, reason=reason))

    def broadcast_suspend(self, processor: TriggerProcessor) -> None:
        """A run or a decision suspended the trigger here: suspend it on every partition."""
        reason = processor.suspended_reason
        self.set_suspended(processor, reason)
        for partition in range(self.rt.options.partitions):
            if partition != self.partition:
                wire.add_control(self.outbox, self.rt.names, partition, wire.SUSPEND,
                                 trigger=processor.trigger.name, reason=reason, journal=False)
