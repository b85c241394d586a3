"""The worker's highwaters by Fetch (agents/highwaters.py), on the embedded broker.

After multi-record batches the embedded broker answers ListOffsets(latest) short of the
end; the reader's Fetch answer must be the true end, and the idle timer asks every tick,
so one consumer serves every call.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from onceflow.agents.highwaters import HighwaterReader
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer
from onceflow.app.topics import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration


async def fill(bootstrap: str, topic: str, counts: list[int]) -> None:
    await ensure_topics(bootstrap, [TopicSpec(topic, "output", len(counts), -1, ())])
    async with Producer(bootstrap) as producer:
        pending = [await producer.send(topic, b"x", partition=p)
                   for p, count in enumerate(counts) for _ in range(count)]
        await asyncio.gather(*pending)


async def list_offsets(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return await consumer.end_offsets(tps)
    finally:
        await consumer.stop()


def test_one_consumer_reads_the_true_ends_call_after_call(broker: EmbeddedBroker) -> None:
    topic = f"hw-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        await fill(broker.bootstrap, topic, [300, 0, 7])
        tps = [TopicPartition(topic, p) for p in range(3)]
        reader = HighwaterReader(broker.bootstrap)
        try:
            for round_ in range(3):
                ends = await list_offsets(broker.bootstrap, tps)
                fixed = await reader.read(dict(ends))
                assert fixed == {tps[0]: 300 + round_, tps[1]: 0, tps[2]: 7}
                await fill(broker.bootstrap, topic, [1, 0, 0])
            assert reader.started == 1
        finally:
            await reader.close()
        assert reader.consumer is None

    asyncio.run(run())
