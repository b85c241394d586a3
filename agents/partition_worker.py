"""Partition p of every topic and table: ingress, the triggers' decisions, time, suspension.

All topics of a deployment have the same number of partitions, so one worker owns
partition p of the input topics, of the repartition topic and of every table.  A
`PartitionWorker` processes that partition's records in order, one group at a time:

1. each input record goes through ingress (delivery count, duplicate-ID cache, envelope);
   a document whose routing key belongs to this partition is decided here, any other is
   sent on to its partition through the repartition topic;
2. documents are decided in sub-batches (see `batch.py`);
3. at the end of a sub-batch: journal records, outputs and routed documents become durable
   first, then the completed history entries and the other state.  A crash between the
   two leaves processing entries without completed ones, which send a redelivered
   document to the resolver or to In Doubt: never to a second run, and never a completed
   entry for an output that was lost.

The input offsets are acknowledged by the caller only after `process` returns.

No record stops a partition: an input record that is not a document, or whose dup-id,
message id or activation is too long to be stored, is bad input at ingress (before any of
its strings is stored); a repartition-topic record that cannot be applied (not a message, or a
control for a trigger this worker does not have) is bad input too.  Each gets a journal
record and a dead-letter copy, and its offset is committed like any other.  What still
stops the worker is the broker refusing what it must write (see docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from onceflow.envelope import (
    H_REDELIVERY,
    Document,
    Record,
    coordinates,
    parse_coordinates,
    record_time,
)
from onceflow.ingress import Ingress
from onceflow.journal import JournalRecord
from onceflow.keys import key_prefix
from onceflow.partition import Partition, routing_key
from onceflow.processor import (
    HELD,
    Run,
    Sink,
    TriggerProcessor,
)
from onceflow.runners import build_processors
from onceflow.tables.outbox import Outbox
from onceflow.tables.raw_partition import StorageError
from onceflow.tables.state import (
    PartitionStore,
    TableBuffer,
    UndoLog,
    flush_state,
)
from onceflow.values import decode_value

from . import clock, limits, wire
from .batch import SubBatch, Take, complete_runs, decide_waiting, run_services, suspends
from .context import Shared
from .controls import ControlMixin
from .fitting import fit_take, refuse_oversized_results
from .held import HeldInControl
from .outputs import deliver_replies
from .rejects import RecordFault, RejectMixin, claims, stops_the_worker

log = logging.getLogger("onceflow.worker")


_TIME = "time"
_APPLIED = "applied"  # ids of the admin controls applied (agents/controls.py)


class PartitionWorker(RejectMixin, ControlMixin):
    """The state and the processing of one partition."""

    def __init__(self, runtime: Shared, partition: int) -> None:
        self.rt = runtime
        self.partition = partition
        names = runtime.tables
        self.buffers = [TableBuffer(names[n].raw(partition), names[n].changelog, partition)
                        for n in ("ingress", "history", "joins", "control")]
        ingress_buffer, history_buffer, joins_buffer, control_buffer = self.buffers
        self.before_runs = [ingress_buffer, history_buffer, control_buffer]
        ids = PartitionStore(ingress_buffer, key_prefix("ids"))
        volatile_ids: dict[str, Any] = {}
        progress = PartitionStore(ingress_buffer, key_prefix("progress"))
        self.ingress = Ingress(runtime.triggers, progress,
                               lambda _topic, persist: ids if persist else volatile_ids)
        self.history = {t.name: PartitionStore(history_buffer, key_prefix(t.name))
                        for t in runtime.triggers.triggers}
        self.joins = {t.name: PartitionStore(joins_buffer, key_prefix(t.name))
                      for t in runtime.triggers.triggers}
        self.control = PartitionStore(control_buffer, "")
        self.applied = PartitionStore(control_buffer, key_prefix(_APPLIED))
        limit = runtime.options.max_record_bytes
        # Read for every record (the options are frozen): kept here, not looked up on the
        # interpreted WorkerOptions each time.
        self._max_document_bytes = runtime.options.max_document_bytes
        self._partitions = runtime.options.partitions
        self.processors = build_processors(
            runtime.triggers, runtime.callees, self.history.__getitem__,
            self.joins.__getitem__,
            join_fits=lambda name: limits.join_state_fits(key_prefix(name), limit))
        stored = self.control.get(_TIME)
        # Stored in seconds (a float) before partition time was in ms.
        now: int | None = record_time(stored) if type(stored) is float else stored
        self._stored_now = now
        self.holding = HeldInControl(self.control, list(self.processors),
                                     runtime.options.max_record_bytes)
        # The rules of partition time and its clock limit, expiry, sweeps, holding (and the
        # suspensions it recorded before a restart), seeds and forgetting are the core's
        # (onceflow.partition), the same as replay's and Spark's; the worker supplies its
        # wall clock.
        self.state = Partition(self.processors, self.holding, clock.clock_limit(
            lambda: runtime.wall_clock(), runtime.options.max_clock_skew))
        reset = self.state.start_at(now)
        if reset is not None:
            # Stored before the limit existed (or this machine's clock went back): such a
            # time would expire every join opened from now on.
            log.warning("onceflow: partition %d: the stored partition time: %s; it starts "
                        "again from the wall clock", partition, reset)
        self.lock = asyncio.Lock()
        self.batch = SubBatch()
        self.outbox = Outbox()
        self.journal: list[JournalRecord] = []
        self.outputs: list[Any] = []
        self.last_record_at = 0.0  # monotonic time of the last record (idle ticks)
        self.handling = 0  # index of the record at hand in the group being processed
        self._raw_key: bytes | None = None  # its key, when the key is not UTF-8
        self._null_headers: list[str] = []  # names of its headers whose value is null
        self.durable = 0  # how many records of that group are durable

    @property
    def now(self) -> int | None:
        """Partition time, in ms."""
        return self.state.now

    @property
    def held(self) -> dict[str, list[str]]:
        """The control-table keys of each suspended trigger's held documents, oldest first."""
        return self.holding.keys

    # -- a group of records -------------------------------------------------------------

    async def process(self, deliveries: list[wire.Delivery]) -> None:
        """Process records of this partition in order; durable when this returns.

        Raises RecordFault when handling them failed in a way a record can cause (the
        caller goes on record by record: see Runtime.handle); anything that stops the
        worker (stops_the_worker) is logged with the coordinates of the record at hand.
        """
        async with self.lock:
            route = self.rt.names.route
            # Documents come in on input topics; the route topic carries them a second
            # time (and clock ticks, commands): those are not counted again.
            self.rt.metrics.documents += sum(1 for d in deliveries if d.topic != route)
            self.last_record_at = self.rt.monotonic()
            self.handling = 0
            self.durable = 0
            try:
                for index, delivery in enumerate(deliveries):
                    self.handling = index
                    if delivery.topic == route:
                        await self._route_message(delivery)
                    else:
                        await self._input_record(delivery)
                await self.settle()
            except BaseException as exc:
                # Whatever was buffered is not known to be consistent: forget it, so the
                # next use of this partition starts again from what is durable.
                self.rt.forget_partitions([self.partition])
                at = self.where(deliveries[self.handling])
                if isinstance(exc, Exception) and not stops_the_worker(exc):
                    raise RecordFault(exc, self.durable, at) from exc
                if isinstance(exc, Exception) and not isinstance(exc, StorageError):
                    # (A storage error is said once for the worker: agents/faust_app.py.)
                    log.critical("onceflow: partition %s stops at record %s (records %s to "
                                 "%s of this batch were not acknowledged): %r", self.partition,
                                 at, self.where(deliveries[self.durable]),
                                 self.where(deliveries[-1]), exc)
                raise

    async def _input_record(self, delivery: wire.Delivery) -> None:
        rt = self.rt
        ts = delivery.ts
        if ts is None:
            raise wire.no_time(delivery, rt.names.logical(delivery.topic))
        ahead = self.state.time_refused(ts)
        if ahead is not None:
            self._ahead_of_clock(delivery, ahead)
            return
        if self.batch.suspending_runs and (self.now is None or ts > self.now):
            await self.settle()
        self._advance(ts)
        record = self._record_of(delivery)
        if record.headers and H_REDELIVERY in record.headers:
            record.redelivers = self._stands_in_for(delivery, record)
        value = delivery.value
        if value is not None and len(value) > self._max_document_bytes:
            self._oversized(record, value, len(value))
            return
        record.value = decode_value(value)
        document, targets, letter = self.ingress.admit_into(
            record, delivery.offset, self.journal, raw_key=self._raw_key,
            null_headers=self._null_headers)
        if document is None:
            if letter is not None:
                self._keep_letter(letter, len(value or b""))
            return
        remote: dict[int, list[str]] | None = None
        partitions = self._partitions
        for trigger in targets:
            routing = routing_key(trigger, document)
            target = wire.route_partition(routing, partitions)
            if target == self.partition:
                await self.take(self.processors[trigger.name], document)
            else:
                if remote is None:
                    remote = {}
                remote.setdefault(target, []).append(trigger.name)
        if remote:
            for target, names in remote.items():
                key = routing_key(self.processors[names[0]].trigger, document).encode()
                message = wire.doc_message(names, document)
                signature = rt.signer.headers(rt.names.route, target, message)
                size = limits.record_size(key, message, signature)
                if size > rt.options.max_record_bytes:
                    for name in names:
                        self._too_large(self.processors[name], document, limits.too_large(
                            f"the document with its routing data to partition {target}",
                            size, rt.options.max_record_bytes))
                    continue
                self.outbox.add(rt.names.route, target, key, message, signature)

    def _stands_in_for(self, delivery: wire.Delivery, record: Record) -> int | None:
        """The offset a live replay's stand-in names in its signed marker, else None.

        Only a marker signed under this deployment's admin key, for this record (topic,
        partition, value), naming an earlier offset of the same topic partition, makes
        the record a redelivery of that offset; any other is an ordinary resend.
        """
        original = self.rt.signer.redelivery_of(delivery.topic, delivery.partition,
                                                delivery.value, record.headers[H_REDELIVERY])
        named = parse_coordinates(original) if original is not None else None
        if named is None or named[0] != record.topic or named[1] != record.partition or \
                named[2] >= record.offset:
            return None
        return named[2]

    async def _route_message(self, delivery: wire.Delivery) -> None:
        forged = self.rt.signer.check(delivery.topic, delivery.partition, delivery.value,
                                      delivery.headers)
        if forged is not None:
            self.bad_route_record(delivery, f"record {self.where(delivery)} of the repartition "
                                  f"topic{claims(delivery.value)} was not applied: {forged}")
            return
        try:
            kind, message, doc = wire.read_message(delivery.value)
        except wire.BadMessage as exc:
            self.bad_route_record(delivery, f"record {self.where(delivery)} of the "
                                  f"repartition topic cannot be applied: {exc.reason}")
            return
        if doc is not None:
            # The repartition topic redelivers too (after a crash before its offsets were
            # committed): the document keeps its count, and each redelivery of its route
            # record raises it, counted from the route topic's offsets as ingress counts.
            doc.delivery_count = self.ingress.delivery.routed(
                self.rt.names.logical(delivery.topic), delivery.partition, delivery.offset,
                doc.delivery_count)
            if self.batch.suspending_runs and (self.now is None or doc.ts > self.now):
                await self.settle()
            self._advance(doc.ts)
            too_long = limits.activation_too_long(doc.activation)
            unknown = []
            for name in message["t"]:
                processor = self.processors.get(name)
                if processor is None:
                    unknown.append(name)
                elif too_long is not None:
                    # Ingress rejects these; a worker of an older version may not have.
                    self._too_large(processor, doc, too_long)
                else:
                    await self.take(processor, doc)
            if unknown:
                self._unknown_triggers(unknown, doc)
            return
        await self.settle()
        await self.handle_control(kind, message, delivery)

    def where(self, delivery: wire.Delivery) -> str:
        """A record's coordinates: "<topic>/<partition>@<offset>" (topic without prefix)."""
        return coordinates(self.rt.names.logical(delivery.topic), delivery.partition,
                           delivery.offset)


    # -- deciding ---------------------------------------------------------------------

    async def take(self, processor: TriggerProcessor, doc: Document) -> None:
        """Decide one document for one trigger (settling first if it must wait for a run)."""
        if processor.suspended:
            self.hold(processor, [doc])
            return
        batch = self.batch
        if batch.conflicts(processor, doc):
            if batch.can_wait(processor):
                batch.add(Take(processor, doc, Sink(), waiting=True))
                return
            await self.settle()
        sink = Sink()
        undo = None
        if suspends(processor):
            undo = UndoLog()
            self._set_undo(processor, undo)
        try:
            result = processor.take(doc, sink)
        finally:
            if undo is not None:
                self._set_undo(processor, None)
        take = Take(processor, doc, sink, result if isinstance(result, Run) else None, undo)
        batch.add(take)
        if result is HELD:
            self._hold_suspended(take, [doc])

    def _hold_suspended(self, take: Take, docs: list[Document]) -> None:
        """Hold documents of the take's suspended trigger, and tell every partition."""
        self.hold(take.processor, docs)
        self.broadcast_suspend(take.processor)

    def _set_undo(self, processor: TriggerProcessor, undo: UndoLog | None) -> None:
        name = processor.trigger.name
        self.history[name].undo = undo
        self.joins[name].undo = undo

    async def settle(self) -> None:
        """Finish the sub-batch: run its services, then make everything durable."""
        batch = self.batch
        rt = self.rt
        if self._lost():
            return
        if batch.runs:
            await self._run_and_complete(batch)
            # Documents that waited for these runs, decided in their places; runs of theirs
            # go through the same steps before the documents behind them are decided.
            while fresh := decide_waiting(batch.takes, self._hold_suspended):
                await self._run_and_complete(SubBatch(takes=fresh))
        limit = rt.options.max_record_bytes
        for take in batch.takes:
            if not take.rolled_back:
                self.journal.extend(take.sink.journal)
                if take.sink.outputs:
                    fit_take(take, limit)
                    self.outputs.extend(take.sink.outputs)
        batch.clear()
        now = self.state.now
        if now is not None:
            self.state.expire_at(now, self.journal)
            if self.rt.options.history_sweeps:
                self.sweep_due(now)
            if now != self._stored_now:
                self.control[_TIME] = self._stored_now = now
        await self._flush()
        self.durable = self.handling  # the records before the one at hand

    async def _run_and_complete(self, batch: SubBatch) -> None:
        """Run the services of a sub-batch's runs and complete them in take order.

        Processing entries (and delivery progress) become durable before any service
        runs.  Join changes wait for the completed entries: after a crash in between, the
        join is still open and a redelivered document can complete it again.
        """
        rt = self.rt
        await flush_state(rt.sender, self.before_runs)
        await run_services(batch.takes, rt.slots, rt.retry_sleep, rt.metrics.observe_service,
                           rt.offload)
        refuse_oversized_results(batch.takes, rt.options.max_record_bytes)
        complete_runs(batch, self._hold_suspended)
        if rt.ownership() is None:  # else _flush drops the results
            await deliver_replies(rt, [t for t in batch.takes if not t.rolled_back])

    def _lost(self) -> bool:
        """Drop what is not durable yet when the partition may have moved to another worker.

        Its next owner decides the documents again from what is durable: a document whose
        processing entry is, and whose completed entry is not, is In Doubt there (its
        service may have run here), and a journal record or output written here as well
        would give the document a second outcome.  The records are not acknowledged.
        """
        reason = "" if self.rt.dropped.get(self.partition) is self else self.rt.ownership()
        if reason is None:
            return False
        if reason:  # one line a partition
            takes = self.batch.takes
            dropped = (len(self.journal) + sum(len(t.sink.journal) for t in takes),
                       len(self.outputs) + sum(len(t.sink.outputs or ()) for t in takes))
            log.warning("onceflow: partition %d may belong to another worker now (%s): %d "
                        "journal record(s) and %d output(s) of its runs are dropped, its "
                        "records given back undecided", self.partition, reason, *dropped)
        self.journal, self.outputs = [], []
        self.outbox.clear()
        self.batch.clear()
        for buffer in self.buffers:
            buffer.writes.clear()
        self.rt.dropped[self.partition] = self
        self.rt.forget_partitions([self.partition])
        return True

    async def _flush(self) -> None:
        rt = self.rt
        if self._lost():
            return
        if self.journal:
            wire.add_journal(self.outbox, rt.names, self.journal, rt.options.max_record_bytes)
            rt.metrics.count_journal(self.journal)
            self.journal = []
        if self.outputs:
            wire.add_outputs(self.outbox, rt.names, self.outputs)
            self.outputs = []
        if self.outbox.count:
            await rt.sender.send(self.outbox)
            self.outbox.clear()
        await flush_state(rt.sender, self.buffers)

    # -- time -------------------------------------------------------------------------

    def _advance(self, ts: int) -> None:
        # What reaches here was checked against the clock where it came in; a routed
        # document from a worker whose clock is ahead moves time only to the limit.
        self.state.advance(ts, self.journal)

    def tick(self, ts: int) -> None:
        """Move partition time to ts (a clock tick or a live replay's time)."""
        self._advance(ts)

    def sweep_due(self, now: int, force: str | None = None) -> int:
        """Sweep the history of triggers whose sweep is due (or `force`: that one now)."""
        if force is None and not self.state.sweep_is_due(now):
            # Asked after every sub-batch; the horizon walks every record not committed
            # yet (a tenth of the worker's CPU when it was computed each time).
            return 0
        return self.state.sweep_due(now, self.rt.sweep_horizon(), force)

    # -- suspension -------------------------------------------------------------------

    def hold(self, processor: TriggerProcessor, docs: list[Document]) -> None:
        """Keep documents of a suspended trigger until it resumes (in the changelog)."""
        refused = self.state.hold(processor, docs)
        if refused:
            sink = Sink(self.journal, self.outputs)
            for doc, why in refused:
                self._too_large(processor, doc, why, sink)

    def set_suspended(self, processor: TriggerProcessor, reason: str) -> None:
        """Record a suspension (so that it survives a restart)."""
        self.state.suspend(processor, reason)

    async def resume(self, processor: TriggerProcessor, reason: str,
                     journal: bool) -> None:
        """Lift a suspension and decide the held documents again, oldest first."""
        record, docs = self.state.resume(processor, reason)
        if record is not None and journal:
            self.journal.append(record)
        for doc in docs:
            await self.take(processor, doc)

    # -- history ----------------------------------------------------------------------

    def seed(self, message: dict[str, Any]) -> None:
        """Load a history entry (scenario history.jsonl, imports)."""
        self.state.seed(message["trigger"], message["identity"], message["status"],
                        record_time(message["ts"]), bool(message.get("failed")),
                        message.get("activation"))

    def forget(self, trigger: str, key: str, only: str) -> bool:
        """Remove an entry so a resubmitted document is decided again (see Partition)."""
        return self.state.forget(trigger, key, only)
