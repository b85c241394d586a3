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
from operator import itemgetter
from typing import Any

import orjson
import pyarrow as pa
from onceflow import journal as J
from onceflow.errors import ScenarioError
from onceflow.ingress import Ingress
from onceflow.journal import JournalRecord
from onceflow.keys import key_prefix
from onceflow.outputs import unread_letter
from onceflow.partition import routing_key
from onceflow.scenario import InputOffsets, parse_record_line
from onceflow.store import MemoryState
from onceflow.triggers import TriggerSet

from .archive import RANK_SHIFT
from .rows import (
    RECORDS,
    ROUTED_SCHEMA,
    SUMMARY,
    WANTED,
    document_fields,
    final_fields,
    paused_gc,
    row_slices,
)


@dataclass(frozen=True, slots=True)
class Slots:
    """Values of the `vpart` column and the Spark partition each one hashes to.

    `table` spreads routing keys evenly over the partitions of the trigger stage;
    `replicas` holds one value per partition, to send something to every task.
    """

    table: tuple[int, ...]
    replicas: tuple[int, ...]

    @staticmethod
    def prefix(trigger: str) -> int:
        """crc32 of a trigger's key prefix, which `of` continues with a routing key."""
        return zlib.crc32(key_prefix(trigger).encode("utf-8", "surrogatepass"))

    def of(self, prefix: int, key: str) -> int:
        """The vpart of a (trigger, routing key) group: the same in every task.

        `prefix`: the trigger's `Slots.prefix`; the group's key is key_prefix(trigger) +
        routing key (onceflow.partition.routing_key), hashed with crc32.
        """
        table = self.table
        return table[zlib.crc32(key.encode("utf-8", "surrogatepass"), prefix) % len(table)]


class _RoutedOutput:
    """Columns of ROUTED_SCHEMA rows."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: tuple[list[Any], ...] = ([], [], [], [])

    def add(self, kind: int, vpart: int, block: int, data: bytes) -> None:
        for column, value in zip(self.columns, (kind, vpart, block, data), strict=True):
            column.append(value)

    def __len__(self) -> int:
        return len(self.columns[0])

    def batch(self) -> pa.RecordBatch:
        arrays = [pa.array(column, type=field.type)
                  for column, field in zip(self.columns, ROUTED_SCHEMA, strict=True)]
        self.columns = ([], [], [], [])
        return pa.RecordBatch.from_arrays(arrays, schema=ROUTED_SCHEMA)


class IngressStage:
    """mapInArrow function: READ_SCHEMA rows in, ROUTED_SCHEMA rows out."""

    def __init__(self, triggers: TriggerSet, slots: Slots, files: tuple[str, ...] = ()) -> None:
        self.triggers = triggers
        self.slots = slots
        self.files = files

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Admit every record of this task's topic-partitions, in position order."""
        with paused_gc():
            yield from _IngressTask(self.triggers, self.slots, self.files).run(batches)


