"""`onceflow spark audit`: check the guarantees of spec section 6 on an archive's journal.

The audit is an independent reading of the archive: it takes the records' coordinates,
document types and identities from the spec's definitions (not from the ingress code it
audits) and matches journal records to input records by (topic, partition, offset, ts),
which every runner writes, so it can audit a journal from `onceflow replay`, from the
worker's journal topic or from `onceflow spark replay` alike.

Checks:

1. every input record has exactly one terminal outcome for each trigger that takes it
   (or one at ingress), except documents still waiting in a join whose deadline had not
   passed at the end of the input, and documents a trigger held after it suspended;
2. no service ran twice for one (trigger, identity) within the trigger's history TTL
   (for join triggers, per (activation, identity)).  Only triggers that promise it
   (detect_duplicates and use_history) are checked, and identities longer than the
   history can hold are left out.
"""

from __future__ import annotations

import marshal
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from onceflow import journal as J
from onceflow.envelope import BadEnvelope, check_envelope
from onceflow.errors import ScenarioError
from onceflow.scenario import parse_record_line
from onceflow.triggers import TriggerSet

from .archive import Archive, read_records
from .rows import MALFORMED, RECORD, paused_gc

INPUT_SCHEMA = pa.schema([
    ("pos", pa.int64()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("ts", pa.float64()), ("identity", pa.string()),
    ("activation", pa.string()), ("targets", pa.list_(pa.string())), ("where", pa.string()),
])
INPUT_DDL = ("pos long, topic string, partition int, offset long, ts double, "
             "identity string, activation string, targets array<string>, where string")
JOURNAL_DDL = ("trigger string, outcome string, identity string, activation string, "
               "ts double, topic string, partition int, offset long, reason string")
KEY = ("k_topic", "k_partition", "k_offset", "k_ts")
RAN = (J.PROCESSED, J.ERROR)
DUPLICATES = (J.DUPLICATE, J.REJECTED, J.DUPLICATE_ID)


@dataclass(slots=True)
class Violation:
    """One broken guarantee, naming the record."""

    check: str
    trigger: str | None
    message: str
    pos: int | None = None


@dataclass(slots=True)
class AuditResult:
    """What the audit found, and the figures the report draws."""

    records: int = 0
    journal_records: int = 0
    violations: list[Violation] = field(default_factory=list)
    violation_count: int = 0
    counts: dict[tuple[str | None, str], int] = field(default_factory=dict)
    in_doubt: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    exempt_pending: int = 0
    exempt_held: int = 0
    timeline: list[dict[str, Any]] = field(default_factory=list)
    join_times: dict[str, list[float]] = field(default_factory=dict)
    duplicate_sources: list[tuple[str, int]] = field(default_factory=list)
    first_ts: float | None = None
    last_ts: float | None = None

    @property
    def passed(self) -> bool:
        """Whether every guarantee held."""
        return self.violation_count == 0


class AuditRecords:
    """mapInArrow over READ rows per (topic, partition): coordinates and targets."""

    def __init__(self, triggers: TriggerSet) -> None:
        self.routes: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for trigger in triggers.triggers:
            for topic in trigger.topics:
                self.routes.setdefault(topic, []).append((trigger.name, trigger.types))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """One row per input record (malformed lines included, with `where`)."""
        with paused_gc():
            yield from self._run(batches)

    def _run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        highest: dict[tuple[str, int], int] = {}
        first_value: dict[tuple[str, int, int], Any] = {}
        for batch in batches:
            rows: list[tuple[Any, ...]] = []
            kinds = batch.column(0).to_pylist()
            positions = batch.column(1).to_pylist()
            datas = batch.column(5).to_pylist()
            for kind, pos, data in zip(kinds, positions, datas, strict=True):
                if kind == MALFORMED:
                    rows.append((pos, None, None, None, None, None, None, [],
                                 marshal.loads(data)[0]))
                elif kind == RECORD:
                    try:
                        record = parse_record_line(marshal.loads(data), highest, first_value)
                    except ScenarioError as exc:
                        rows.append((pos, None, None, None, None, None, None, [], str(exc)))
                        continue
                    rows.append(self._row(pos, record))
            if rows:
                columns = list(zip(*rows, strict=True))
                yield pa.RecordBatch.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(columns, INPUT_SCHEMA,
                                                              strict=True)],
                    schema=INPUT_SCHEMA)

    def _row(self, pos: int, record: Any) -> tuple[Any, ...]:
        # The spec's own definitions: type (or topic), identity (uuid or message id).
        value = record.value
        identity, activation, targets = record.message_id, None, []
        try:
            check_envelope(value)
        except BadEnvelope:
            pass  # rejected at ingress: a terminal outcome with trigger null is expected
        else:
            doc_type = value.get("type") or record.topic
            identity = value.get("uuid") or identity
            activation = value.get("activation") or None
            targets = [name for name, types in self.routes.get(record.topic, ())
                       if doc_type in types]
        return (pos, record.topic, record.partition, record.offset, float(record.ts),
                identity, activation, targets, None)


