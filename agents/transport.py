"""The Faust transport onceflow runs on: aiokafka, with two changes to the consumer.

Bulk delivery.  Records of onceflow's own topics (the input topics and the repartition
topic) go from each fetch straight to a handler, as one list, instead of one event at a
time through Faust's channels and streams; the other topics (table changelogs during
recovery) take Faust's usual path.  Measured on this project's machine, Faust's
per-event path costs about 200 microseconds a record before any work is done, more than
everything onceflow does for a document; and with `stream.take_events` it lost records
that were in flight during a rebalance (never handed to the agent, their offsets left
uncommitted until the next restart).  Bulk delivery keeps Faust's bookkeeping: each record
is tracked as unacknowledged while the handler works on it and acknowledged when the
handler returns, so offsets are committed only for records that are done, and a rebalance
waits for the batch in hand.  The handler takes a fetch in chunks of CHUNK records; when a
rebalance starts, the chunks not begun yet are given back (no longer tracked, and the
partition is sought back to the first of them), so a rebalance waits for one chunk, not
for a whole fetch of up to ONCEFLOW_BATCH_SIZE records.  Records given back were not
decided; they are fetched again from the committed offset, by this worker or the
partition's next owner.

Bulk recovery.  While Faust recovers a table partition from its changelog, the records of
that changelog go, per fetch, straight into the table's local store as one write batch per
partition (Faust's own `apply_changelog_batch`), and the recovery's offsets are moved on;
Faust's path takes each record through a task, a queue and its recovery loop one at a
time.  On a loaded machine (load average 9 to 15 on 2 cores) that path recovered 200 to
600 changelog records a second, so that a restarted worker took 20 s and more to read the
tail of its changelogs, and a worker taking over a dead one's partitions as long.

The consumer also notes when its fetch loop last came round, when it last handed records
to the handler and since when it is handling a chunk: the probes (health.py) read them.

Highwaters by Fetch.
Faust's recovery reads each changelog partition up to its "highwater", which the aiokafka
driver asks of the broker with ListOffsets.  The embedded broker (tansu 0.6) answers
ListOffsets(latest) with the base offset of the partition's last record batch plus one,
not with the end of the log, as soon as a batch holds more than one record.  Recovery
then stops before the last records of a batch (state silently lost after a wiped data
directory) or refuses to start ("persisted offset is higher than highwater").  The high
watermark a Fetch response carries is correct on every broker, so the worker asks for it:
it fetches each partition from (ListOffsets answer - 1), which is inside the log's last
batch, and takes the highwater of the response.  On Apache Kafka both answers agree and the
fetch costs one round trip per recovery.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka

from . import record_batches

log = logging.getLogger("onceflow.transport")


def client_auth(conf: Any) -> dict[str, Any]:
    """Security keyword arguments of aiokafka clients, from the app's broker_credentials.

    The app's credentials come from onceflow's security settings (app/security.py), so
    the worker's own clients connect exactly as Faust's consumer and producer do.
    """
    return dict(faust_aiokafka.credentials_to_aiokafka_auth(conf.broker_credentials))


async def fetch_highwaters(bootstrap: str, ends: Mapping[Any, int | None],
                           timeout: float = 10.0, auth: Mapping[str, Any] | None = None
                           ) -> dict[Any, int | None]:
    """The true end offsets of partitions, from Fetch responses.

    `ends` are ListOffsets(latest) answers; a partition answered 0 is empty.
    """
    result: dict[Any, int | None] = dict(ends)
    todo = {tp: end for tp, end in ends.items() if end}
    if not todo:
        return result
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=50, **(auth or {}))
    await consumer.start()
    try:
        tps = {tp: TopicPartition(tp.topic, tp.partition) for tp in todo}
        consumer.assign(list(tps.values()))
        for tp, end in todo.items():
            consumer.seek(tps[tp], max(int(end) - 1, 0))
        deadline = asyncio.get_running_loop().time() + timeout
        missing = set(todo)
        while missing and asyncio.get_running_loop().time() < deadline:
            await consumer.getmany(*[tps[tp] for tp in missing], timeout_ms=200,
                                   max_records=1)
            for tp in list(missing):
                highwater = consumer.highwater(tps[tp])
                if highwater is not None:
                    result[tp] = max(highwater, int(todo[tp]))
                    missing.discard(tp)
        if missing:
            log.warning("no Fetch highwater for %s; keeping ListOffsets answers", missing)
    finally:
        await consumer.stop()
    return result


def bootstrap_of(urls: Iterable[Any]) -> str:
    """host:port,... of Faust broker URLs."""
    return ",".join(f"{url.host}:{url.port or 9092}" for url in urls)


# How long a Fetch may wait at the broker for records (Faust hard-codes 1.5 s).  The
# embedded broker does not answer a waiting Fetch when records arrive; it always waits the
# whole time, so every hop through a topic would cost up to that long.  Apache Kafka
# answers as soon as records arrive, so a short wait only costs a few more idle requests.
FETCH_MAX_WAIT_MS = 100


class FetchHighwaterThread(faust_aiokafka.AIOKafkaConsumerThread):
    """The aiokafka consumer thread, with highwaters checked against Fetch responses."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        record_batches.install()  # a header name that is not UTF-8 must not stop the fetch
        consumer = super()._create_worker_consumer(transport)
        # aiokafka keeps the setting here until start() hands it to its fetcher.
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer

    async def _highwaters(self, partitions: Any) -> Mapping[Any, int]:
        ends = await super()._highwaters(partitions)
        if self.consumer.in_transaction:
            return ends
        bootstrap = bootstrap_of(self.app.conf.broker_consumer)
        fixed = await fetch_highwaters(bootstrap, dict(ends),
                                       auth=client_auth(self.app.conf))
        changed = {tp: (ends[tp], fixed[tp]) for tp in ends if ends[tp] != fixed[tp]}
        if changed:
            log.info("highwaters corrected by Fetch (ListOffsets, Fetch): %s", changed)
        return {tp: value for tp, value in fixed.items() if value is not None}


