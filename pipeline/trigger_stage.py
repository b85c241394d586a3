"""The trigger stage: the core's Engine per group of (trigger, routing key), in file order.

Groups of one trigger share nothing but two things, which this stage rebuilds exactly:

- **partition time**: `onceflow replay` expires, before every record, each join whose
  deadline is before the newest record time seen so far over the whole input.  The read
  stage sends the newest time of every split, and each document carries the newest time
  within its own split up to itself; their maximum is the replay's time at that document.
  Joins only change at their own documents, so expiring before each document of the task
  and once at the end gives the same journal as expiring before every record.
- **suspension**: a suspended trigger holds every later document of that trigger in file
  order.  A first pass finds the position where each trigger first suspends; when there
  is one, the run is repeated with `cutoffs`, and documents after it are held here.

One Engine serves all the groups of a task: their keys are disjoint, so its stores keep
them apart exactly as separate engines would.
"""

from __future__ import annotations

import marshal
from bisect import bisect_right
from collections.abc import Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
from onceflow.engine import Engine, load_callees
from onceflow.envelope import Document
from onceflow.journal import JournalRecord
from onceflow.processor import Sink
from onceflow.scenario import HistorySeed
from onceflow.triggers import TriggerSet

from .call_record import CallBook, Record
from .local_output import write_results
from .rows import SUMMARY, ResultBuilder, final_of, paused_gc, row_slices

BATCH_ROWS = 10_000
NO_CUTOFF = float("inf")


class SplitTimes:
    """Partition time at any position, from the newest time of every split."""

    def __init__(self) -> None:
        self._splits: dict[int, float] = {}
        self.starts: list[int] = []
        self.before: list[float] = []  # newest time of all earlier splits
        self.end: float | None = None  # newest time of the whole input

    def add(self, splits: list[tuple[int, float]]) -> None:
        """Merge split summaries (each task gets them once per replica)."""
        self._splits.update(splits)
        self.starts = sorted(self._splits)
        self.before = []
        newest = float("-inf")
        for start in self.starts:
            self.before.append(newest)
            newest = max(newest, self._splits[start])
        self.end = newest if self._splits else None


class TriggerStage:
    """mapInArrow function: ROUTED_SCHEMA rows in, RESULT_SCHEMA rows out.

    With `results_dir` (a local folder), the task writes its results there itself and
    returns its manifest instead (MANIFEST_SCHEMA, `local_output.py`).
    """

    def __init__(self, triggers: TriggerSet, base_dir: str | None,
                 seeds: list[HistorySeed], cutoffs: dict[str, int],
                 results_dir: str | None = None, *, record_calls: bool = False,
                 answers: Record | None = None) -> None:
        self.triggers = triggers
        self.base_dir = base_dir
        self.seeds = seeds
        self.cutoffs = cutoffs
        self.results_dir = results_dir
        self.record_calls = record_calls
        self.answers = answers

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Run this task's documents through the engine, in position order."""
        # The collector comes back once the engine is gone (the results generator frees
        # it when it ends): back any earlier, its first pass would walk the whole state.
        with paused_gc():
            if self.results_dir is not None:
                yield from write_results((out.take() for out in self._results(batches)),
                                         self.results_dir)
            else:
                yield from (out.batch() for out in self._results(batches))

    def _results(self, batches: Iterator[pa.RecordBatch]) -> Iterator[ResultBuilder]:
        """The task's results, whenever enough of them are ready to be taken."""
        triggers = self.triggers
        base_dir = Path(self.base_dir) if self.base_dir else None
        book = CallBook(self.record_calls, self.answers)
        engine = Engine(triggers, callees=book.wrap(load_callees(triggers, base_dir)),
                        base_dir=base_dir)
        try:
            yield from self._run(engine, book, triggers, batches)
        finally:
            engine.close()
            book.close()

    def _run(self, engine: Engine, book: CallBook, triggers: TriggerSet,
             batches: Iterator[pa.RecordBatch]) -> Iterator[ResultBuilder]:
        for seed in self.seeds:
            engine.seed_history(seed.trigger, seed.identity, seed.status, seed.ts,
                                seed.failed, seed.activation)
        task = _TriggerTask(engine, book, [t.name for t in triggers.triggers], self.cutoffs)
        loads = marshal.loads
        block: int | None = None
        entries: list[tuple[int, int, float | None, Any]] = []
        for kinds, blocks, datas in row_slices(batches, (0, 2, 3)):
            for kind, row_block, data in zip(kinds, blocks, datas, strict=True):
                if kind == SUMMARY:
                    task.times.add(loads(data))
                    continue
                if row_block != block:
                    if entries:
                        task.block(entries)
                    block, entries = row_block, []
                entries.extend(loads(data))
            if len(task.out) >= BATCH_ROWS:
                yield task.out
        if entries:
            task.block(entries)
        yield from task.finish()


class _TriggerTask:
    """One task's engine, partition time, suspension cut-offs and output."""

    def __init__(self, engine: Engine, book: CallBook, names: list[str],
                 cutoffs: dict[str, int]) -> None:
        self.engine = engine
        self.book = book
        self.names = names
        self.cutoffs = [cutoffs.get(name, NO_CUTOFF) for name in names]
        self.times = SplitTimes()
        self.held: list[tuple[str, Document]] = []
        self.out = ResultBuilder()
        self.sink = Sink()

    def block(self, entries: list[tuple[int, int, float | None, Any]]) -> None:
        """Run one block's documents in position order (pieces merged by a stable sort)."""
        entries.sort(key=itemgetter(0))
        times = self.times
        starts, before = times.starts, times.before
        engine, sink, names, cutoffs = self.engine, self.sink, self.names, self.cutoffs
        book = self.book
        expire_due, run_document = engine.expire_due, engine.run_document
        next_start, earlier = float("-inf"), float("-inf")
        for pos, index, w, fields in entries:
            if index < 0:
                item = final_of(fields)
                if isinstance(item, JournalRecord):
                    self.out.journal([item])
                else:
                    self.out.outputs([item])
                continue
            # Partition time: the newest time of earlier splits, or of this split so far.
            if pos >= next_start:
                split = bisect_right(starts, pos) - 1
                earlier = before[split] if split >= 0 else float("-inf")
                next_start = starts[split + 1] if split + 1 < len(starts) else float("inf")
            assert w is not None
            expire_due(earlier if earlier > w else w, sink)
            document = Document(*fields)
            if pos > cutoffs[index]:
                self.held.append((names[index], document))
                continue
            book.position = pos
            run_document(names[index], document, sink)
        self._drain()

    def finish(self) -> Iterator[ResultBuilder]:
        """Expire what the end of the input expires; report held documents."""
        if self.times.end is not None:
            self.engine.expire_due(self.times.end, self.sink)
        self._drain()
        for name, documents in self.engine.held.items():
            self.held.extend((name, document) for document in documents)
        self.out.held(self.held)
        self.out.calls(self.book.take())
        if len(self.out):
            yield self.out

    def _drain(self) -> None:
        sink, out = self.sink, self.out
        if sink.journal:
            out.journal(sink.journal)
            sink.journal = []
        if sink.outputs:
            out.outputs(sink.outputs)
            sink.outputs = []