def read_journal(spark: Any, path: str) -> Any:
    """A journal as a DataFrame: a replay output folder, Parquet, or JSON lines."""
    from pyspark.sql import functions as F

    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(path)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    nested = jvm.org.apache.hadoop.fs.Path(root, "journal.parquet")
    if fs.exists(nested):
        path, parquet = nested.toString(), True
    else:
        parquet = path.rstrip("/").endswith((".parquet", ".parq"))
    if parquet:
        frame = spark.read.parquet(path)
        return frame.select(*[F.col(c) if c in frame.columns else F.lit(None).alias(c)
                              for c in JOURNAL_COLUMNS])
    return spark.read.schema(JOURNAL_DDL).json(path)


JOURNAL_COLUMNS = [part.split()[0] for part in JOURNAL_DDL.split(", ")]


def keyed(frame: Any) -> Any:
    """Add the matching key (topic, partition, offset, ts), nulls as sentinels."""
    from pyspark.sql import functions as F

    return frame.select("*", F.coalesce("topic", F.lit("")).alias("k_topic"),
                        F.coalesce("partition", F.lit(-1)).alias("k_partition"),
                        F.coalesce("offset", F.lit(-1)).alias("k_offset"),
                        F.coalesce("ts", F.lit(float("nan"))).alias("k_ts"))


def input_records(spark: Any, archive: Archive, triggers: TriggerSet,
                  partitions: int) -> Any:
    """The archive's records with their coordinates and the triggers that take them."""
    return (read_records(spark, archive).where("kind != 0")
            .repartition(partitions, "topic", "partition").sortWithinPartitions("kind", "pos")
            .mapInArrow(AuditRecords(triggers), INPUT_DDL))



def run_audit(spark: Any, archive: Archive, journal_path: str, triggers: TriggerSet, *,
              partitions: int | None = None, limit: int = 200) -> AuditResult:
    """Run both checks and gather the figures of the report."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from .audit_checks import check_outcomes, check_runs
    from .audit_figures import gather_figures
    from .plan import default_partitions

    partitions = partitions or default_partitions(spark)
    result = AuditResult()
    inputs = keyed(input_records(spark, archive, triggers, partitions))
    inputs = inputs.persist(StorageLevel.MEMORY_AND_DISK)
    journal = keyed(read_journal(spark, journal_path)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        result.records = inputs.count()
        result.journal_records = journal.count()
        bounds = inputs.agg(F.min("ts"), F.max("ts")).first()
        result.first_ts, result.last_ts = bounds[0], bounds[1]
        check_outcomes(archive, triggers, inputs, journal, result.last_ts, result, limit)
        check_runs(archive, triggers, inputs, journal, result, limit)
        gather_figures(triggers, inputs, journal, result, limit)
    finally:
        inputs.unpersist()
        journal.unpersist()
    result.violations.sort(key=lambda v: (v.pos is None, v.pos or 0, v.check))
    return result
