"""The Spark plan of a replay: read, ingress per topic-partition, triggers per group.

Chosen by measurement on local[2] (docs/spark.md has the numbers): grouped-map UDFs
(`groupBy().applyInArrow`) pay a Python call per group and were several times slower
with the many small groups a join trigger makes (one per activation), so each stateful
stage is `repartition(key)` + `sortWithinPartitions(position)` + `mapInArrow`, with the
per-key state held in the stage's dicts for the whole task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onceflow.scenario import HistorySeed
from onceflow.triggers import TriggerSet

from .archive import Archive
from .call_record import Record
from .ingress_stage import IngressStage, Slots
from .local_output import MANIFEST_DDL
from .read_stage import read_records
from .rows import RESULT_DDL, ROUTED_DDL
from .trigger_stage import TriggerStage

STAGE_NAMES = ("read", "ingress", "triggers")


@dataclass(slots=True)
class ReplayPlan:
    """What a replay needs besides the archive."""

    triggers: TriggerSet
    base_dir: str | None = None
    seeds: list[HistorySeed] = field(default_factory=list)
    cutoffs: dict[str, int] = field(default_factory=dict)
    partitions: int | None = None
    # Keep every call's outcome (a first pass that may suspend), or answer from them.
    record_calls: bool = False
    answers: Record | None = None


# Bytes of JSON lines per task of a stateful stage, at most (about 300,000 records): a
# task of the trigger stage keeps the history and open joins of its groups, so tasks of
# a bounded input keep a Python worker's memory from growing with the archive.
TASK_BYTES = 32 << 20


def default_partitions(spark: Any, archive: Archive | None = None) -> int:
    """Tasks per stateful stage: a few per core, and none over TASK_BYTES of input.

    A few per core, so uneven partitions even out; more for a large archive (when its size
    is known), so that no task holds more than TASK_BYTES of it.
    """
    least = max(2, 2 * int(spark.sparkContext.defaultParallelism))
    size = archive.input_bytes() if archive is not None else None
    if not size:
        return least
    return max(least, -(-size // TASK_BYTES))


def make_slots(partitions: int, per_partition: int = 16) -> Slots:
    """Vpart values that Spark's hash partitioning sends to each partition evenly.

    `repartition(n, col)` puts a row in partition pmod(murmur3(col), n); computing that
    hash for small integers gives a table that spreads routing keys over all n partitions,
    and one value per partition to send a row to every task.
    """
    by_partition: dict[int, list[int]] = {p: [] for p in range(partitions)}
    value = 0
    while min(len(values) for values in by_partition.values()) < per_partition:
        by_partition[spark_hash_int(value) % partitions].append(value)
        value += 1
    table = tuple(by_partition[p][i] for i in range(per_partition) for p in range(partitions))
    replicas = tuple(by_partition[p][0] for p in range(partitions))
    return Slots(table, replicas)


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of an int column (Murmur3_x86_32.hashInt).

    HashPartitioning puts a row in partition pmod(this, number of partitions).
    """
    mask = 0xFFFFFFFF
    k1 = (value & mask) * 0xCC9E2D51 & mask
    k1 = ((k1 << 15 | k1 >> 17) & mask) * 0x1B873593 & mask
    h1 = seed ^ k1
    h1 = (h1 << 13 | h1 >> 19) & mask
    h1 = (h1 * 5 + 0xE6546B64) & mask
    h1 ^= 4  # the length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & mask
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def build(spark: Any, archive: Archive, plan: ReplayPlan, results_dir: str | None = None
          ) -> Any:
    """The DataFrame of results (RESULT_SCHEMA): journal, documents, held documents.

    With `results_dir` (a local folder, local master), the trigger stage writes the results
    there and the DataFrame holds the tasks' manifests (MANIFEST_SCHEMA) instead.
    """
    partitions = plan.partitions or default_partitions(spark, archive)
    slots = make_slots(partitions)
    records = read_records(spark, archive)
    routed = (records.repartition(partitions, "topic", "partition")
              .sortWithinPartitions("kind", "block")
              .mapInArrow(IngressStage(plan.triggers, slots, archive.files), ROUTED_DDL))
    return (routed.repartition(partitions, "vpart")
            .sortWithinPartitions("kind", "block")
            .mapInArrow(TriggerStage(plan.triggers, plan.base_dir, plan.seeds, plan.cutoffs,
                                     results_dir, record_calls=plan.record_calls,
                                     answers=plan.answers),
                        MANIFEST_DDL if results_dir is not None else RESULT_DDL))
