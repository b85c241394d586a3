"""The rows that flow between the stages of the Spark pipeline, and their Arrow schemas.

Three Python stages run inside one Spark job:

1. *read*: the archive in file order, split by split: a position for every record, the
   running maximum of record time within the split, and one summary per split;
2. *ingress*: per (topic, partition), in position order: the core's Ingress;
3. *triggers*: per (trigger, routing key), in position order: the core's
   TriggerRunner.

Records travel in *blocks*: a block is a run of consecutive records of one split (one
Arrow batch of the read stage at most), named by its first position.  Blocks never
overlap, so sorting by block and then by position inside a block gives file order.  A
row carries one block's records for one topic-partition (read -> ingress) or for one
vpart (ingress -> triggers), so the shuffles and sorts move thousands of rows, not
millions, and each stage merges the pieces of a block back into position order.

Payloads are `marshal`-encoded plain values (the same interpreter runs on both sides of
a shuffle).  A record's JSON value is not among them: it travels as the text of its input
line (bytes), which the next stage decodes with orjson where it needs it; unmarshalling
a decoded dict cost about as much as that, and marshalling it was paid on top.  Nothing
here decides anything: it only moves the core's own objects (records,
documents, journal records, outputs) across the shuffles.
"""

from __future__ import annotations

import gc
import marshal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from operator import attrgetter
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from onceflow.envelope import Document, seconds
from onceflow.journal import JournalRecord
from onceflow.outputs import Output

# Row kinds, in the order a stage wants to see them (summaries before records).
SUMMARY = 0
WANTED = 1
RECORDS = 2
MALFORMED = 3

