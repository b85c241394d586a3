"""`onceflow spark replay`: an archive through the core on Spark, results to files.

The output folder (local or any Hadoop file system) holds:

- `journal.parquet/`: every journal record, typed columns plus `json` (the line
  `onceflow replay` prints) and `position` (the record's place in file order);
- `journal.jsonl/`: the same records as JSON lines (part files);
- `documents/<topic>/`: documents published to output, error, in-doubt, reply-to and
  dead-letter topics, one JSON object a line: {"key", "headers", "value"};
- `held.parquet/`: documents a suspended trigger holds (only when one suspended);
- `summary.json`: counts by trigger and outcome, held documents, timings.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from onceflow.journal import SUSPENDED

from .archive import Archive, direct_io, estimate_records
from .call_record import may_suspend, read_record
from .local_output import Manifest, commit
from .plan import STAGE_NAMES, ReplayPlan, build
from .rows import CALLS, DOCUMENTS, HELD, JOURNAL
from .session import Progress


class PipelineError(RuntimeError):
    """The pipeline contradicted itself (a bug, not bad input)."""


@dataclass(slots=True)
class ReplaySummary:
    """What a run did: counts by (trigger, outcome), held documents, passes, seconds."""

    counts: dict[tuple[str | None, str], int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    cutoffs: dict[str, int] = field(default_factory=dict)
    passes: int = 1
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """The summary.json document."""
        return {
            "counts": [{"trigger": t, "outcome": o, "count": n}
                       for (t, o), n in sorted(self.counts.items(),
                                               key=lambda kv: (kv[0][0] or "", kv[0][1]))],
            "held": self.held,
            "suspended_at_position": self.cutoffs,
            "passes": self.passes,
            "seconds": round(self.seconds, 3),
        }


def _suspensions(rows: pa.Table) -> dict[str, int]:
    """The first position at which a run suspended each trigger, from journal rows.

    A suspension by command (a control line, about no document) is not one: every task
    applies those itself.
    """
    first: dict[str, int] = {}
    columns = rows.select(["dataset", "trigger", "outcome", "identity", "position"]).to_pylist()
    for row in columns:
        if row["dataset"] == JOURNAL and row["outcome"] == SUSPENDED and \
                row["identity"] is not None:
            name, pos = row["trigger"], row["position"]
            if name not in first or pos < first[name]:
                first[name] = pos
    return first


def _settled(plan: ReplayPlan, summary: ReplaySummary, found: dict[str, int],
             attempt: int, calls: Callable[[], Iterable[tuple[str, int, str]]]) -> bool:
    """Whether a pass's suspensions are the ones it was planned with; else plan pass 2.

    Suspensions cut each trigger's documents at a position, and a pass only knows them
    once it has run: a first pass that found new ones runs again with them, and answers
    its service and resolver calls from the first pass's outcomes (`calls`, read only
    then) instead of calling them again.
    """
    if found == plan.cutoffs:
        return True
    if attempt == 2:
        raise PipelineError(f"suspensions moved between passes: {plan.cutoffs} -> {found}")
    plan.cutoffs = found
    plan.answers = read_record(iter(calls()))
    plan.record_calls = False
    summary.passes = 2
    return False


def _first_pass(plan: ReplayPlan) -> None:
    # Only a trigger that may suspend can make a second pass: then keep every outcome.
    plan.record_calls = may_suspend(plan.triggers)
    plan.answers = None


def replay_in_memory(spark: Any, archive: Archive, plan: ReplayPlan,
                     progress: Progress | None = None) -> tuple[pa.Table, ReplaySummary]:
    """Run the replay and collect every result row to the driver (scenarios, tests)."""
    started = time.monotonic()
    summary = ReplaySummary()
    _first_pass(plan)
    for attempt in (1, 2):
        frame = build(spark, archive, plan)
        if progress is not None:
            with progress.job(f"replay pass {attempt}", STAGE_NAMES,
                              records=estimate_records(archive)):
                table = frame.toArrow()
        else:
            table = frame.toArrow()
        found = _suspensions(table)
        if _settled(plan, summary, found, attempt, lambda t=table: _call_rows(t)):
            break
    summary.cutoffs = dict(plan.cutoffs)
    table = table.filter(pc.not_equal(table.column("dataset"), CALLS))
    datasets = table.column("dataset").to_pylist()
    triggers = table.column("trigger").to_pylist()
    outcomes = table.column("outcome").to_pylist()
    counts: Counter[tuple[str | None, str]] = Counter()
    held: Counter[str] = Counter()
    for dataset, trigger, outcome in zip(datasets, triggers, outcomes, strict=True):
        if dataset == JOURNAL:
            counts[(trigger, outcome)] += 1
        elif dataset == HELD:
            held[trigger] += 1
    summary.counts, summary.held = dict(counts), dict(held)
    summary.seconds = time.monotonic() - started
    return table, summary


def _call_rows(table: pa.Table) -> list[tuple[str, int, str]]:
    calls = table.filter(pc.equal(table.column("dataset"), CALLS))
    return list(zip(calls.column("trigger").to_pylist(), calls.column("position").to_pylist(),
                    calls.column("json").to_pylist(), strict=True))


def document_lines(table: pa.Table) -> dict[str, list[bytes]]:
    """Published documents by topic, JSON lines, from collected result rows."""
    out: dict[str, list[bytes]] = {}
    for dataset, topic, text in zip(table.column("dataset").to_pylist(),
                                    table.column("topic").to_pylist(),
                                    table.column("json").to_pylist(), strict=True):
        if dataset == DOCUMENTS:
            out.setdefault(topic, []).extend(line.encode() for line in text.split("\n"))
    return out


def journal_lines(table: pa.Table) -> list[bytes]:
    """The journal's JSON lines from collected result rows (as `onceflow replay` prints)."""
    datasets = table.column("dataset").to_pylist()
    lines = table.column("json").to_pylist()
    return [line.encode() for dataset, line in zip(datasets, lines, strict=True)
            if dataset == JOURNAL]


