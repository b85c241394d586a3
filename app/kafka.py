"""Talking to the broker from the commands: producing, reading a topic to its end or its tail.

Every client here connects as security.py says (a `Cluster`; a plain "host:port" string
is an open PLAINTEXT broker, as in the tests), and one that cannot connect stops the
command with one line (ConnectionFailed).

"Its end" is the high watermark of Fetch responses, not ListOffsets: the embedded broker
answers ListOffsets(latest) with the base offset of the last record batch plus one (see
docs/operations.md), while the Fetch high watermark is right on every broker.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from onceflow.agents.gaps import GaplessReads

from .security import Cluster, as_cluster, started


async def read_topic(where: Cluster | str, topic: str, *, timeout: float = 30.0
                     ) -> list[Any]:
    """Every record of a topic, from the beginning to its current end."""
    async with _assigned(where, topic, 8 << 20) as (consumer, tps):
        if not tps:
            return []
        await consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        await _read_to_end(consumer, tps, timeout, records.extend)
        return records


async def read_tail(where: Cluster | str, topic: str, last: int, *, timeout: float = 5.0
                    ) -> list[Any]:
    """The newest `last` records of a topic, oldest first; no more are ever kept.

    Newest by record time, then partition and offset.  Each partition is read from `last`
    records before its end to its end (the Fetch high watermark), so the work and the memory
    do not grow with the topic.  Where ListOffsets(latest) answers short of the end (the
    embedded broker), the read only starts a little earlier.
    """
    if last <= 0:
        return []
    async with _assigned(where, topic, 1 << 20) as (consumer, tps):
        if not tps:
            return []
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(starts[tp], ends[tp] - last))
        # A min-heap of the newest records so far: (time, partition, offset, record).
        newest: list[tuple[int, int, int, Any]] = []

        def keep(records: list[Any]) -> None:
            for record in records:
                entry = (record.timestamp, record.partition, record.offset, record)
                if len(newest) < last:
                    heapq.heappush(newest, entry)
                elif entry[:3] > newest[0][:3]:
                    heapq.heapreplace(newest, entry)

        await _read_to_end(consumer, tps, timeout, keep)
        return [entry[3] for entry in sorted(newest, key=lambda entry: entry[:3])]


@asynccontextmanager
async def _assigned(where: Cluster | str, topic: str, fetch_bytes: int
                    ) -> AsyncIterator[tuple[AIOKafkaConsumer, list[TopicPartition]]]:
    """A reading consumer with every partition of `topic` assigned (none: no partitions).

    `fetch_bytes` bounds what one fetch takes from a partition.  The consumer commits
    nothing and is stopped on the way out.
    """
    cluster = as_cluster(where)
    consumer = await started(AIOKafkaConsumer(
        enable_auto_commit=False, fetch_max_wait_ms=50, max_partition_fetch_bytes=fetch_bytes,
        **cluster.client_kwargs()), cluster)
    try:
        tps = [TopicPartition(topic, p) for p in await _partitions(consumer, topic)]
        if tps:
            consumer.assign(tps)
        yield consumer, tps
    finally:
        await consumer.stop()


async def _read_to_end(consumer: AIOKafkaConsumer, tps: list[TopicPartition], timeout: float,
                       take: Callable[[list[Any]], None]) -> None:
    """Hand `take` the records of each partition from its position to its end, in fetches.

    The end is the high watermark of the Fetch responses (see the module's docstring);
    after `timeout` seconds the read stops with what it has.  The topics read so are
    onceflow's own (the journal, outputs) and have no gaps: a fetch that skips offsets is
    read again (GaplessReads).
    """
    deadline = time.monotonic() + timeout
    waiting = set(tps)
    gapless = GaplessReads(consumer)
    while waiting and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=100, max_records=10000)
        for records in gapless.take(batch).values():
            take(records)
        for tp in list(waiting):
            highwater = consumer.highwater(tp)
            if highwater is not None and await consumer.position(tp) >= highwater:
                waiting.discard(tp)


async def _partitions(consumer: AIOKafkaConsumer, topic: str, timeout: float = 1.0
                      ) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        found = consumer.partitions_for_topic(topic)
        if found:
            return sorted(found)
        if time.monotonic() > deadline:
            return []
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.05)


class Producer:
    """A plain producer for the commands (acks=all; no idempotence, which tansu lacks)."""

    def __init__(self, where: Cluster | str) -> None:
        self._cluster = as_cluster(where)
        self._producer = AIOKafkaProducer(acks="all", enable_idempotence=False,
                                          max_request_size=8 * 1024 * 1024,
                                          **self._cluster.client_kwargs())

    async def __aenter__(self) -> AIOKafkaProducer:
        return await started(self._producer, self._cluster)

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.stop()


class TopicFollower:
    """Reads a topic from its beginning in the background, as records arrive.

    For the journal and acks topics, which several workers write at once: a fetch that
    skips offsets is read again from the first one missing (GaplessReads).
    """

    def __init__(self, where: Cluster | str, topic: str) -> None:
        self.cluster = as_cluster(where)
        self.topic = topic
        self.records: list[Any] = []
        self.arrived = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._tps: list[TopicPartition] = []

    async def start(self) -> TopicFollower:
        """Start reading."""
        consumer = await started(AIOKafkaConsumer(
            enable_auto_commit=False, fetch_max_wait_ms=20, max_partition_fetch_bytes=8 << 20,
            **self.cluster.client_kwargs()), self.cluster)
        self._consumer = consumer
        partitions = await _partitions(consumer, self.topic, timeout=30.0)
        if not partitions:
            await consumer.stop()
            raise TimeoutError(f"topic {self.topic} does not exist")
        self._tps = [TopicPartition(self.topic, p) for p in partitions]
        consumer.assign(self._tps)
        await consumer.seek_to_beginning(*self._tps)
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        gapless = GaplessReads(consumer)
        while True:
            taken = gapless.take(await consumer.getmany(timeout_ms=50, max_records=10000))
            for items in taken.values():
                self.records.extend(items)
            if taken:
                self.arrived.set()

    async def wait(self, timeout: float) -> bool:
        """Wait for new records (False when none came within timeout)."""
        self.arrived.clear()
        try:
            await asyncio.wait_for(self.arrived.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def caught_up(self, timeout: float = 30.0) -> None:
        """Wait until every record written so far has been read."""
        assert self._consumer is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            behind = False
            for tp in self._tps:
                highwater = self._consumer.highwater(tp)
                if highwater is None or await self._consumer.position(tp) < highwater:
                    behind = True
            if not behind:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError(f"{self.topic}: not caught up after {timeout} s")

    async def stop(self) -> None:
        """Stop reading."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._consumer is not None:
            await self._consumer.stop()
