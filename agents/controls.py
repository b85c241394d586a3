"""Control messages on the repartition topic: ticks, suspension, history seeds, barriers.

They reach each partition in order with its documents, so "suspend", "resume" or "remove
this history entry" takes effect exactly between two documents, and a barrier is
acknowledged only once everything before it on that partition is durable.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import orjson
from mypy_extensions import trait
from onceflow.envelope import record_time
from onceflow.journal import JournalRecord
from onceflow.partition import Partition
from onceflow.processor import TriggerProcessor
from onceflow.tables.outbox import Outbox
from onceflow.tables.state import PartitionStore

from . import limits, wire
from .context import Shared

MAX_APPLIED = 1000  # ids of admin controls a partition remembers (each for CONTROL_MAX_AGE)
_REDELIVERED = ""  # _replayed: the record that brought a control, delivered again


@trait
class ControlMixin:
    """How a partition answers control messages, and how it tells the other partitions.

    A mypyc trait, as RejectMixin is (agents/rejects.py).
    """

    rt: Shared
    partition: int
    outbox: Outbox
    journal: list[JournalRecord]
    processors: dict[str, TriggerProcessor]
    state: Partition
    applied: PartitionStore  # admin controls applied here: {id: [made at, offset]}

    # Provided by the partition worker.
    @abstractmethod
    def tick(self, ts: int) -> None: ...  # noqa: D102
    @abstractmethod
    def seed(self, message: dict[str, Any]) -> None: ...  # noqa: D102
    @abstractmethod
    def forget(self, trigger: str, key: str, only: str) -> bool: ...  # noqa: D102
    @abstractmethod
    def sweep_due(self, now: int, force: str | None = None) -> int: ...  # noqa: D102
    @abstractmethod
    def set_suspended(self, processor: TriggerProcessor, reason: str) -> None: ...  # noqa: D102
    @abstractmethod
    async def resume(self, processor: TriggerProcessor, reason: str,  # noqa: D102
                     journal: bool) -> None: ...

    @abstractmethod
    def where(self, delivery: wire.Delivery) -> str: ...  # noqa: D102
    @abstractmethod
    def bad_route_record(self, delivery: wire.Delivery, reason: str, *,  # noqa: D102
                         trigger: str | None = None) -> None: ...

    async def handle_control(self, kind: str, message: dict[str, Any],
                             delivery: wire.Delivery) -> None:
        """Apply one control message (checked by wire.read_message) to this partition.

        A message naming a trigger this worker does not have is not applied: it is
        journaled `bad-input` for that trigger and kept on the dead-letter topic.
        """
        if kind == wire.TICK:
            # Ticks carry seconds on the wire; partition time is in milliseconds.
            try:
                ts = record_time(message["ts"])
            except ValueError as exc:
                self.bad_route_record(delivery, (
                    f"the tick message {self.where(delivery)} was not applied to partition "
                    f"{self.partition}: {exc}"))
                return
            ahead = self.state.time_refused(ts, tick=True)
            if ahead is not None:
                self.bad_route_record(delivery, (
                    f"the tick message {self.where(delivery)} was not applied to partition "
                    f"{self.partition}: {ahead}"))
                return
            self.tick(ts)
            return
        if kind == wire.BARRIER:
            self.outbox.add(self.rt.names.acks, None, str(message["id"]).encode(),
                            orjson.dumps({"id": message["id"], "partition": self.partition}))
            return
        if kind in wire.ADMIN_KINDS:
            replayed = self._replayed(message, delivery.offset)
            if replayed == _REDELIVERED:
                return  # applied already (a redelivery after a crash)
            if replayed is not None:
                self.bad_route_record(delivery, (
                    f"the {kind} message {self.where(delivery)} was not applied to partition "
                    f"{self.partition}: {replayed}"))
                return
        name = message.get("trigger")
        processor = self.processors.get(name) if name is not None else None
        if name is not None and processor is None:
            self.bad_route_record(delivery, (
                f"trigger {name!r} is not defined on this worker: the {kind} message "
                f"{self.where(delivery)} was not applied to partition {self.partition} (a "
                f"worker with another trigger file sent it; see changing the trigger file "
                f"in docs/operations.md)"),
                trigger=limits.clip(name))
            return
        if kind == wire.SEED:
            self.seed(message)
            return
        if kind == wire.SWEEP:
            now = self.state.now
            if now is not None:
                for swept in ([processor.trigger.name] if processor else list(self.processors)):
                    self.sweep_due(now, force=swept)
            return
        assert processor is not None  # suspend, resume and forget name their trigger
        if kind == wire.SUSPEND:
            self._suspend(processor, str(message.get("reason") or "suspended"),
                          bool(message.get("journal")))
        elif kind == wire.RESUME:
            await self.resume(processor, str(message.get("reason") or "resumed by command"),
                              bool(message.get("journal")))
        elif kind == wire.FORGET:
            self.forget(processor.trigger.name, str(message["key"]),
                        str(message.get("only") or "processing"))

    def _replayed(self, message: dict[str, Any], offset: int) -> str | None:
        """Why an admin's control must not be applied (a copy, or too old); else remember it.

        The ids of the controls applied on this partition are kept in its control table
        (so they survive a restart), with the offset they came at, for CONTROL_MAX_AGE, at
        most MAX_APPLIED of them.  The same record delivered again (after a crash, before
        its offset was committed) is _REDELIVERED: applied already, not a copy.
        """
        control_id, at = message.get("id"), message.get("at")
        if control_id is None or at is None:
            return ("it has no id and time (fields 'id' and 'at'), which onceflow writes in "
                    "every control: it cannot be told from a copy produced again")
        if len(control_id) > 100:
            return "its id is longer than 100 characters"
        applied = self.applied
        seen = applied.get(control_id)
        if seen is not None and seen[1] == offset:
            return _REDELIVERED
        now = self.rt.wall_clock()
        age = now - float(at)
        if age > wire.CONTROL_MAX_AGE:
            return (f"it was made {age:.0f} s ago, more than {wire.CONTROL_MAX_AGE:g} s: a "
                    f"copy of an old control produced again (if an operator sent it and it "
                    f"waited that long, send it again)")
        if seen is not None:
            return (f"control {control_id!r} was applied here before (at offset {seen[1]}): "
                    f"a copy produced again is not applied twice")
        kept = sorted(applied.items(), key=lambda item: item[1][0])
        for key, (made, _) in kept:
            if now - made > wire.CONTROL_MAX_AGE:
                del applied[key]
        kept = [(key, entry) for key, entry in kept if now - entry[0] <= wire.CONTROL_MAX_AGE]
        for key, _ in kept[:max(0, len(kept) - MAX_APPLIED + 1)]:
            del applied[key]
        applied[control_id] = [float(at), offset]
        return None

    def _suspend(self, processor: TriggerProcessor, reason: str, journal: bool) -> None:
        record = self.state.suspend_by_command(processor, reason)
        if record is not None and journal:
            self.journal.append(record)

    def broadcast_suspend(self, processor: TriggerProcessor) -> None:
        """A run or a decision suspended the trigger here: suspend it on every partition."""
        reason = processor.suspended_reason
        self.set_suspended(processor, reason)
        for partition in range(self.rt.options.partitions):
            if partition != self.partition:
                wire.add_control(self.outbox, self.rt.names, partition, wire.SUSPEND,
                                 signer=self.rt.signer, trigger=processor.trigger.name,
                                 reason=reason, journal=False)
