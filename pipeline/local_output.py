"""The output folder written by the trigger stage's own tasks, on a local file system.

With a local master and a local output folder, the tasks of the trigger stage that make
the results also write them: the journal as Parquet (pyarrow) and JSON lines, documents
as JSON lines per topic, held documents as Parquet.  Spark's own writer would take every
result row into the JVM, write Parquet from there and read it back for the JSON-lines
files and the counts: on local[2] that was most of the JVM's work in a run.

It keeps the commit protocol of Spark's writer: each task attempt writes under its own
folder of `<output>/_results/`, and returns a *manifest* (its files, its counts) as its
result rows.  The driver collects the manifests of the successful attempts only, so a
failed or repeated attempt's files are never moved into place; everything left under
`_results` is removed at the end.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .rows import HELD, JOURNAL, JOURNAL_SCHEMA, ResultParts, Rows

MANIFEST_SCHEMA = pa.schema([
    ("kind", pa.string()),      # FILE, COUNT or HELD_COUNT
    ("name", pa.string()),      # FILE: path under the results folder
    ("trigger", pa.string()),
    ("outcome", pa.string()),
    ("count", pa.int64()),
    ("position", pa.int64()),   # COUNT: the first position with that outcome
])
MANIFEST_DDL = ("kind string, name string, trigger string, outcome string, count long, "
                "position long")
FILE = "file"
COUNT = "count"
HELD_COUNT = "held"
CALL = "call"  # name: a recorded call outcome (call_record.py), trigger and position

# Journal rows buffered before a Parquet row group is written.
ROW_GROUP_ROWS = 131_072
# The columns Parquet dictionary-encodes: those with few distinct values.  Identities,
# activations, offsets, positions and JSON lines are nearly all distinct: the writer tried
# a dictionary for each and gave up on it page after page (about half its time).
DICTIONARY_COLUMNS = ["trigger", "outcome", "topic", "reason"]
# Where each dataset goes in the output folder.
TARGETS = {JOURNAL: "journal.parquet", HELD: "held.parquet"}
JOURNAL_LINES = "journal.jsonl"


def topic_folder(topic: str) -> str:
    """A topic's folder name under documents/ (Kafka's topic names pass unchanged)."""
    return quote(topic, safe="-._") if topic not in ("", ".", "..") else quote(topic) + "_"


class TaskFiles:
    """The files of one task attempt of the trigger stage."""

    def __init__(self, root: str, partition: int, attempt: int) -> None:
        self.folder = f"attempt-{attempt}"
        self.base = os.path.join(root, self.folder)
        self.stem = f"part-{partition:05d}-{uuid.uuid4().hex}"
        os.makedirs(self.base, exist_ok=True)
        self.names: list[str] = []
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.pending: dict[str, list[pa.RecordBatch]] = {JOURNAL: [], HELD: []}
        self.pending_rows: dict[str, int] = {JOURNAL: 0, HELD: 0}
        self.texts: dict[str, IO[bytes]] = {}
        self.counts: Counter[tuple[str | None, str]] = Counter()
        self.first: dict[tuple[str | None, str], int] = {}
        self.held: Counter[str] = Counter()
        self.calls: list[tuple[str, int, str]] = []

    def write(self, parts: ResultParts) -> None:
        """Write what a ResultBuilder collected."""
        self.calls.extend(parts.calls)
        if len(parts.journal):
            self._journal(parts.journal)
        if len(parts.held):
            self.held.update(row[0] for row in parts.held.fields)
            self._parquet(HELD, parts.held.batch())
        for topic, lines in parts.documents.items():
            self._text(os.path.join("documents", topic_folder(topic)), b"\n".join(lines))

    def _journal(self, rows: Rows) -> None:
        batch = rows.batch()
        table = pa.Table.from_batches([batch])
        grouped = table.group_by(["trigger", "outcome"]).aggregate([([], "count_all")])
        for trigger, outcome, count in zip(
                grouped.column("trigger").to_pylist(), grouped.column("outcome").to_pylist(),
                grouped.column("count_all").to_pylist(), strict=True):
            self.counts[(trigger, outcome)] += count
        # The first position of records about a document (an operator's command is about
        # none: it is no suspension a second pass must cut at).
        about = table.filter(pc.is_valid(table.column("identity")))
        firsts = about.group_by(["trigger", "outcome"]).aggregate([("position", "min")])
        for trigger, outcome, first in zip(
                firsts.column("trigger").to_pylist(), firsts.column("outcome").to_pylist(),
                firsts.column("position_min").to_pylist(), strict=True):
            key = (trigger, outcome)
            if first is not None and (key not in self.first or first < self.first[key]):
                self.first[key] = first
        self._text(JOURNAL_LINES, rows.text())
        self._parquet(JOURNAL, batch)

    def _parquet(self, dataset: str, batch: pa.RecordBatch) -> None:
        self.pending[dataset].append(batch)
        self.pending_rows[dataset] += batch.num_rows
        if self.pending_rows[dataset] >= ROW_GROUP_ROWS:
            self._flush(dataset)

    def _flush(self, dataset: str) -> None:
        batches = self.pending[dataset]
        if not batches:
            return
        writer = self.writers.get(dataset)
        if writer is None:
            name = os.path.join(TARGETS[dataset], f"{self.stem}.snappy.parquet")
            path = os.path.join(self.base, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            writer = self.writers[dataset] = pq.ParquetWriter(
                path, JOURNAL_SCHEMA, compression="snappy", use_dictionary=DICTIONARY_COLUMNS)
            self.names.append(name)
        writer.write_table(pa.Table.from_batches(batches, schema=JOURNAL_SCHEMA))
        self.pending[dataset] = []
        self.pending_rows[dataset] = 0

    def _text(self, folder: str, text: bytes) -> None:
        handle = self.texts.get(folder)
        if handle is None:
            name = os.path.join(folder, f"{self.stem}.txt")
            path = os.path.join(self.base, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handle = self.texts[folder] = open(path, "wb")  # noqa: SIM115 (closed in close)
            self.names.append(name)
        handle.write(text)
        handle.write(b"\n")

    def close(self) -> pa.RecordBatch:
        """Finish every file; the manifest of this attempt."""
        for dataset in list(self.pending):
            self._flush(dataset)
        for writer in self.writers.values():
            writer.close()
        for handle in self.texts.values():
            handle.close()
        rows: list[tuple[Any, ...]] = [
            (FILE, os.path.join(self.folder, name), None, None, None, None)
            for name in self.names]
        rows += [(COUNT, None, trigger, outcome, count, self.first.get((trigger, outcome)))
                 for (trigger, outcome), count in self.counts.items()]
        rows += [(HELD_COUNT, None, trigger, None, count, None)
                 for trigger, count in self.held.items()]
        rows += [(CALL, text, trigger, None, None, position)
                 for trigger, position, text in self.calls]
        columns: list[Any] = (list(zip(*rows, strict=True)) if rows
                              else [[] for _ in MANIFEST_SCHEMA])
        return pa.RecordBatch.from_arrays(
            [pa.array(column, type=f.type) for column, f in zip(columns, MANIFEST_SCHEMA,
                                                                strict=True)],
            schema=MANIFEST_SCHEMA)


def write_results(results: Iterator[ResultParts], root: str) -> Iterator[pa.RecordBatch]:
    """Write a task's results under `root`; yield its manifest."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    attempt = context.taskAttemptId() if context is not None else os.getpid()
    files = TaskFiles(root, partition, attempt)
    for parts in results:
        files.write(parts)
    yield files.close()


