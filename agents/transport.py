"""The Faust transport onceflow runs on: aiokafka, with two changes to the consumer.

Bulk delivery.  Records of onceflow's own topics (the input topics and the repartition
topic) go from each fetch straight to a handler, as one list, instead of one event at a
time through Faust's channels and streams; the other topics (table changelogs during
recovery) take Faust's usual path.  Measured on this project's machine, Faust's
per-event path costs about 200 microseconds a record before any work is done, more than
everything onceflow does for a document; and with `stream.take_events` it lost records
that were in flight during a rebalance (never handed to the agent, their offsets left
uncommitted until the next restart).  The records are read from aiokafka's fetch
directly: Faust's `getmany` makes a Faust message of every record, checks the flow, the
consumer generation and the partition's end offset for its monitor record by record, and
each message was then tracked and acknowledged one at a time (two locks, a weak set, the
sensors): about a quarter of the worker's CPU on bench/peers.py.  Here those checks are
made once a partition a fetch, each record becomes a `Delivery` at once, and Faust's
bookkeeping is kept in bulk: while a fetched batch is in hand one marker stands for it
among Faust's unacknowledged messages (so a rebalance waits for it, as it waited for the
messages), and the offsets of each chunk are acknowledged together once the handler has
returned, by the same rule as Faust's `Consumer.ack` (so offsets are committed only for
records that are done).  The handler takes a fetch in chunks of ONCEFLOW_CHUNK_SIZE
records (1000 by default); when a rebalance starts, the chunks not begun yet are given
back (the partition is sought back to the first of them), so a rebalance waits for one
chunk, not for a whole fetch of up to ONCEFLOW_BATCH_SIZE records.  Records given back
were not decided; they are fetched again from the committed offset, by this worker or the
partition's next owner.  Every record a fetch returns has moved its partition's position
past it, so whenever fetched records of onceflow's topics are dropped undecided (the flow
stopped for a rebalance, a new generation in the middle of a fetch, a partition no longer
active) the partition is sought back to the first of them: aiokafka's seek to the
committed offsets leaves a partition without a committed offset above 0 where it is, and
its records would be read by nobody.

Bulk recovery.  While Faust recovers a table partition from its changelog, the records of
that changelog go, per fetch, straight into the table's local store as one write batch per
partition (Faust's own `apply_changelog_batch`), and the recovery's offsets are moved on;
Faust's path takes each record through a task, a queue and its recovery loop one at a
time.  On a loaded machine (load average 9 to 15 on 2 cores) that path recovered 200 to
600 changelog records a second, so that a restarted worker took 20 s and more to read the
tail of its changelogs, and a worker taking over a dead one's partitions as long.

The consumer also notes when its fetch loop last came round, when it last handed records
to the handler and since when it is handling a chunk: the probes (health.py) read them.

Highwaters by Fetch: see highwaters.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

from . import wire
from .gaps import GAP_REFETCHES, TAIL_GAP_REFETCHES, GaplessReads, up_to_gap
from .highwaters import FetchHighwaterThread

log = logging.getLogger("onceflow.transport")


# Takes a chunk of records; False: they were not decided (given back, not acknowledged).
BulkHandler = Callable[[list[wire.Delivery]], Awaitable[bool]]


class Consumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer: Fetch highwaters, bulk delivery of onceflow's topics.

    The app sets `bulk_delivery` to (topic names, handler) before it starts.
    """

    bulk_delivery: tuple[frozenset[str], BulkHandler] | None = None
    route_topics: frozenset[str] = frozenset()  # set by the app: onceflow's own, gapless
    fetched_at: float | None = None  # monotonic time the fetch loop last came round
    delivered_at: float | None = None  # ... last handed records to the handler
    handling_since: float | None = None  # ... began the chunk in hand (None: none)
    revoking_since: float | None = None  # ... a revocation began (None: none under way)
    _sought_committed: Mapping[Any, int] = {}  # the committed offsets of the last seek to them

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gapless = GaplessReads()  # where each partition of onceflow's topics goes on

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return FetchHighwaterThread(self, loop=self.loop, beacon=self.beacon)

    # Every way the position of a partition moves, other than reading on, is told to
    # `_gapless`: a gap is then judged from where reading really goes on.
    async def seek(self, partition: Any, offset: int) -> None:
        """Seek a partition (Faust's), and read on from there."""
        await super().seek(partition, offset)
        self._gapless.moved(partition, offset)

    async def seek_wait(self, partitions: Mapping[Any, int]) -> None:
        """Seek partitions and wait (Faust's, for changelogs); forget where they were."""
        for tp in partitions:
            self._gapless.moved(tp, None)
        await super().seek_wait(partitions)

    async def seek_to_committed(self) -> Mapping[Any, int]:
        """Seek the partitions to their committed offsets (Faust's), and read on from there."""
        offsets = await super().seek_to_committed()
        self._sought_committed = offsets
        self._gapless = GaplessReads()  # every partition moved: nothing known before holds
        for tp, offset in offsets.items():
            self._gapless.moved(tp, offset if offset is not None and offset >= 0 else None)
        return offsets

    async def on_partitions_revoked(self, revoked: set[Any]) -> None:
        """Faust's, and forget where the partitions were."""
        for tp in revoked:
            self._gapless.moved(tp, None)
        self.revoking_since = time.monotonic()
        try:
            await super().on_partitions_revoked(revoked)
        finally:
            self.revoking_since = None

    async def on_partitions_assigned(self, assigned: set[Any], generation_id: int = 0) -> None:
        """Faust's; a partition assigned is read from where the broker's group says."""
        for tp in assigned:
            self._gapless.moved(tp, None)
        await super().on_partitions_assigned(assigned, generation_id)

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - worker loop
        if self.bulk_delivery is None:
            return await super()._drain_messages(fetcher)
        topics, handle = self.bulk_delivery
        consumer_stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(CONSUMER_FETCHING)
                batch: list[wire.Delivery] = []
                changelogs: dict[Any, list[Any]] = {}
                await self.sleep(0)
                if not self.should_stop:
                    await self._take_fetch(topics, batch, changelogs)
                if changelogs:
                    self._recover(self.app.tables.recovery, changelogs)
                self.diag.unset_flag(CONSUMER_FETCHING)
                self.fetched_at = time.monotonic()
                if batch:
                    await self._deliver(batch, handle)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)

    async def _take_fetch(self, topics: frozenset[str], batch: list[wire.Delivery],
                          changelogs: dict[Any, list[Any]]) -> None:
        """One fetch: onceflow's records into `batch`, changelogs under recovery aside.

        Faust's `getmany` does the same checks and makes a Faust message of every record;
        here the partitions' checks (active, the end offset for its monitor) are made once a
        partition, and onceflow's records become deliveries directly, in the same order.
        """
        records, active = await self._wait_next_records(1.0)
        if records is None or self.should_stop:
            return
        if not self.flow_active:
            # As Faust's getmany: back to the committed offsets until the flow resumes.
            # aiokafka seeks only a partition whose committed offset is above 0, so the
            # others are sought back to the first record of this fetch, dropped here.
            self._sought_committed = {}
            try:
                await self.perform_seek()
            except Exception as exc:
                self.log.warning(f"exception performing seek when flow not active {exc}")
            committed = self._sought_committed
            await self._seek_back({
                tp: offset for tp, offset in _first_offsets(records).items()
                if tp.topic in topics and not (committed.get(tp) or 0) > 0}, "flow stopped")
            return
        app = self.app
        generation = app.consumer_generation_id
        # What Faust's getmany asks of every record, asked once a partition.
        usable = {}
        inactive = {}  # fetched for a partition no longer active: dropped, read again
        gaps = {topic: app.topics.acks_enabled_for(topic) for topic in {tp.topic for tp in records}}
        for tp, fetched in records.items():
            if active is None or tp in active or tp in self._buffered_partitions:
                app.monitor.track_tp_end_offset(tp, self.highwater(tp))
                if tp.topic in topics:
                    fetched = await self._up_to_gap(tp, fetched, gaps[tp.topic])
                    if not fetched:
                        continue
                usable[tp] = fetched
            elif fetched and tp.topic in topics:
                inactive[tp] = fetched
        if inactive:
            await self._seek_back(_first_offsets(inactive), "partition not active")
        read_offsets = self._read_offset
        read_before = {tp: read_offsets[tp] for tp in usable}
        taken: dict[Any, int] = {}  # the last record taken of each partition
        recovery = app.tables.recovery
        callback = self.callback
        # In Faust's order: round robin over the topics (a control message on onceflow.route
        # is not left behind a whole fetch of an input topic).
        for tp, record in self.scheduler.iterate(usable):
            if app.consumer_generation_id != generation or not self.flow_active:
                # A rebalance: the rest is read again, by this worker or the partitions'
                # next owners; the position of a partition kept must not stay past it.
                await self._seek_back(_not_taken(usable, read_before, taken, topics),
                                      "rebalance during a fetch")
                break
            offset = record.offset
            read = read_offsets[tp]
            if read is not None and offset < read:
                continue  # read already (Faust's own rule)
            read_offsets[tp] = taken[tp] = offset
            if tp.topic in topics:  # gaps in its offsets: _up_to_gap
                # A record without a timestamp (message format v0) has Kafka's -1 ms.
                stamp = record.timestamp
                batch.append(wire.Delivery(
                    record.topic, record.partition, offset,
                    stamp if stamp is not None else -1, record.key,
                    record.value, list(record.headers or ()), tp))
            elif recovery.in_recovery and tp in recovery.active_tps:
                # Decided per record, when it is in hand: a record that went Faust's way
                # would be skipped once the offsets moved past it.
                changelogs.setdefault(tp, []).append(self._to_message(tp, record))
            else:
                if read and offset - read > 1 and gaps[tp.topic]:
                    await self._add_gap(tp, read + 1, offset)  # Faust's rule
                message = self._to_message(tp, record)
                self.track_message(message)
                await self.wait_first(callback(message), self.suspend_flow.wait())

    async def _up_to_gap(self, tp: Any, fetched: list[Any], acked: bool) -> list[Any]:
        """The records of a fetch of one of onceflow's topics to take now.

        A gap in the offsets of onceflow.route is read again (up to GAP_REFETCHES fetches)
        before it is taken as real: several workers write each of its partitions, and the
        embedded broker can show a later batch before an earlier one (gaps.py).  An input
        topic may have real gaps (compaction, transaction markers), so a gap there is read
        again only at the partition's end, where that fault shows, and TAIL_GAP_REFETCHES
        times at most.  A gap taken as real is committed past, as Faust does (`acked`).
        """
        if not fetched:
            return fetched
        reads = self._gapless
        expected = reads.expected
        want = expected.get(tp)
        first = fetched[0].offset
        last = fetched[-1].offset
        if (want is None or first == want) and last - first == len(fetched) - 1:
            expected[tp] = last + 1  # the usual fetch: nothing skipped
            return fetched
        if tp.topic in self.route_topics:
            refetches = GAP_REFETCHES
        else:
            highwater = self.highwater(tp)
            at_end = highwater is not None and last + 1 >= highwater
            refetches = TAIL_GAP_REFETCHES if at_end else 0
        runtime = self.app.runtime
        counts = runtime.metrics.fetch_gaps
        topic = runtime.names.logical(tp.topic)
        start = 0
        while True:
            kept, gap = up_to_gap(fetched[start:], want)
            if gap is None:
                break
            at = start + len(kept)  # the first record after the gap
            after = fetched[at].offset
            if reads.read_again(tp, gap, refetches):
                counts[(topic, "read-again")] += 1
                log.debug("%s/%d: offsets %d..%d skipped by a fetch: read again",
                          tp.topic, tp.partition, gap, after - 1)
                # Not self.seek: the tries go on counting, and Faust's read offset stays
                # at the last record taken (the records before the gap are delivered).
                await self._seek(tp, gap)
                expected[tp] = gap
                return fetched[:at]
            if refetches:
                log.info("%s/%d: offsets %d..%d are missing after %d fetches: taken as a gap",
                         tp.topic, tp.partition, gap, after - 1, refetches)
            counts[(topic, "taken")] += 1
            if acked:
                await self._add_gap(tp, gap, after - 1)
            want = after
            start = at
        expected[tp] = last + 1
        return fetched

    def _recover(self, recovery: Any, changelogs: dict[Any, list[Any]]) -> None:
        """Apply fetched changelog records of partitions under recovery, in bulk."""
        offsets = recovery.active_offsets
        recovery.flush_buffers()  # anything Faust's path holds is older: it goes first
        for tp, messages in changelogs.items():
            seen = offsets.get(tp)
            events = [_ChangelogEvent(m) for m in messages if seen is None or m.offset > seen]
            if not events:
                continue
            recovery.tp_to_table[tp].apply_changelog_batch(events)
            offsets[tp] = events[-1].message.offset
        if recovery.in_recovery and not recovery.need_recovery():
            # What Faust's recovery loop does when the last record is in.
            recovery.flush_buffers()
            recovery._set_recovery_ended()
            recovery.signal_recovery_end.set()

    async def _deliver(self, batch: list[wire.Delivery], handle: BulkHandler) -> None:
        """Hand records over in chunks; give the rest back when a rebalance starts.

        While the batch is in hand one marker stands for it among Faust's unacknowledged
        messages, so a rebalance waits for the chunk being handled (Faust's wait_empty);
        each chunk's offsets are acknowledged together once the handler has returned.
        """
        app = self.app
        size = app.runtime.options.chunk_size  # ONCEFLOW_CHUNK_SIZE
        in_hand = _InHand()
        self._unacked_messages.add(in_hand)
        try:
            for start in range(0, len(batch), size):
                if app.rebalancing:
                    await self._give_back(batch[start:])
                    return
                chunk = batch[start:start + size]
                self.handling_since = self.delivered_at = time.monotonic()
                try:
                    decided = await handle(chunk)
                finally:
                    self.handling_since = None
                if decided is False:
                    await self._give_back(batch[start:])
                    return
                self._acknowledge(chunk)
        finally:
            in_hand.acked = True
            self._unacked_messages.discard(in_hand)
            notify(self._waiting_for_ack)

    def _acknowledge(self, deliveries: list[wire.Delivery]) -> None:
        """Mark the records' offsets safe to commit, as Faust's Consumer.ack does each."""
        offsets: dict[Any, list[int]] = {}
        for delivery in deliveries:
            tp = delivery.handle
            group = offsets.get(tp)
            if group is None:
                group = offsets[tp] = []
            group.append(delivery.offset)
        acks_enabled_for = self.app.topics.acks_enabled_for
        added = 0
        with ack_lock:
            for tp, group in offsets.items():
                if not acks_enabled_for(tp.topic):
                    continue
                committed = self._committed_offset[tp]
                index = self._acked_index[tp]
                acked = self._acked[tp]
                for offset in group:
                    if (committed is None or offset >= committed) and offset not in index:
                        index.add(offset)
                        acked.append(offset)
                        added += 1
            self._n_acked += added
            notify(self._waiting_for_ack)

    async def _give_back(self, deliveries: list[wire.Delivery]) -> None:
        """Seek the partitions of records not handed over back to the first of them."""
        first: dict[Any, int] = {}
        for delivery in deliveries:
            tp = delivery.handle
            if tp not in first or delivery.offset < first[tp]:
                first[tp] = delivery.offset
        log.info("rebalance: %d record(s) given back undecided: %s", len(deliveries),
                 {f"{tp.topic}/{tp.partition}": offset for tp, offset in first.items()})
        await self._seek_back(first, "")

    async def _seek_back(self, first: Mapping[Any, int], why: str) -> None:
        """Seek partitions back to the first record fetched and dropped (not decided).

        Every record a fetch returned moved the partition's position past it: one dropped
        without a seek back is read by nobody, this worker or the partition's next owner,
        when the partition has no committed offset above it.
        """
        if not first:
            return
        if why:
            log.info("%s: fetched records dropped, read again from %s", why,
                     {f"{tp.topic}/{tp.partition}": offset for tp, offset in first.items()})
        for tp, offset in first.items():
            try:
                await self.seek(tp, offset)
            except Exception as exc:  # no longer assigned: its next owner starts there
                log.info("seek of %s back to %d not done: %r", tp, offset, exc)


