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
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from onceflow.engine import Engine
from onceflow.envelope import Document
from onceflow.journal import JournalRecord
from onceflow.processor import Sink
from onceflow.scenario import HistorySeed
from onceflow.triggers import TriggerSet

from .rows import (
    RECORD,
    SUMMARY,
    ResultBuilder,
    decode_document,
    decode_final,
    paused_gc,
)

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
    """mapInArrow function: ROUTED_SCHEMA rows in, RESULT_SCHEMA rows out."""

    def __init__(self, triggers: TriggerSet, base_dir: str | None,
                 seeds: list[HistorySeed], cutoffs: dict[str, int]) -> None:
        self.triggers = triggers
        self.base_dir = base_dir
        self.seeds = seeds
        self.cutoffs = cutoffs

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Run this task's documents through the engine, in position order."""
        engine = Engine(self.triggers, base_dir=Path(self.base_dir) if self.base_dir else None)
        try:
            with paused_gc():
                yield from self._run(engine, batches)
        finally:
            engine.close()

    def _run(self, engine: Engine, batches: Iterator[pa.RecordBatch]
             ) -> Iterator[pa.RecordBatch]:
        for seed in self.seeds:
            engine.seed_history(seed.trigger, seed.identity, seed.status, seed.ts,
                                seed.failed, seed.activation)
        names = [t.name for t in self.triggers.triggers]
        cutoffs = [self.cutoffs.get(name, NO_CUTOFF) for name in names]
        times = SplitTimes()
        held: list[tuple[str, Document]] = []
        out = ResultBuilder()
        sink = Sink()
        split = -1  # index into times.starts of the split of the last document
        next_start = float("-inf")
        earlier = float("-inf")
        expire_due = engine.expire_due
        run_document = engine.run_document
        for batch in batches:
            kinds = batch.column(0).to_pylist()
            positions = batch.column(2).to_pylist()
            indexes = batch.column(3).to_pylist()
            ws = batch.column(4).to_pylist()
            datas = batch.column(5).to_pylist()
            for kind, pos, index, w, data in zip(kinds, positions, indexes, ws, datas,
                                                 strict=True):
                if kind == RECORD:
                    # Documents come in position order, so the split only moves forward.
                    if pos >= next_start:
                        starts = times.starts
                        while split + 1 < len(starts) and starts[split + 1] <= pos:
                            split += 1
                        earlier = times.before[split] if split >= 0 else float("-inf")
                        next_start = (starts[split + 1] if split + 1 < len(starts)
                                      else float("inf"))
                    expire_due(earlier if earlier > w else w, sink)
                    if pos > cutoffs[index]:
                        held.append((names[index], decode_document(data)))
                        continue
                    run_document(names[index], decode_document(data), sink)
                elif kind == SUMMARY:
                    times.add(marshal.loads(data))
                    split, next_start = -1, float("-inf")
                else:
                    item = decode_final(data)
                    if isinstance(item, JournalRecord):
                        out.journal([item])
                    else:
                        out.outputs([item])
            self._drain(sink, out)
            if len(out) >= BATCH_ROWS:
                yield out.batch()
        if times.end is not None:
            expire_due(times.end, sink)
        self._drain(sink, out)
        for name, documents in engine.held.items():
            held.extend((name, document) for document in documents)
        out.held(held)
        if len(out):
            yield out.batch()

    @staticmethod
    def _drain(sink: Sink, out: ResultBuilder) -> None:
        if sink.journal:
            out.journal(sink.journal)
            sink.journal = []
        if sink.outputs:
            out.outputs(sink.outputs)
            sink.outputs = []