@dataclass(slots=True)
class Manifest:
    """What the successful attempts wrote and counted."""

    files: list[str] = field(default_factory=list)
    counts: dict[tuple[str | None, str], int] = field(default_factory=dict)
    first: dict[tuple[str | None, str], int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, int, str]] = field(default_factory=list)

    @classmethod
    def of(cls, table: pa.Table) -> Manifest:
        """Merge the manifests collected from the tasks."""
        manifest = cls()
        counts: Counter[tuple[str | None, str]] = Counter()
        held: Counter[str] = Counter()
        for row in table.to_pylist():
            if row["kind"] == FILE:
                manifest.files.append(row["name"])
            elif row["kind"] == COUNT:
                key = (row["trigger"], row["outcome"])
                counts[key] += row["count"]
                first = row["position"]
                if first is not None and (key not in manifest.first
                                          or first < manifest.first[key]):
                    manifest.first[key] = first
            elif row["kind"] == HELD_COUNT:
                held[row["trigger"]] += row["count"]
            elif row["kind"] == CALL:
                manifest.calls.append((row["trigger"], row["position"], row["name"]))
        manifest.counts, manifest.held = dict(counts), dict(held)
        return manifest


def commit(root: str, output: str, manifest: Manifest) -> None:
    """Move the files of the manifest into place in `output`; remove `root`."""
    for target in (*TARGETS.values(), JOURNAL_LINES, "documents"):
        shutil.rmtree(os.path.join(output, target), ignore_errors=True)
    for folder in (TARGETS[JOURNAL], JOURNAL_LINES):
        os.makedirs(os.path.join(output, folder), exist_ok=True)
    for name in manifest.files:
        relative = name.split(os.sep, 1)[1]
        target = os.path.join(output, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(root, name), target)
    journal = os.path.join(output, TARGETS[JOURNAL])
    if not any(name.endswith(".parquet") for name in os.listdir(journal)):
        # An archive without records still gives a journal that Parquet readers can open.
        pq.write_table(JOURNAL_SCHEMA.empty_table(),
                       os.path.join(journal, "part-00000-empty.snappy.parquet"))
    shutil.rmtree(root, ignore_errors=True)
