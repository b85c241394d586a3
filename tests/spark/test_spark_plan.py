"""The plan's own arithmetic agrees with Spark's."""

from __future__ import annotations

from pathlib import Path
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


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
@pytest.mark.parametrize("last_newline", [True, False])
def test_local_splits_give_every_line_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           ending: bytes, last_newline: bool) -> None:
    from onceflow.pipeline import read_stage

    monkeypatch.setattr(read_stage, "READ_BYTES", 37)  # reads that end inside lines
    monkeypatch.setattr(read_stage, "BLOCK_LINES", 9)

    lines = [b"x" * (i % 7) + str(i).encode() for i in range(300)]
    lines[5] = lines[6] = b""  # blank lines are lines too
    data = ending.join(lines) + (ending if last_newline else b"")
    path = tmp_path / "input.jsonl"
    path.write_bytes(data)
    for size in (1, 2, 3, 5, 64, 1000, len(data)):
        got = [line for start in range(0, len(data), size)
               for block in read_stage._split_lines(str(path), start,
                                                    min(start + size, len(data)))
               for line in block]
        assert got == lines, size


def test_tasks_grow_with_the_archive_so_that_none_holds_more_than_a_bounded_part(
        spark: Any, tmp_path: Path) -> None:
    # A task of the trigger stage keeps the state of its groups: the number of tasks
    # follows the archive's size, so a Python worker's memory does not grow with it.
    from onceflow.pipeline.archive import COMPRESSED_RATIO, list_archive
    from onceflow.pipeline.plan import TASK_BYTES, default_partitions

    least = 2 * spark.sparkContext.defaultParallelism
    (tmp_path / "a.jsonl").write_bytes(b"x" * 100)
    small = list_archive(spark, str(tmp_path))
    assert small.sizes == (100,) and default_partitions(spark, small) == least
    with (tmp_path / "b.jsonl.gz").open("wb") as handle:
        handle.truncate(TASK_BYTES * least)  # sparse: the length is what counts
    big = list_archive(spark, str(tmp_path))
    assert big.input_bytes() == 100 + TASK_BYTES * least * COMPRESSED_RATIO
    assert default_partitions(spark, big) == least * COMPRESSED_RATIO + 1
    assert default_partitions(spark) == least
