"""Highwaters by Fetch, and the group's committed offsets.

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
from collections.abc import Iterable, Mapping
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka

from . import record_batches

log = logging.getLogger("onceflow.transport")


def client_auth(conf: Any) -> dict[str, Any]:
    """Security keyword arguments of aiokafka clients, from the app's broker_credentials.

    The app's credentials come from onceflow's security settings (app/security.py), so
    the worker's own clients connect exactly as Faust's consumer and producer do.
    """
    return dict(faust_aiokafka.credentials_to_aiokafka_auth(conf.broker_credentials))


class HighwaterReader:
    """Reads true end offsets from Fetch responses, with one consumer kept between calls.

    The idle timer asks for the input partitions' ends once a tick (agents/faust_app.py,
    group_caught_up): a consumer started for each call would open a connection to the
    broker every tick on every idle worker.  Calls take turns (one consumer, one lock).
    """

    def __init__(self, bootstrap: str, auth: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.auth = dict(auth or {})
        self.consumer: AIOKafkaConsumer | None = None
        self.started = 0  # how many consumers this reader has started (tests read it)
        self._lock = asyncio.Lock()

    async def read(self, ends: Mapping[Any, int | None],
                   timeout: float = 10.0) -> dict[Any, int | None]:
        """The true end offsets of partitions, from Fetch responses.

        `ends` are ListOffsets(latest) answers; a partition answered 0 is empty.
        """
        result: dict[Any, int | None] = dict(ends)
        todo = {tp: end for tp, end in ends.items() if end}
        if not todo:
            return result
        async with self._lock:
            consumer = self.consumer
            if consumer is None:
                consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                            enable_auto_commit=False, fetch_max_wait_ms=50,
                                            **self.auth)
                await consumer.start()
                self.consumer = consumer
                self.started += 1
            try:
                await self._read(consumer, todo, result, timeout)
            except BaseException:
                # Not known to be usable: the next call starts a new one.
                self.consumer = None
                await consumer.stop()
                raise
        return result

    async def _read(self, consumer: AIOKafkaConsumer, todo: dict[Any, int],
                    result: dict[Any, int | None], timeout: float) -> None:
        tps = {tp: TopicPartition(tp.topic, tp.partition) for tp in todo}
        consumer.assign(list(tps.values()))
        for tp, end in todo.items():
            consumer.seek(tps[tp], max(int(end) - 1, 0))
        deadline = asyncio.get_running_loop().time() + timeout
        missing = set(todo)
        asked = {tps[tp]: tp for tp in todo}
        while missing and asyncio.get_running_loop().time() < deadline:
            fetched = await consumer.getmany(*[tps[tp] for tp in missing], timeout_ms=200,
                                             max_records=1)
            # Only a partition that returned a record has been fetched since its seek: the
            # kept consumer still knows the highwaters of earlier calls' fetches.
            for got in fetched:
                tp = asked.get(got)
                highwater = consumer.highwater(got)
                if tp in missing and highwater is not None:
                    result[tp] = max(highwater, int(todo[tp]))
                    missing.discard(tp)
        if missing:
            log.warning("no Fetch highwater for %s; keeping ListOffsets answers", missing)

    async def close(self) -> None:
        """Stop the kept consumer (the worker is stopping)."""
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await consumer.stop()


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

    _reader: HighwaterReader | None = None

    async def _highwaters(self, partitions: Any) -> Mapping[Any, int]:
        ends = await super()._highwaters(partitions)
        if self.consumer.in_transaction:
            return ends
        reader = self._reader
        if reader is None:
            reader = self._reader = HighwaterReader(
                bootstrap_of(self.app.conf.broker_consumer), client_auth(self.app.conf))
        fixed = await reader.read(dict(ends))
        changed = {tp: (ends[tp], fixed[tp]) for tp in ends if ends[tp] != fixed[tp]}
        if changed:
            log.info("highwaters corrected by Fetch (ListOffsets, Fetch): %s", changed)
        return {tp: value for tp, value in fixed.items() if value is not None}

    async def on_thread_stop(self) -> None:
        """Stop the highwater reader's consumer too."""
        await super().on_thread_stop()
        if self._reader is not None:
            await self._reader.close()

    async def group_committed(self, partitions: list[Any]) -> dict[Any, int]:
        """The group's committed offsets of any partitions, assigned here or not.

        A partition with no committed offset is absent.  (One OffsetFetch request.)
        """
        return cast(dict[Any, int], await self.call_thread(self._group_committed, partitions))

    async def _group_committed(self, partitions: list[Any]) -> dict[Any, int]:
        found = await self._ensure_consumer()._coordinator.fetch_committed_offsets(
            set(partitions))
        return {(tp.topic, tp.partition): meta.offset for tp, meta in found.items()}
