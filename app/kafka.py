"""Talking to the broker from the commands: creating topics, reading a topic to its end.

"Its end" is the high watermark of Fetch responses, not ListOffsets: the embedded broker
answers ListOffsets(latest) with the base offset of the last record batch plus one (see
docs/operations.md), while the Fetch high watermark is right on every broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from onceflow.agents.wire import Names
from onceflow.errors import ConfigError
from onceflow.triggers import TriggerSet

TOPIC_ALREADY_EXISTS = 36


def worker_topics(triggers: TriggerSet, names: Names,
                  extra: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(topics the worker reads, topics it writes), under their real names."""
    reads = [names.topic(t) for t in dict.fromkeys((*triggers.input_topics, *extra))]
    reads.append(names.route)
    writes = [names.journal, names.acks, names.dead_letter]
    for trigger in triggers.triggers:
        writes += [names.topic(trigger.output), names.topic(trigger.error),
                   names.topic(trigger.in_doubt)]
    return reads, list(dict.fromkeys(t for t in writes if t not in reads))


async def ensure_topics(bootstrap: str, reads: list[str], writes: list[str],
                        partitions: int) -> None:
    """Create missing topics with `partitions` partitions; check the ones read.

    Every topic a worker reads must have exactly `partitions` partitions: Faust gives
    partition p of every such topic, and of every table, to the same worker.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        wanted = list(dict.fromkeys([*reads, *writes]))
        response = await admin.create_topics(
            [NewTopic(name, partitions, 1) for name in wanted])
        for name, code, *_ in response.topic_errors:
            if code not in (0, TOPIC_ALREADY_EXISTS):
                raise ConfigError("broker", f"topic {name!r}",
                                  f"cannot be created (Kafka error code {code})")
        described = await admin.describe_topics(reads)
    finally:
        await admin.close()
    for topic in described:
        count = len(topic.get("partitions") or ())
        if count and count != partitions:
            raise ConfigError(
                "broker", f"topic {topic['topic']!r}",
                f"has {count} partitions; every topic the worker reads needs ONCEFLOW_PARTITIONS "
                f"({partitions}): recreate the topic or set ONCEFLOW_PARTITIONS={count}")


async def read_topic(bootstrap: str, topic: str, *, timeout: float = 30.0) -> list[Any]:
    """Every record of a topic, from the beginning to its current end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=50, max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    try:
        partitions = await _partitions(consumer, topic)
        if not partitions:
            return []
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        waiting = set(tps)
        while waiting and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=100, max_records=10000)
            for items in batch.values():
                records.extend(items)
            for tp in list(waiting):
                highwater = consumer.highwater(tp)
                if highwater is not None and await consumer.position(tp) >= highwater:
                    waiting.discard(tp)
        return records
    finally:
        await consumer.stop()


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

    def __init__(self, bootstrap: str) -> None:
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                          enable_idempotence=False,
                                          max_request_size=8 * 1024 * 1024)

    async def __aenter__(self) -> AIOKafkaProducer:
        await self._producer.start()
        return self._producer

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.stop()


class TopicFollower:
    """Reads a topic from its beginning in the background, as records arrive."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.records: list[Any] = []
        self.arrived = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._tps: list[TopicPartition] = []

    async def start(self) -> TopicFollower:
        """Start reading."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                    fetch_max_wait_ms=20, max_partition_fetch_bytes=8 << 20)
        await consumer.start()
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
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=50, max_records=10000)
            for items in batch.values():
                self.records.extend(items)
            if batch:
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
