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
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pyarrow as pa
from onceflow.envelope import BadEnvelope, check_envelope, seconds
from onceflow.errors import ScenarioError
from onceflow.scenario import InputOffsets, parse_record_line
from onceflow.triggers import TriggerSet

from .archive import Archive
from .audit_checks import check_outcomes, check_runs
from .audit_figures import gather_figures
from .audit_result import KEY, AuditResult
from .read_stage import read_records
from .rows import MALFORMED, RECORDS, WANTED, paused_gc, row_slices

INPUT_SCHEMA = pa.schema([
    ("pos", pa.int64()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("ts", pa.float64()), ("identity", pa.string()),
    ("activation", pa.string()), ("targets", pa.list_(pa.string())), ("where", pa.string()),
    ("doc_type", pa.string()),
])
INPUT_DDL = ("pos long, topic string, partition int, offset long, ts double, "
             "identity string, activation string, targets array<string>, where string, "
             "doc_type string")
JOURNAL_DDL = ("trigger string, outcome string, identity string, activation string, "
               "ts double, topic string, partition int, offset long, reason string")
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
        offsets = InputOffsets(only_wanted=True)  # WANTED rows come first (sorted by kind)
        for kinds, topics, partitions, datas in row_slices(batches, (0, 2, 3, 4)):
            rows: list[tuple[Any, ...]] = []
            for kind, topic, partition, data in zip(kinds, topics, partitions, datas,
                                                    strict=True):
                if kind == WANTED:
                    offsets.want(topic, partition, marshal.loads(data))
                elif kind == MALFORMED:
                    for pos, where, _, _ in marshal.loads(data):
                        rows.append((pos, None, None, None, None, None, None, [], where,
                                     None))
                elif kind == RECORDS:
                    # One topic-partition's records of one block, in file order; blocks of
                    # a topic-partition come in file order too.
                    for pos, _, line in marshal.loads(data):
                        try:
                            record = parse_record_line(orjson.loads(line), offsets)
                        except ScenarioError as exc:
                            rows.append((pos, None, None, None, None, None, None, [],
                                         str(exc), None))
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
        identity, activation, targets, doc_type = record.message_id, None, [], None
        try:
            check_envelope(value)
        except BadEnvelope:
            # Rejected at ingress: a terminal outcome with trigger null is expected, under
            # the uuid when it can be read as one.
            uuid = value.get("uuid") if isinstance(value, dict) else None
            if isinstance(uuid, str) and uuid:
                identity = uuid
        else:
            doc_type = value.get("type") or record.topic
            identity = value.get("uuid") or identity
            activation = value.get("activation") or None
            targets = [name for name, types in self.routes.get(record.topic, ())
                       if doc_type in types]
        return (pos, record.topic, record.partition, record.offset, float(seconds(record.ts)),
                identity, activation, targets, None, doc_type)


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
    return spark.read.text(path).mapInArrow(_journal_lines, JOURNAL_DDL)


JOURNAL_COLUMNS = [part.split()[0] for part in JOURNAL_DDL.split(", ")]
JOURNAL_TYPES: dict[str, type | tuple[type, ...]] = {
    "trigger": str, "outcome": str, "identity": str, "activation": str, "ts": (int, float),
    "topic": str, "partition": int, "offset": int, "reason": str,
}


def _journal_lines(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """JSON-lines journal records as rows (orjson: several times faster than Spark's reader).

    A line that is not a journal record becomes a record of outcome "unreadable", which
    the audit reports as naming no record of the archive.
    """
    import orjson

    schema = pa.schema([(name, pa.float64() if name == "ts" else
                         pa.int32() if name == "partition" else
                         pa.int64() if name == "offset" else pa.string())
                        for name in JOURNAL_COLUMNS])
    for batch in batches:
        columns: list[list[Any]] = [[] for _ in JOURNAL_COLUMNS]
        for line in batch.column(0).to_pylist():
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                record = None
            if type(record) is not dict or type(record.get("outcome")) is not str:
                record = {"outcome": "unreadable", "identity": line[:200]}
            for column, name in zip(columns, JOURNAL_COLUMNS, strict=True):
                value = record.get(name)
                if value is not None and (isinstance(value, bool)
                                          or not isinstance(value, JOURNAL_TYPES[name])):
                    value = None if name != "identity" else str(value)
                column.append(value)
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)],
            schema=schema)


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
            .repartition(partitions, "topic", "partition").sortWithinPartitions("kind", "block")
            .mapInArrow(AuditRecords(triggers), INPUT_DDL))



