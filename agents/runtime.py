"""The partitions a worker owns, built on first use and dropped when they move away."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from onceflow.tables.raw_partition import StorageError

from .context import Shared, StateTable, WorkerOptions
from .partition_worker import PartitionWorker, RecordFault
from .wire import Delivery

__all__ = ["Runtime", "StateTable", "WorkerOptions"]

log = logging.getLogger("onceflow.worker")


class Runtime(Shared):
    """The partitions a worker owns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.workers: dict[int, PartitionWorker] = {}

    @property
    def input_topics(self) -> list[str]:
        """The real names of the topics ingress reads."""
        logical = dict.fromkeys((*self.triggers.input_topics, *self.options.extra_topics))
        return [self.names.topic(t) for t in logical]

    def worker(self, partition: int) -> PartitionWorker:
        """The worker of a partition, built from the durable state on first use."""
        worker = self.workers.get(partition)
        if worker is None:
            worker = self.workers[partition] = PartitionWorker(self, partition)
        return worker

    def forget_partitions(self, partitions: list[int]) -> None:
        """Drop partitions (revoked, or their in-memory state cannot be trusted)."""
        for partition in partitions:
            self.workers.pop(partition, None)

    async def handle(self, deliveries: list[Delivery]) -> bool:
        """Process records of any partitions; every partition's part is durable on return.

        False when the results of some were dropped instead (the worker may no longer own
        their partitions: `ownership`); the records must then not be acknowledged.
        """
        self.dropped.clear()
        await self._handle(deliveries)
        return not self.dropped

    async def _handle(self, deliveries: list[Delivery]) -> None:
        groups: dict[int, list[Delivery]] = {}
        for delivery in deliveries:
            group = groups.get(delivery.partition)
            if group is None:
                group = groups[delivery.partition] = []
            group.append(delivery)
        self.metrics.batches += 1
        if len(groups) == 1:
            ((partition, group),) = groups.items()
            await self._process(partition, group)
            return
        await asyncio.gather(*(self._process(p, g) for p, g in groups.items()))

    async def _process(self, partition: int, group: list[Delivery]) -> None:
        """One partition's records; one that the worker fails on does not stop it.

        When handling a group fails in a way a record can cause (RecordFault), the records
        not yet durable are handled again one at a time, each on the durable state; one
        that fails alone is journaled `bad-input` and kept on the dead-letter topic
        (PartitionWorker.reject), and the partition goes on.  A failure that is not a
        record's (the broker, the local store, corrupt state) stops the worker.
        """
        try:
            await self._built(partition, group[0]).process(group)
            return
        except RecordFault as fault:
            log.warning("onceflow: partition %s: %s; handling its records one at a time",
                        partition, fault)
            rest = group[fault.durable:]
        for delivery in rest:
            try:
                await self._built(partition, delivery).process([delivery])
            except RecordFault as fault:
                # Its journal record counts as the worker's failure, not as bad input.
                where = (self.names.logical(delivery.topic), delivery.partition,
                         delivery.offset)
                self.metrics.rejecting.add(where)
                try:
                    await self._built(partition, delivery).reject(delivery, fault)
                finally:
                    self.metrics.rejecting.discard(where)

    def _built(self, partition: int, delivery: Delivery) -> PartitionWorker:
        """The partition's worker; state it cannot be built from stops the worker, saying so."""
        try:
            return self.worker(partition)
        except StorageError:
            raise  # said once for the worker (agents/faust_app.py)
        except Exception as exc:
            log.critical("onceflow: partition %s stops at record %s/%s@%s: its state cannot "
                         "be read: %r", partition, self.names.logical(delivery.topic),
                         delivery.partition, delivery.offset, exc)
            raise

    def local_partitions(self) -> list[int]:
        """Partitions with state on this worker."""
        return sorted(self.workers)

    def snapshot(self) -> dict[str, Any]:
        """Per-trigger facts of this worker's partitions (for views and metrics)."""
        out: dict[str, Any] = {}
        for trigger in self.triggers.triggers:
            suspended = False
            reason = ""
            open_joins = 0
            entries = 0
            held = 0
            for worker in list(self.workers.values()):
                processor = worker.processors[trigger.name]
                if processor.suspended:
                    suspended, reason = True, processor.suspended_reason
                if processor.joins is not None:
                    open_joins += len(processor.joins)
                if processor.history is not None:
                    entries += len(processor.history)
                held += len(worker.held[trigger.name])
            out[trigger.name] = {"suspended": suspended, "reason": reason,
                                 "open_joins": open_joins, "history_entries": entries,
                                 "held": held}
        return out
