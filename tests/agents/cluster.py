"""Every partition of a worker in one process, over a memory broker: no Kafka, no Faust.

The records a worker would consume (input topics and the repartition topic) are handed to
the runtime partition by partition, in offset order, until nothing is left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from memory_broker import MemoryBroker
from onceflow.agents.context import TABLES, StateTable, WorkerOptions
from onceflow.agents.runtime import Runtime
from onceflow.agents.wire import Delivery
from onceflow.runners import load_callees
from onceflow.tables.outbox import OutRecord
from onceflow.tables.raw_partition import DictPartition
from onceflow.triggers import TriggerSet


async def _no_wait(seconds: float) -> None:
    """The harness's wait between service attempts: none (retries happen on simulated time)."""


class LocalCluster:
    def __init__(self, triggers: TriggerSet, *, partitions: int = 4,
                 base_dir: Path | None = None, callees: Any = None, **options: Any) -> None:
        self.broker = MemoryBroker(partitions)
        self.partitions = partitions
        self.state: dict[str, dict[int, DictPartition]] = {name: {} for name in TABLES}
        tables = {
            name: StateTable(name, f"onceflow-{name}-changelog",
                             lambda p, n=name: self.state[n].setdefault(p, DictPartition()))
            for name in TABLES
        }
        # Simulated time, as replay's: a retry does not wait out its retry_interval.
        self.runtime = Runtime(triggers, callees or load_callees(triggers, base_dir),
                               WorkerOptions(partitions=partitions, **options), tables,
                               self.broker, sleep=_no_wait)
        self.names = self.runtime.names
        self.read: dict[tuple[str, int], int] = {}

    def send(self, topic: str, partition: int, value: bytes | None, *, ts: int,
             key: bytes | None = None, headers: dict[str, str] | None = None) -> int:
        # Record time in ms, as Kafka stamps records (and as the core keeps them).
        record = OutRecord(key, value, [(k, v.encode()) for k, v in (headers or {}).items()],
                           ts)
        _, offset = self.broker.append(self.names.topic(topic), partition, record)
        return offset

    def consumed_topics(self) -> list[str]:
        return [*self.runtime.input_topics, self.names.route]

    async def pump(self) -> None:
        """Deliver every pending record, partition by partition, until none is left."""
        while True:
            moved = False
            for topic in self.consumed_topics():
                for partition in range(self.partitions):
                    log = self.broker.log(topic, partition)
                    start = self.read.get((topic, partition), 0)
                    if start >= len(log):
                        continue
                    batch = log[start:]
                    self.read[(topic, partition)] = len(log)
                    await self.runtime.handle([
                        Delivery(topic, partition, r.offset, r.timestamp_ms, r.key, r.value,
                                 r.headers) for r in batch])
                    moved = True
            if not moved:
                return

    def journal(self) -> list[dict[str, Any]]:
        return [orjson.loads(r.value) for r in self.broker.records(self.names.journal)]
