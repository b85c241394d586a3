"""The ingress stage: the core's Ingress per (topic, partition), in file order.

Spark hands each task every record of some topic-partitions, sorted by position (file
order).  One `Ingress` over one in-memory state serves all of them: its duplicate-ID
caches and delivery counts are kept per topic-partition inside.  Each admitted document
is routed to the trigger stage once per trigger that takes it, under the routing key of
that trigger (the activation for joins, the identity otherwise), so that every document a
trigger's history or join state needs arrives in the same task.
"""

from __future__ import annotations

import marshal
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from onceflow import journal as J
from onceflow.engine import DEAD_LETTER_TOPIC, MemoryState, dead_letter
from onceflow.envelope import Document
from onceflow.errors import ScenarioError
from onceflow.ingress import Ingress
from onceflow.journal import JournalRecord
from onceflow.processor import Output
from onceflow.scenario import parse_record_line
from onceflow.triggers import TriggerDef, TriggerSet

from .rows import (
    FINAL,
    MALFORMED,
    RECORD,
    ROUTED_SCHEMA,
    SUMMARY,
    encode_document,
    encode_final,
    paused_gc,
)


@dataclass(frozen=True, slots=True)
class Slots:
    """Values of the `vpart` column and the Spark partition each one hashes to.

    `table` spreads routing keys evenly over the partitions of the trigger stage;
    `replicas` holds one value per partition, to send something to every task.
    """

    table: tuple[int, ...]
    replicas: tuple[int, ...]

    def of(self, trigger: str, key: str) -> int:
        """The vpart of a (trigger, routing key) group: the same in every task."""
        digest = zlib.crc32((trigger + "\x1f" + key).encode("utf-8", "surrogatepass"))
        return self.table[digest % len(self.table)]


def routing_key(trigger: TriggerDef, doc: Document) -> str:
    """Where a trigger keeps a document's state: its activation for joins, else identity.

    A join trigger's document without an activation is bad input for that trigger and
    keeps no state, so any key will do: its identity spreads them out.
    """
    if trigger.routes_by_activation and doc.activation is not None:
        return doc.activation
    return doc.identity


class _RoutedOutput:
    """Columns of ROUTED_SCHEMA rows."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: tuple[list[Any], ...] = ([], [], [], [], [], [])

    def add(self, kind: int, vpart: int, pos: int, trigger: int, w: float | None,
            data: bytes) -> None:
        kinds, vparts, positions, triggers, ws, datas = self.columns
        kinds.append(kind)
        vparts.append(vpart)
        positions.append(pos)
        triggers.append(trigger)
        ws.append(w)
        datas.append(data)

    def __len__(self) -> int:
        return len(self.columns[0])

    def batch(self) -> pa.RecordBatch:
        arrays = [pa.array(column, type=field.type)
                  for column, field in zip(self.columns, ROUTED_SCHEMA, strict=True)]
        self.columns = ([], [], [], [], [], [])
        return pa.RecordBatch.from_arrays(arrays, schema=ROUTED_SCHEMA)


class IngressStage:
    """mapInArrow function: READ_SCHEMA rows in, ROUTED_SCHEMA rows out."""

    def __init__(self, triggers: TriggerSet, slots: Slots) -> None:
        self.triggers = triggers
        self.slots = slots

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Admit every record of this task's topic-partitions, in position order."""
        with paused_gc():
            yield from self._run(batches)

    def _run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state = MemoryState()
        ingress = Ingress(self.triggers, state.progress, state.id_store)
        slots = self.slots
        table = slots.table
        size = len(table)
        # Slots.of and routing_key, unrolled for the hot loop: crc32 continues from the
        # trigger's prefix, which is crc32 of the concatenation.
        routes = {t.name: (i, t.routes_by_activation, zlib.crc32((t.name + "\x1f").encode()))
                  for i, t in enumerate(self.triggers.triggers)}
        crc32 = zlib.crc32
        highest: dict[tuple[str, int], int] = {}
        first_value: dict[tuple[str, int, int], Any] = {}
        summaries: list[tuple[int, float]] = []
        out = _RoutedOutput()
        journal: list[JournalRecord] = []
        loads = marshal.loads

        def final(item: JournalRecord | Output, pos: int) -> None:
            out.add(FINAL, table[pos % size], pos, -1, None, encode_final(item))

        for batch in batches:
            kinds = batch.column(0).to_pylist()
            positions = batch.column(1).to_pylist()
            ws = batch.column(4).to_pylist()
            datas = batch.column(5).to_pylist()
            for kind, pos, w, data in zip(kinds, positions, ws, datas, strict=True):
                if summaries and kind != SUMMARY:
                    self._replicate(summaries, out)
                if kind == RECORD:
                    try:
                        record = parse_record_line(loads(data), highest, first_value)
                    except ScenarioError as exc:
                        self._malformed(f"position {pos}", str(exc), None, pos, final)
                        continue
                    document, targets, rejected = ingress.admit_into(record, pos, journal)
                    if journal:
                        for item in journal:
                            final(item, pos)
                        journal.clear()
                    if document is not None:
                        encoded = encode_document(document)
                        activation = document.activation
                        for trigger in targets:
                            index, by_activation, prefix = routes[trigger.name]
                            key = (activation if by_activation and activation is not None
                                   else document.identity)
                            vpart = table[crc32(key.encode("utf-8", "surrogatepass"), prefix)
                                          % size]
                            out.add(RECORD, vpart, pos, index, w, encoded)
                    elif rejected is not None:
                        final(dead_letter(record, rejected), pos)
                elif kind == SUMMARY:
                    summaries.append((pos, w))
                else:
                    assert kind == MALFORMED
                    where, reason, text = loads(data)
                    self._malformed(where, reason, text, pos, final)
            if len(out):
                yield out.batch()
        if summaries:
            self._replicate(summaries, out)
        if len(out):
            yield out.batch()

    def _replicate(self, summaries: list[tuple[int, float]], out: _RoutedOutput) -> None:
        # Every task of the trigger stage needs every split's newest time.
        data = marshal.dumps(summaries)
        for vpart in self.slots.replicas:
            out.add(SUMMARY, vpart, -1, -1, None, data)
        summaries.clear()

    @staticmethod
    def _malformed(where: str, reason: str, text: str | None, pos: int, final: Any) -> None:
        # A line that is not a record gets a terminal outcome and a dead letter, like a
        # record rejected at ingress: the pipeline reports it and goes on.
        why = f"not a record: {reason}"
        final(JournalRecord(None, J.BAD_INPUT, where, None, None, None, None, None, why,
                            None, pos), pos)
        body = {"reason": why, "where": where, "raw": text}
        final(Output(DEAD_LETTER_TOPIC, None, body, {"reason": why}), pos)