def _first_offsets(records: Mapping[Any, list[Any]]) -> dict[Any, int]:
    """The offset of the first record of each partition of a fetch."""
    return {tp: fetched[0].offset for tp, fetched in records.items() if fetched}


def _not_taken(usable: Mapping[Any, list[Any]], read_before: Mapping[Any, int | None],
               taken: Mapping[Any, int], topics: frozenset[str]) -> dict[Any, int]:
    """The first record of each partition of `topics` that a fetch loop left untaken.

    `taken` holds the last record taken of a partition; when none was, a record below the
    read offset from before the loop was read already (Faust's rule), not dropped.
    """
    first: dict[Any, int] = {}
    for tp, fetched in usable.items():
        if tp.topic not in topics:
            continue  # Faust's own (changelogs): Faust's rules
        last = taken.get(tp)
        before = read_before.get(tp)
        for record in fetched:
            offset = record.offset
            if (offset > last) if last is not None else (before is None or offset >= before):
                first[tp] = offset
                break
    return first


class _InHand:
    """Stands for a fetched batch among Faust's unacknowledged messages while it is handled."""

    __slots__ = ("acked", "refcount", "__weakref__")

    def __init__(self) -> None:
        self.acked = False
        self.refcount = 1

    def __repr__(self) -> str:
        return "<onceflow batch in hand>"


class _ChangelogEvent:
    """The part of a Faust event that a store's apply_changelog_batch reads."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport with onceflow's consumer."""

    Consumer = Consumer
