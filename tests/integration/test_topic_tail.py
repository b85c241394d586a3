"""Reading a topic's tail (the console's in-doubt and error lists): the newest records only.

The records go out in multi-record batches, after which the embedded broker answers
ListOffsets(latest) short of the end: the tail must still end at the last record.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer, read_tail
from onceflow.app.topics import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000


async def fill(bootstrap: str, topic: str, per_partition: list[int]) -> list[tuple[int, int]]:
    """Records with distinct times, interleaved over the partitions; (time, partition) each."""
    await ensure_topics(bootstrap, [TopicSpec(topic, "output", len(per_partition), -1, ())])
    sent: list[tuple[int, int]] = []
    async with Producer(bootstrap) as producer:
        pending = []
        step = 0
        left = list(per_partition)
        while any(left):
            for partition, count in enumerate(left):
                if count:
                    ms = BASE_MS + step
                    step += 1
                    pending.append(await producer.send(
                        topic, f"{partition}:{ms}".encode(), partition=partition,
                        timestamp_ms=ms))
                    sent.append((ms, partition))
                    left[partition] -= 1
        await asyncio.gather(*pending)
    return sent


def test_the_tail_is_the_newest_records_across_partitions_oldest_first(
        broker: EmbeddedBroker) -> None:
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    # Partition 2's few records are among the oldest: the newest 100 are on partitions 0
    # and 1, interleaved, and the order records are fetched in is not their time order.
    sent = asyncio.run(fill(broker.bootstrap, topic, [150, 150, 40]))
    tail = asyncio.run(read_tail(broker.bootstrap, topic, 100))
    assert [(r.timestamp, r.partition) for r in tail] == sorted(sent)[-100:]
    assert [r.value for r in tail] == [f"{p}:{ms}".encode() for ms, p in sorted(sent)[-100:]]


def test_a_tail_longer_than_the_topic_is_the_whole_topic(broker: EmbeddedBroker) -> None:
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    sent = asyncio.run(fill(broker.bootstrap, topic, [3, 0, 5]))
    tail = asyncio.run(read_tail(broker.bootstrap, topic, 100))
    assert [(r.timestamp, r.partition) for r in tail] == sorted(sent)
    assert asyncio.run(read_tail(broker.bootstrap, topic, 0)) == []


def test_a_missing_topic_has_no_tail(broker: EmbeddedBroker) -> None:
    assert asyncio.run(read_tail(broker.bootstrap, f"none-{uuid.uuid4().hex[:8]}", 10)) == []
