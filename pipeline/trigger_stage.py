"""The trigger stage: the core's triggers per group of (trigger, routing key), in file order.

Groups of one trigger share nothing but two things, which this stage rebuilds exactly:

- **partition time**: `onceflow replay` expires, before every record, each join whose
  deadline is before the newest record time seen so far over the whole input.  The read
  stage sends the newest time of every split, and each document carries the newest time
  within its own split up to itself; their maximum is the replay's time at that document.
  Joins only change at their own documents, so expiring before each document of the task
  and once at the end gives the same journal as expiring before every record.
- **suspension**: a suspended trigger holds every later document of that trigger in file
  order.  A first pass finds the position where each trigger first suspends; when there
  is one, the run is repeated with `cutoffs`, and every task suspends the trigger there.
  Control lines (an operator's suspend or resume) reach every task with the summaries:
  each task applies them at their positions (a resume decides its held documents again)
  and one task, the first replica's, writes their journal records.  A run that suspends
  its trigger again after a resume is seen by its own task only.

One TriggerRunner serves all the groups of a task: their keys are disjoint, so its stores
keep them apart exactly as separate runners would.
"""

from __future__ import annotations

import marshal
from bisect import bisect_right
from collections.abc import Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
from onceflow.envelope import Document, Timestamp
from onceflow.journal import JournalRecord
from onceflow.processor import Sink
from onceflow.runners import TriggerRunner, load_callees
from onceflow.scenario import SUSPEND, HistorySeed
from onceflow.triggers import TriggerSet
from onceflow.values import decode_value

from .call_record import CallBook, Record
from .local_output import write_results
from .rows import SUMMARY, ResultBuilder, final_of, paused_gc, row_slices

BATCH_ROWS = 10_000


class SplitTimes:
    """Partition time at any position, from the newest time of every split.

    Times are the core's (record_time's ms, made by the read stage), so partition time
    here is the replay's at the same record, with nothing converted on the way.
    """

    def __init__(self) -> None:
        self._splits: dict[int, Timestamp] = {}
        self.starts: list[int] = []
        self.before: list[Timestamp | None] = []  # newest time of all earlier splits
        self.end: Timestamp | None = None  # newest time of the whole input
        # Control lines by position: (ts, action, trigger, newest time of its split up to
        # it, the vpart of the task that journals it).
        self.controls: dict[int, tuple[Timestamp, str, str, Timestamp, int]] = {}

    def add(self, splits: list[tuple[int, Any]]) -> None:
        """Merge split summaries (each task gets them once per replica)."""
        for start, summary in splits:
            if type(summary) is tuple:
                self.controls[start] = summary
            else:
                self._splits[start] = summary
        self.starts = sorted(self._splits)
        self.before = []
        newest: Timestamp | None = None
        for start in self.starts:
            self.before.append(newest)
            ts = self._splits[start]
            if newest is None or ts > newest:
                newest = ts
        self.end = newest

    def at(self, pos: int, newest_in_split: Timestamp) -> Timestamp:
        """Partition time at a position, given the newest time of its split up to it."""
        split = bisect_right(self.starts, pos) - 1
        earlier = self.before[split] if split >= 0 else None
        return later(earlier, newest_in_split)


