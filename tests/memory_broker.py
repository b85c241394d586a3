"""Topics in memory: the sender of agent tests and of the in-process cluster (no Kafka).

Tests subclass the broker to refuse or lose what is sent, and keep record times in
seconds as scenarios write them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onceflow.keys import kafka_partition
from onceflow.tables.outbox import Outbox, OutRecord, TopicPartition


@dataclass(slots=True)
class StoredRecord:
    """A record as the memory broker keeps it."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp_ms: Any  # as sent: tests keep a scenario's time in seconds here


class MemoryBroker:
    """Topics in memory: the sender of agent tests and the in-process cluster."""

    def __init__(self, partitions: int = 4) -> None:
        self.default_partitions = partitions
        self.topics: dict[str, list[list[StoredRecord]]] = {}

    def log(self, topic: str, partition: int) -> list[StoredRecord]:
        """One partition's records (creating the topic when new)."""
        logs = self.topics.get(topic)
        if logs is None:
            logs = self.topics[topic] = [[] for _ in range(self.default_partitions)]
        return logs[partition]

    def records(self, topic: str) -> list[StoredRecord]:
        """Every record of a topic, partition by partition."""
        return [r for log in self.topics.get(topic, []) for r in log]

    def append(self, topic: str, partition: int | None, record: OutRecord) -> tuple[int, int]:
        """Store one record; (partition, offset)."""
        if partition is None:
            partition = (kafka_partition(record.key, self.default_partitions)
                         if record.key is not None else 0)
        log = self.log(topic, partition)
        log.append(StoredRecord(len(log), record.key, record.value, list(record.headers),
                                record.timestamp_ms))
        return partition, len(log) - 1

    async def send(self, outbox: Outbox) -> dict[TopicPartition, int]:
        """Store everything at once."""
        last: dict[TopicPartition, int] = {}
        for (topic, partition), records in outbox.records.items():
            for record in records:
                chosen, offset = self.append(topic, partition, record)
                last[(topic, chosen)] = offset
        return last
