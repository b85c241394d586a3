"""The plan's own arithmetic agrees with Spark's."""

from __future__ import annotations

from typing import Any

import pytest
from onceflow.pipeline.plan import make_slots, spark_hash_int

pytestmark = pytest.mark.spark


def test_spark_hash_int_is_sparks_hash(spark: Any) -> None:
    from pyspark.sql import functions as F

    rows = (spark.range(-3000, 3000).select(F.col("id").cast("int").alias("v"))
            .select("v", F.expr("hash(v)").alias("h")).collect())
    assert [spark_hash_int(row["v"]) for row in rows] == [row["h"] for row in rows]


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 8])
def test_replicas_reach_every_task_and_the_table_spreads_evenly(spark: Any,
                                                                partitions: int) -> None:
    from pyspark.sql import functions as F

    slots = make_slots(partitions)

    def tasks(values: tuple[int, ...]) -> list[int]:
        frame = spark.createDataFrame([(v,) for v in values], "vpart int")
        rows = (frame.repartition(partitions, "vpart")
                .select("vpart", F.spark_partition_id().alias("task")).collect())
        by_value = {row["vpart"]: row["task"] for row in rows}
        return [by_value[v] for v in values]

    assert sorted(tasks(slots.replicas)) == list(range(partitions))
    landed = tasks(slots.table)
    assert all(landed.count(task) == len(slots.table) // partitions
               for task in range(partitions))