class _Files:
    """Just enough of Hadoop's FileSystem API for the output folder."""

    def __init__(self, spark: Any, root: str) -> None:
        jvm = spark.sparkContext._jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.root = self._path(root)
        self.fs = self.root.getFileSystem(conf)

    def local_folder(self) -> str | None:
        """The output folder as a local path, when it is on the local file system."""
        if str(self.fs.getScheme()) != "file":
            return None
        return str(self.fs.makeQualified(self.root).toUri().getPath())

    def path(self, name: str) -> Any:
        return self._path(self.root, name)

    def uri(self, name: str) -> str:
        return str(self.fs.makeQualified(self.path(name)).toString())

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def remove(self, name: str) -> None:
        if self.exists(name):
            self.fs.delete(self.path(name), True)

    def move(self, source: str, target: str) -> None:
        self.remove(target)
        if not self.fs.rename(self.path(source), self.path(target)):
            raise PipelineError(f"cannot rename {self.uri(source)} to {self.uri(target)}")

    def children(self, name: str) -> list[str]:
        return [status.getPath().getName() for status in self.fs.listStatus(self.path(name))]

    def write(self, name: str, data: bytes) -> None:
        stream = self.fs.create(self.path(name), True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()


def replay_to_files(spark: Any, archive: Archive, plan: ReplayPlan, output: str,
                    progress: Progress, *, direct: bool | None = None) -> ReplaySummary:
    """Run the replay and write the output folder (see the module docstring).

    `direct`: the trigger stage's tasks write the output files themselves
    (`local_output.py`); by default when the output folder is local and `direct_io` holds
    (a local master).  Otherwise Spark's writer writes them.
    """
    started = time.monotonic()
    files = _Files(spark, output)
    folder = files.local_folder()
    if direct is None:
        direct = folder is not None and direct_io(spark)
    if direct:
        if folder is None:
            raise PipelineError(f"{output}: direct output needs a local folder")
        summary = _replay_direct(spark, archive, plan, folder, progress)
    else:
        summary = _replay_with_spark_writer(spark, archive, plan, files, progress)
    summary.seconds = time.monotonic() - started
    files.write("summary.json", orjson.dumps(summary.as_json(), option=orjson.OPT_INDENT_2))
    return summary


def _replay_direct(spark: Any, archive: Archive, plan: ReplayPlan, folder: str,
                   progress: Progress) -> ReplaySummary:
    summary = ReplaySummary()
    root = os.path.join(folder, "_results")
    _first_pass(plan)
    for attempt in (1, 2):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        frame = build(spark, archive, plan, results_dir=root)
        try:
            with progress.job(f"replay pass {attempt}", STAGE_NAMES,
                              records=estimate_records(archive)):
                manifest = Manifest.of(frame.toArrow())
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)  # what failed attempts wrote
            raise
        found = {trigger: first for (trigger, outcome), first in manifest.first.items()
                 if outcome == SUSPENDED and trigger is not None}
        if _settled(plan, summary, found, attempt, lambda m=manifest: m.calls):
            break
    commit(root, folder, manifest)
    summary.counts, summary.held = manifest.counts, manifest.held
    summary.cutoffs = dict(plan.cutoffs)
    return summary