# Told the name of each step of an audit, and the input records once they are counted.
Step = Callable[[str, int | None], None]


def _no_step(name: str, records: int | None) -> None:
    """No progress to show."""


class Auditor:
    """Audits journals against one archive; the archive is read once, then kept."""

    def __init__(self, spark: Any, archive: Archive, triggers: TriggerSet, *,
                 partitions: int | None = None, step: Step | None = None) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from .plan import default_partitions

        self.archive = archive
        self.triggers = triggers
        self.spark = spark
        self.step: Step = step or _no_step
        self.step("reading the archive", None)
        partitions = partitions or default_partitions(spark, archive)
        self.inputs = keyed(input_records(spark, archive, triggers, partitions)).persist(
            StorageLevel.MEMORY_AND_DISK)
        row = self.inputs.agg(F.count("*"), F.min("ts"), F.max("ts")).first()
        self.records, self.first_ts, self.last_ts = int(row[0]), row[1], row[2]
        # One row per (topic, partition, offset, ts): how many input records share it
        # (a redelivery with the same time), the first one's position, its targets.
        self.by_key = self.inputs.groupBy(*KEY).agg(
            F.count("*").alias("n"), F.min("pos").alias("pos"),
            F.first("targets").alias("targets"), F.first("identity").alias("identity"),
            F.collect_set("identity").alias("identities"), F.first("doc_type").alias("doc_type"),
            F.first("activation").alias("activation"), F.first("where").alias("where"),
            F.first("topic").alias("topic"), F.first("partition").alias("partition"),
            F.first("offset").alias("offset"), F.first("ts").alias("ts"),
        ).persist(StorageLevel.MEMORY_AND_DISK)

    def check(self, journal_path: str, *, limit: int = 200) -> AuditResult:
        """Run both checks on one journal and gather the figures of the report."""
        from pyspark import StorageLevel

        result = AuditResult(records=self.records, first_ts=self.first_ts,
                             last_ts=self.last_ts)
        step = self.step
        step("reading the journal", self.records)
        journal = keyed(read_journal(self.spark, journal_path)).persist(
            StorageLevel.MEMORY_AND_DISK)
        try:
            result.journal_records = journal.count()
            step("checking terminal outcomes", self.records)
            check_outcomes(self.archive, self.triggers, self.by_key, journal, result.last_ts,
                           result, limit)
            step("checking service runs", self.records)
            check_runs(self.archive, self.triggers, self.by_key, journal, result, limit)
            step("figures for the report", self.records)
            gather_figures(self.triggers, self.by_key, journal, result, limit)
        finally:
            journal.unpersist()
        result.violations.sort(key=lambda v: (v.pos is None, v.pos or 0, v.check))
        return result

    def close(self) -> None:
        """Release the archive's cached records."""
        self.by_key.unpersist()
        self.inputs.unpersist()


def run_audit(spark: Any, archive: Archive, journal_path: str, triggers: TriggerSet, *,
              partitions: int | None = None, limit: int = 200,
              step: Step | None = None) -> AuditResult:
    """Audit one journal against an archive (`step` hears each step's name)."""
    auditor = Auditor(spark, archive, triggers, partitions=partitions, step=step)
    try:
        return auditor.check(journal_path, limit=limit)
    finally:
        auditor.close()