def later(earlier: Timestamp | None, ts: Timestamp) -> Timestamp:
    """Partition time after ts, given the newest time before it (None: none)."""
    return earlier if earlier is not None and earlier > ts else ts


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
                for out in self._results(batches):
                    yield from out.batches()

    def _results(self, batches: Iterator[pa.RecordBatch]) -> Iterator[ResultBuilder]:
        """The task's results, whenever enough of them are ready to be taken."""
        triggers = self.triggers
        base_dir = Path(self.base_dir) if self.base_dir else None
        book = CallBook(self.record_calls, self.answers)
        engine = TriggerRunner(triggers, callees=book.wrap(load_callees(triggers, base_dir)),
                        base_dir=base_dir)
        try:
            yield from self._run(engine, book, triggers, batches)
        finally:
            engine.close()
            book.close()

    def _run(self, engine: TriggerRunner, book: CallBook, triggers: TriggerSet,
             batches: Iterator[pa.RecordBatch]) -> Iterator[ResultBuilder]:
        for seed in self.seeds:
            engine.seed_history(seed.trigger, seed.identity, seed.status, seed.ts,
                                seed.failed, seed.activation)
        task = _TriggerTask(engine, book, [t.name for t in triggers.triggers], self.cutoffs)
        loads = marshal.loads
        block: int | None = None
        entries: list[tuple[int, int, Timestamp | None, Any]] = []
        for kinds, vparts, blocks, datas in row_slices(batches, (0, 1, 2, 3)):
            for kind, vpart, row_block, data in zip(kinds, vparts, blocks, datas, strict=True):
                if kind == SUMMARY:
                    task.times.add(loads(data))
                    task.replica = vpart  # summaries come to the task's replica vpart
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

    def __init__(self, engine: TriggerRunner, book: CallBook, names: list[str],
                 cutoffs: dict[str, int]) -> None:
        self.engine = engine
        self.book = book
        self.names = names
        # The first position at which each trigger suspends (a pass before found it):
        # the trigger is suspended here before anything after it; None once it is.
        self.cutoffs: list[int | None] = [cutoffs.get(name) for name in names]
        self.cuts = sum(cutoff is not None for cutoff in self.cutoffs)  # not applied yet
        self.times = SplitTimes()
        self.replica: int | None = None
        self.applied = 0  # how many control lines (in position order) are applied
        self._control_order: list[int] | None = None
        self.held: list[tuple[str, Document]] = []
        self.out = ResultBuilder()
        self.sink = Sink()

    def _before(self, pos: float) -> None:
        """Apply the suspensions and control lines that come before a position."""
        if self._control_order is None:
            self._control_order = sorted(self.times.controls)
        order = self._control_order
        while self.applied < len(order) and order[self.applied] < pos:
            at = order[self.applied]
            self.applied += 1
            self._cut_before(at)
            self._control(at, *self.times.controls[at])
        self._cut_before(pos)

    def _cut_before(self, pos: float) -> None:
        """Suspend each trigger whose first suspension (found by a pass before) is behind."""
        if not self.cuts:
            return
        cutoffs, processors = self.cutoffs, self.engine.processors
        for index, cutoff in enumerate(cutoffs):
            if cutoff is not None and cutoff < pos:
                cutoffs[index] = None
                self.cuts -= 1
                processor = processors[self.names[index]]
                if not processor.suspended:  # its own run suspended it in this task
                    self.engine.partition.suspend(processor, "suspended by a run")

    def _control(self, pos: int, ts: Timestamp, action: str, trigger: str,
                 newest: Timestamp, journals: int) -> None:
        """An operator's suspend or resume, as replay applies it (Engine.command)."""
        engine, sink = self.engine, self.sink
        engine.partition.advance(self.times.at(pos, newest), sink.journal)
        processor = engine.processors.get(trigger)
        if processor is None:
            return  # replay refuses such a scenario; the pipeline goes on without it
        if action == SUSPEND:
            record = engine.partition.suspend_by_command(processor, "suspended by command")
            held: list[Document] = []
        else:
            record, held = engine.partition.resume(processor, "resumed by command")
        if record is not None and journals == self.replica:
            record.position = pos
            sink.journal.append(record)
        for document in held:  # decided again, oldest first, as TriggerRunner.resume does
            self.book.position = document.position
            engine.run_document(trigger, document, sink)

    def block(self, entries: list[tuple[int, int, Timestamp | None, Any]]) -> None:
        """Run one block's documents in position order (pieces merged by a stable sort)."""
        entries.sort(key=itemgetter(0))
        times = self.times
        starts, before = times.starts, times.before
        engine, sink, names = self.engine, self.sink, self.names
        book = self.book
        expire_due, run_document = engine.expire_due, engine.run_document
        next_start = float("-inf")
        earlier: Timestamp | None = None
        controls = self.times.controls
        loads = orjson.loads
        for pos, index, w, fields in entries:
            if self.cuts or controls:
                self._before(pos)
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
                earlier = before[split] if split >= 0 else None
                next_start = starts[split + 1] if split + 1 < len(starts) else float("inf")
            assert w is not None
            expire_due(later(earlier, w), sink)
            # The inverse of rows.document_fields: the envelope from its line's text,
            # decoded as the core decodes a line's value.
            item = loads(fields[3])
            document = Document(fields[0], fields[1], fields[2],
                                item["value"] if "value" in item
                                else decode_value(item["raw"].encode("utf-8")),
                                *fields[4:], pos)
            book.position = pos
            run_document(names[index], document, sink)
        self._drain()

    def finish(self) -> Iterator[ResultBuilder]:
        """Expire what the end of the input expires; report held documents."""
        self._before(float("inf"))
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