def _replay_with_spark_writer(spark: Any, archive: Archive, plan: ReplayPlan, files: _Files,
                              progress: Progress) -> ReplaySummary:
    from pyspark.sql import functions as F

    summary = ReplaySummary()
    results = "_results"
    _first_pass(plan)

    def calls() -> list[tuple[str, int, str]]:
        if not files.exists(f"{results}/dataset={CALLS}"):
            return []
        rows = (spark.read.parquet(files.uri(f"{results}/dataset={CALLS}"))
                .select("trigger", "position", "json").collect())
        return [(row["trigger"], row["position"], row["json"]) for row in rows]

    for attempt in (1, 2):
        frame = build(spark, archive, plan)
        with progress.job(f"replay pass {attempt}", STAGE_NAMES,
                              records=estimate_records(archive)):
            frame.write.mode("overwrite").partitionBy("dataset").parquet(files.uri(results))
        journal = spark.read.parquet(files.uri(f"{results}/dataset={JOURNAL}"))
        with progress.job("journal counts"):
            counts = (journal.groupBy("trigger", "outcome")
                      .agg(F.count("*").alias("n"),
                           F.min(F.when(F.col("identity").isNotNull(), F.col("position")))
                           .alias("first"))
                      .collect())
        summary.counts = {(row["trigger"], row["outcome"]): row["n"] for row in counts}
        found = {row["trigger"]: row["first"] for row in counts
                 if row["outcome"] == SUSPENDED and row["first"] is not None}
        if _settled(plan, summary, found, attempt, calls):
            break
    summary.cutoffs = dict(plan.cutoffs)
    with progress.job("journal as JSON lines"):
        journal.select("json").write.mode("overwrite").text(files.uri("journal.jsonl"))
    files.remove("documents")
    if files.exists(f"{results}/dataset={DOCUMENTS}"):
        with progress.job("documents as JSON lines"):
            (spark.read.parquet(files.uri(f"{results}/dataset={DOCUMENTS}"))
             .select("topic", "json").write.mode("overwrite").partitionBy("topic")
             .text(files.uri("documents")))
        for name in files.children("documents"):
            if name.startswith("topic="):
                files.move(f"documents/{name}", f"documents/{name[len('topic='):]}")
    files.move(f"{results}/dataset={JOURNAL}", "journal.parquet")
    files.remove("held.parquet")
    if files.exists(f"{results}/dataset={HELD}"):
        held = spark.read.parquet(files.uri(f"{results}/dataset={HELD}"))
        summary.held = {row["trigger"]: row["count"]
                        for row in held.groupBy("trigger").count().collect()}
        files.move(f"{results}/dataset={HELD}", "held.parquet")
    files.remove(results)
    return summary
