"""The RocksDB store of onceflow's tables: Faust's, without two costs paid on every rebalance.

Faust's store runs a full garbage collection (`gc.collect()`) each time a table's
partitions are revoked, on every rebalance and for every table, and drops the databases
of revoked partitions, to open them again when the partitions come back.  On a loaded
machine these took seconds of the event loop in the rebalance callback (measured: 0.3 s
a collection, 0.1 to 0.5 s an open, with a load average of 9 on 2 cores), long enough
for the group to drop the worker (its session timed out) and start another rebalance.

This store keeps a revoked partition's database open, parked: when the partition comes
back it is taken up again without an open, and Faust's recovery reads its changelog from
the offset stored in it, as it would after an open.  No other process can use the
database meanwhile (RocksDB locks it to this process), and the data directory is this
worker's alone.  The worker freezes its start-up objects out of the collector instead
(worker.py), so the collections that remain are short.
"""

from __future__ import annotations

from typing import Any

from faust.stores import STORES
from faust.stores.rocksdb import Store as RocksStore

SCHEME = "onceflow-rocksdb"


class Store(RocksStore):
    """Faust's RocksDB store; revoked partitions' databases stay open (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parked: dict[int, Any] = {}

    def revoke_partitions(self, table: Any, tps: Any) -> None:
        """Park the databases of revoked partitions (no close, no collection)."""
        for tp in tps:
            if tp.topic in table.changelog_topic.topics:
                db = self._dbs.pop(tp.partition, None)
                if db is not None:
                    self._parked[tp.partition] = db

    async def stop(self) -> None:
        """Let go of every database, parked ones too."""
        self._parked.clear()
        await super().stop()

    def reset_state(self) -> None:
        """Remove the local data (parked databases first)."""
        self._parked.clear()
        super().reset_state()

    def _open_for_partition(self, partition: int) -> Any:
        parked = self._parked.pop(partition, None)
        if parked is not None:
            return parked
        return super()._open_for_partition(partition)


STORES.aliases[SCHEME] = f"{__name__}:Store"