BulkHandler = Callable[[list[Any]], Awaitable[None]]

# Most records handed to the handler at once (see the module's docstring).
CHUNK = 1000


class Consumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer: Fetch highwaters, bulk delivery of onceflow's topics.

    The app sets `bulk_delivery` to (topic names, handler) before it starts.
    """

    bulk_delivery: tuple[frozenset[str], BulkHandler] | None = None
    fetched_at: float | None = None  # monotonic time the fetch loop last came round
    delivered_at: float | None = None  # ... last handed records to the handler
    handling_since: float | None = None  # ... began the chunk in hand (None: none)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return FetchHighwaterThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - worker loop
        if self.bulk_delivery is None:
            return await super()._drain_messages(fetcher)
        topics, handle = self.bulk_delivery
        callback = self.callback
        recovery = self.app.tables.recovery
        consumer_stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        read_offsets = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(CONSUMER_FETCHING)
                batch: list[Any] = []
                changelogs: dict[Any, list[Any]] = {}
                await self.sleep(0)
                if not self.should_stop:
                    async for tp, message in self.getmany(timeout=1.0):
                        offset = message.offset
                        read = read_offsets[tp]
                        if read is not None and offset < read:
                            continue  # read already (Faust's own rule)
                        if read and offset - read > 1 and acks_enabled_for(message.topic):
                            await self._add_gap(tp, read + 1, offset)
                        read_offsets[tp] = offset
                        if tp.topic in topics:
                            self.track_message(message)
                            batch.append(message)
                        elif recovery.in_recovery and tp in recovery.active_tps:
                            # Decided per record, when it is in hand: a record that went
                            # Faust's way would be skipped once the offsets moved past it.
                            changelogs.setdefault(tp, []).append(message)
                        else:
                            await self.wait_first(callback(message), self.suspend_flow.wait())
                if changelogs:
                    self._recover(recovery, changelogs)
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

    async def _deliver(self, batch: list[Any], handle: BulkHandler) -> None:
        """Hand records over in chunks; give the rest back when a rebalance starts."""
        app = self.app
        for start in range(0, len(batch), CHUNK):
            if app.rebalancing:
                await self._give_back(batch[start:])
                return
            chunk = batch[start:start + CHUNK]
            self.handling_since = self.delivered_at = time.monotonic()
            try:
                await handle(chunk)
            finally:
                self.handling_since = None
            for message in chunk:
                message.ack(self)

    async def _give_back(self, messages: list[Any]) -> None:
        """Untrack records not handed over, and seek their partitions back to them."""
        first: dict[Any, int] = {}
        for message in messages:
            self._unacked_messages.discard(message)
            if message.tp not in first or message.offset < first[message.tp]:
                first[message.tp] = message.offset
        log.info("rebalance: %d record(s) given back undecided: %s", len(messages),
                 {f"{tp.topic}/{tp.partition}": offset for tp, offset in first.items()})
        for tp, offset in first.items():
            try:
                await self.seek(tp, offset)
            except Exception as exc:  # no longer assigned: its next owner starts there
                log.info("seek of %s back to %d not done: %r", tp, offset, exc)


class _ChangelogEvent:
    """The part of a Faust event that a store's apply_changelog_batch reads."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport with onceflow's consumer."""

    Consumer = Consumer