# read -> ingress (shuffled by topic, partition).  data: SUMMARY marshal(newest time),
# WANTED marshal([offset]): offsets of the row's topic-partition that a line redelivers
# without its value (the stage keeps those values only), RECORDS marshal([(pos, w, line
# text as bytes)]), MALFORMED marshal([(pos, where, why, text)]).
READ_SCHEMA = pa.schema([
    ("kind", pa.int8()),
    ("block", pa.int64()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("data", pa.binary()),
])
READ_DDL = "kind byte, block long, topic string, partition int, data binary"

# ingress -> triggers (shuffled by vpart).  data: SUMMARY marshal([(split, newest time)]),
# RECORDS marshal([(pos, trigger index, w, document fields)]) (the envelope as the text of
# the input line that holds it, see document_fields) where a trigger index of -1
# marks a journal record or output made at ingress, passed through (final fields).
ROUTED_SCHEMA = pa.schema([
    ("kind", pa.int8()),
    ("vpart", pa.int32()),
    ("block", pa.int64()),
    ("data", pa.binary()),
])
ROUTED_DDL = "kind byte, vpart int, block long, data binary"

# What the pipeline writes: journal records and published documents.
JOURNAL = "journal"
DOCUMENTS = "documents"
HELD = "held"  # documents a suspended trigger holds: no journal record, not acknowledged
CALLS = "calls"  # service and resolver outcomes kept for a second pass (call_record.py)
RESULT_SCHEMA = pa.schema([
    ("dataset", pa.string()),
    ("trigger", pa.string()),
    ("outcome", pa.string()),
    ("identity", pa.string()),
    ("activation", pa.string()),
    ("ts", pa.float64()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("reason", pa.string()),
    ("attempt", pa.int32()),
    ("position", pa.int64()),
    ("json", pa.string()),
])
RESULT_DDL = ("dataset string, trigger string, outcome string, identity string, "
              "activation string, ts double, topic string, partition int, offset long, "
              "reason string, attempt int, position long, json string")


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a stage runs.

    A stage keeps millions of small objects (history entries, open joins, id caches) and
    makes almost no reference cycles; the collector would rescan the growing state again
    and again for nothing (as `onceflow replay` does, it is paused for the run).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# Rows of an incoming Arrow batch turned into Python values at a time.  A row of the
# stages' schemas is a marshalled block of records (up to thousands), and Spark sends up
# to spark.sql.execution.arrow.maxRecordsPerBatch (10,000) rows in a batch: often a
# task's whole input.  Slices keep the decoded values, and what the stage makes of them
# before it yields, to a few blocks.
SLICE_ROWS = 16


def row_slices(batches: Iterator[pa.RecordBatch], columns: tuple[int, ...]
               ) -> Iterator[list[list[Any]]]:
    """The given columns of every batch, SLICE_ROWS rows at a time, as Python lists."""
    for batch in batches:
        for start in range(0, batch.num_rows, SLICE_ROWS):
            part = batch.slice(start, SLICE_ROWS)
            yield [part.column(i).to_pylist() for i in columns]


def document_fields(doc: Document, line: bytes) -> tuple[Any, ...]:
    """A document as plain values for the shuffle to the trigger stage.

    The envelope goes as `line`, the JSON text of the input line that holds it (its own,
    or for a redelivery without a value the line that had it): marshalling the decoded
    envelope and unmarshalling it cost more than decoding the line again.  The message id
    goes as the header gave it (None: the record's coordinates, which the document on the
    other side makes again if something asks for them).  Headers go as None when there
    are none (a Document makes its own empty ones), and the position not at all: the
    row's entry carries it.
    """
    return (doc.type, doc.identity, doc.activation, line, doc.ts, doc.topic,
            doc.partition, doc.offset, doc.given_message_id, doc.delivery_count, doc.key,
            doc.headers or None)


def final_fields(item: JournalRecord | Output) -> tuple[Any, ...]:
    """A journal record or output made at ingress, passed through the trigger stage."""
    if isinstance(item, JournalRecord):
        return (0, item.trigger, item.outcome, item.identity, item.activation, item.ts,
                item.topic, item.partition, item.offset, item.reason, item.attempt,
                item.position)
    return (1, item.topic, item.key, _plain(item.value), item.headers)


def final_of(fields: tuple[Any, ...]) -> JournalRecord | Output:
    """Inverse of final_fields."""
    if fields[0] == 0:
        return JournalRecord(*fields[1:])
    return Output(*fields[1:])


def _plain(value: Any) -> Any:
    # Dead letters carry decoded JSON; anything marshal cannot take goes through JSON.
    try:
        marshal.dumps(value)
    except ValueError:
        return orjson.loads(orjson.dumps(value, default=str))
    return value


def json_default(value: Any) -> Any:
    """What JSON cannot hold, as its text: a service may return anything."""
    return str(value)


# The journal and held documents as written: RESULT_SCHEMA without `dataset`.
JOURNAL_SCHEMA = pa.schema([f for f in RESULT_SCHEMA if f.name != "dataset"])
JSON_COLUMN = JOURNAL_SCHEMA.get_field_index("json")
TS_COLUMN = JOURNAL_SCHEMA.get_field_index("ts")
# The field tuples as Arrow reads them: JOURNAL_SCHEMA without `json` (its last column),
# `ts` in milliseconds as a float64 (divided into seconds once it is a column).
_FIELDS_STRUCT = pa.struct([pa.field(f.name, pa.float64()) if f.name == "ts" else f
                            for f in JOURNAL_SCHEMA if f.name != "json"])
# A journal record's fields in JOURNAL_SCHEMA order (before `json`), `ts` in milliseconds.
_FIELDS = attrgetter("trigger", "outcome", "identity", "activation", "ts", "topic",
                     "partition", "offset", "reason", "attempt", "position")


# JSON lines made before they are joined (orjson's bytes keep at least 4 KiB each).
JOIN_LINES = 256


def in_joins(items: list[Any]) -> Iterator[list[Any]]:
    """The items JOIN_LINES at a time: the lines made of each part are joined at once."""
    for start in range(0, len(items), JOIN_LINES):
        yield items[start:start + JOIN_LINES]


class Rows:
    """Journal or held rows, turned into Arrow column by column.

    Field tuples in JOURNAL_SCHEMA order (`ts` in milliseconds, no `json`), and the rows'
    JSON lines as chunks of newline-separated text: orjson's bytes keep a buffer of at
    least 4 KiB each, so lines are joined JOIN_LINES at a time as they are made (a block's
    11,000 journal lines held at once took 45 MB).  The text is the JSON-lines file's as
    it is; the `json` column is cut out of it by Arrow (a JSON line has no newline in it).
    """

    __slots__ = ("fields", "chunks")

    def __init__(self) -> None:
        self.fields: list[tuple[Any, ...]] = []
        self.chunks: list[bytes] = []

    def __len__(self) -> int:
        return len(self.fields)

    def add(self, fields: Iterable[tuple[Any, ...]], lines: list[bytes]) -> None:
        """Rows: their fields and their JSON lines."""
        self.fields.extend(fields)
        if lines:
            self.chunks.append(b"\n".join(lines))

    def text(self) -> bytes:
        """The rows' JSON lines, newline-separated."""
        return b"\n".join(self.chunks)

    def batch(self) -> pa.RecordBatch:
        """The rows as a JOURNAL_SCHEMA batch."""
        # Arrow takes the field tuples as struct values and splits them into columns in
        # C++ (transposing them in Python first cost about twice as much).
        columns = pa.array(self.fields, type=_FIELDS_STRUCT).flatten()
        arrays = []
        for index, column in enumerate(columns):
            if index == TS_COLUMN:
                # Seconds as the journal writes them (onceflow.envelope.seconds: ms / 1000,
                # one correctly rounded division either way).
                column = pc.divide(column, 1000.0)
            arrays.append(column)
        # orjson writes UTF-8: the cast checks it.
        lines = pc.split_pattern(pa.array([self.text()], type=pa.binary()), b"\n")
        arrays.insert(JSON_COLUMN, lines.flatten().cast(pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=JOURNAL_SCHEMA)


class ResultParts:
    """What a ResultBuilder collected.

    Journal and held rows, the documents' JSON lines by topic (chunks of newline-separated
    lines, as in Rows), and recorded call outcomes.
    """

    __slots__ = ("journal", "held", "documents", "calls")

    def __init__(self, journal: Rows, held: Rows, documents: dict[str, list[bytes]],
                 calls: list[tuple[str, int, str]] | None = None) -> None:
        self.journal = journal
        self.held = held
        self.documents = documents
        self.calls = calls or []


class ResultBuilder:
    """Collects journal records, outputs and held documents for the task's results."""

    __slots__ = ("_journal", "_held", "_size", "_documents", "_calls")

    def __init__(self) -> None:
        self._journal = Rows()
        self._held = Rows()
        self._size = 0
        self._documents: dict[str, list[bytes]] = {}
        self._calls: list[tuple[str, int, str]] = []

    def __len__(self) -> int:
        return self._size

    def journal(self, records: list[JournalRecord]) -> None:
        """Add journal records (with the JSON line `onceflow replay` prints)."""
        dumps = orjson.dumps
        for part in in_joins(records):
            self._journal.add(map(_FIELDS, part),
                              [dumps(r.as_dict(), default=json_default) for r in part])
        self._size += len(records)

    def outputs(self, items: list[Output]) -> None:
        """Add documents published to output, error, in-doubt, reply-to, dead-letter topics.

        Documents are only ever written as JSON lines, so they are kept as lines per topic
        (in RESULT_SCHEMA rows: one `DOCUMENTS` row per topic and batch, `topic` and
        `json`, one document per line).
        """
        for part in in_joins(items):
            self._outputs(part)
        self._size += len(items)

    def _outputs(self, items: list[Output]) -> None:
        dumps = orjson.dumps
        by_topic: dict[str, list[bytes]] = {}
        for item in items:
            line = dumps({"key": item.key, "headers": item.headers, "value": item.value},
                         default=json_default)
            lines = by_topic.get(item.topic)
            if lines is None:
                lines = by_topic[item.topic] = []
            lines.append(line)
        for topic, lines in by_topic.items():  # joined at once, as in Rows
            self._documents.setdefault(topic, []).append(b"\n".join(lines))

    def held(self, documents: list[tuple[str, Document]]) -> None:
        """Add the documents suspended triggers hold (trigger name, document)."""
        dumps = orjson.dumps
        for part in in_joins(documents):
            self._held.add(
                [(trigger, None, doc.identity, doc.activation, doc.ts, doc.topic,
                  doc.partition, doc.offset, None, None, doc.position)
                 for trigger, doc in part],
                [dumps({"trigger": trigger, "identity": doc.identity,
                        "activation": doc.activation, "ts": seconds(doc.ts),
                        "topic": doc.topic, "partition": doc.partition,
                        "offset": doc.offset}) for trigger, doc in part])
        self._size += len(documents)

    def calls(self, rows: Iterator[tuple[str, int, str]]) -> None:
        """Add recorded call outcomes: (trigger, position, JSON text) rows."""
        before = len(self._calls)
        self._calls.extend(rows)
        self._size += len(self._calls) - before

    def take(self) -> ResultParts:
        """Everything collected so far; the builder starts empty again."""
        parts = ResultParts(self._journal, self._held, self._documents, self._calls)
        self._journal = Rows()
        self._held = Rows()
        self._documents = {}
        self._calls = []
        self._size = 0
        return parts

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Everything collected so far as RESULT_SCHEMA batches; starts empty again."""
        parts = self.take()
        for dataset, rows in ((JOURNAL, parts.journal), (HELD, parts.held)):
            if len(rows):
                batch = rows.batch()
                yield pa.RecordBatch.from_arrays(
                    [pa.array([dataset] * batch.num_rows, type=pa.string()),
                     *batch.columns], schema=RESULT_SCHEMA)
        others: list[dict[str, Any]] = [
            {"dataset": DOCUMENTS, "topic": name, "json": b"\n".join(lines).decode()}
            for name, lines in parts.documents.items()]
        others += [{"dataset": CALLS, "trigger": trigger, "position": position, "json": text}
                   for trigger, position, text in parts.calls]
        if others:
            yield pa.RecordBatch.from_pylist(others, schema=RESULT_SCHEMA)