class _IngressTask:
    """One task's ingress state and its routing to the trigger stage."""

    def __init__(self, triggers: TriggerSet, slots: Slots, files: tuple[str, ...]) -> None:
        self.files = files
        state = MemoryState()
        self.ingress = Ingress(triggers, state.progress, state.id_store)
        self.slots = slots
        self.routes = {t.name: (i, Slots.prefix(t.name)) for i, t in enumerate(triggers.triggers)}
        self.offsets = InputOffsets(only_wanted=True)  # the read stage says which
        self.out = _RoutedOutput()

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Rows sorted by (kind, block): summaries, wanted offsets, blocks, malformed lines."""
        loads = marshal.loads
        summaries: list[tuple[int, Any]] = []
        block: int | None = None
        entries: list[tuple[int, int, bytes]] = []
        for kinds, blocks, topics, partitions, datas in row_slices(batches, (0, 1, 2, 3, 4)):
            for kind, row_block, topic, partition, data in zip(
                    kinds, blocks, topics, partitions, datas, strict=True):
                if kind == SUMMARY:
                    summary = loads(data)
                    if type(summary) is tuple:
                        # A control line: one task of the trigger stage (the first
                        # replica's) writes its journal record; every task applies it.
                        summary = (*summary, self.slots.replicas[0])
                    summaries.append((row_block, summary))
                    continue
                if kind == WANTED:  # sorted before every RECORDS row of the task
                    self.offsets.want(topic, partition, loads(data))
                    continue
                if summaries:
                    self._replicate(summaries)
                if row_block != block or kind != RECORDS:
                    if entries:
                        self._block(block, entries)
                    block, entries = row_block, []
                if kind == RECORDS:
                    entries.extend(loads(data))
                else:
                    for pos, where, reason, text in loads(data):
                        self._malformed(where, reason, text, pos, row_block)
            if len(self.out):
                yield self.out.batch()
        if summaries:
            self._replicate(summaries)
        if entries:
            self._block(block, entries)
        if len(self.out):
            yield self.out.batch()

    def _block(self, block: Any, entries: list[tuple[int, int, bytes]]) -> None:
        """Admit one block's records in position order; route documents by vpart."""
        entries.sort(key=itemgetter(0))  # sorted pieces: timsort merges the runs
        table = self.slots.table
        size = len(table)
        routes = self.routes
        group_of = self.slots.of
        ingress = self.ingress
        offsets = self.offsets
        journal: list[JournalRecord] = []
        by_vpart: dict[int, list[tuple[int, int, int | None, Any]]] = {}
        loads = orjson.loads
        for pos, w, line in entries:
            item = loads(line)  # the read stage decoded it: it is a JSON object
            try:
                # With the line, a value kept for a later redelivery is kept as this text.
                record = parse_record_line(item, offsets, "", line)
            except ScenarioError as exc:
                self._malformed(self._where(pos), str(exc), None, pos, block, by_vpart)
                continue
            document, targets, letter = ingress.admit_into(record, pos, journal)
            if journal:
                for made in journal:
                    by_vpart.setdefault(table[pos % size], []).append(
                        (pos, -1, None, final_fields(made)))
                journal.clear()
            if document is not None:
                if "value" not in item and "raw" not in item:
                    # A redelivery without its value: the line that had it.
                    line = offsets.lanes[(record.topic, record.partition)].values[
                        record.offset]
                fields = document_fields(document, line)
                for trigger in targets:
                    index, prefix = routes[trigger.name]
                    vpart = group_of(prefix, routing_key(trigger, document))
                    group = by_vpart.get(vpart)
                    if group is None:
                        group = by_vpart[vpart] = []
                    group.append((pos, index, w, fields))
            elif letter is not None:
                by_vpart.setdefault(table[pos % size], []).append(
                    (pos, -1, None, final_fields(letter)))
        for vpart, items in by_vpart.items():
            self.out.add(RECORDS, vpart, block, marshal.dumps(items))

    def _where(self, pos: int) -> str:
        rank = pos >> RANK_SHIFT
        file = self.files[rank] if rank < len(self.files) else "the archive"
        return f"{file} at position {pos & ((1 << RANK_SHIFT) - 1)}"

    def _replicate(self, summaries: list[tuple[int, Any]]) -> None:
        # Every task of the trigger stage needs every split's newest time.
        data = marshal.dumps(summaries)
        for vpart in self.slots.replicas:
            self.out.add(SUMMARY, vpart, -1, data)
        summaries.clear()

    def _malformed(self, where: str, reason: str, text: str | None, pos: int, block: int,
                   by_vpart: dict[int, list[Any]] | None = None) -> None:
        # A line that is not a record gets a terminal outcome and a dead letter, like a
        # record rejected at ingress: the pipeline reports it and goes on.
        why = f"not a record: {reason}"
        items = [(pos, -1, None, final_fields(J.bad_input(
                     None, where, None, None, None, None, None, why, pos))),
                 (pos, -1, None, final_fields(unread_letter(why, where, text)))]
        vpart = self.slots.table[pos % len(self.slots.table)]
        if by_vpart is not None:
            by_vpart.setdefault(vpart, []).extend(items)
        else:
            self.out.add(RECORDS, vpart, block, marshal.dumps(items))

