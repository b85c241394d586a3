"""The read stage: records of an archive's files in file order, split by split.

It gives every record a *position* that sorts in file order without a global count:
`file rank << 40 | (split start + row within split)` for JSON lines (a split of n lines
spans at least n bytes, so positions never overlap the next split) and
`file rank << 40 | row index` for Parquet.  It keeps the running maximum of record time
within each split and writes one summary per split, so that the trigger stage can rebuild
partition time (the running maximum over the whole archive) exactly.  Each line is parsed
here for what routing and time need; later stages get its text (bytes), not the parsed
record (a Parquet row goes on as the JSON line it stands for).
"""

from __future__ import annotations

import marshal
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from onceflow.envelope import Timestamp, record_time
from onceflow.errors import ScenarioError
from onceflow.scenario import Control, InputOffsets, parse_control_line, parse_record_line

from .archive import (
    PARQUET_COLUMNS,
    RANK_SHIFT,
    Archive,
    ArchiveError,
    local_path,
    local_splits,
    normalize_path,
)
from .rows import MALFORMED, READ_DDL, READ_SCHEMA, RECORDS, SUMMARY, WANTED, paused_gc


class _Blocks:
    """The read stage's output: per block, one row for each topic-partition in it."""

    __slots__ = ("columns", "groups", "malformed", "wanted", "block")

    def __init__(self) -> None:
        self.columns: tuple[list[Any], ...] = ([], [], [], [], [])
        self.groups: dict[tuple[str, int], list[tuple[int, Timestamp, bytes]]] = {}
        self.malformed: list[tuple[int, str, str, str]] = []
        # Offsets that a line of this block redelivers without its value, per partition.
        self.wanted: dict[tuple[str, int], list[int]] = {}
        self.block: int | None = None

    def _row(self, kind: int, block: int, topic: str | None, partition: int | None,
             data: bytes) -> None:
        for column, value in zip(self.columns, (kind, block, topic, partition, data),
                                 strict=True):
            column.append(value)

    def close_block(self) -> None:
        """Write the current block's rows; the next record starts a new block."""
        block = self.block
        if block is None:
            return
        for (topic, partition), entries in self.groups.items():
            self._row(RECORDS, block, topic, partition, marshal.dumps(entries))
        if self.malformed:
            self._row(MALFORMED, block, None, None, marshal.dumps(self.malformed))
        for (topic, partition), offsets in self.wanted.items():
            self._row(WANTED, block, topic, partition, marshal.dumps(offsets))
        self.groups = {}
        self.malformed = []
        self.wanted = {}
        self.block = None

    def summary(self, first: int, newest: Timestamp) -> None:
        """A split's first position and newest record time."""
        self._row(SUMMARY, first, None, None, marshal.dumps(newest))

    def control(self, pos: int, control: Control, newest: Timestamp) -> None:
        """A control line (an operator's command) at its position.

        With the split's newest record time up to it; every task of the trigger stage
        gets it, as a summary.
        """
        self._row(SUMMARY, pos, None, None, marshal.dumps(
            (control.ts, control.action, control.trigger, newest)))

    def emit(self) -> Iterator[pa.RecordBatch]:
        """The rows written so far, as one batch (nothing when there are none)."""
        rows = self.batch()
        if rows is not None:
            yield rows

    def batch(self) -> pa.RecordBatch | None:
        """The rows written so far, as one batch (None when there are none)."""
        if not self.columns[0]:
            return None
        arrays = [pa.array(column, type=field.type)
                  for column, field in zip(self.columns, READ_SCHEMA, strict=True)]
        self.columns = ([], [], [], [], [])
        return pa.RecordBatch.from_arrays(arrays, schema=READ_SCHEMA)


class _Splits:
    """Positions and the running maximum of record time, split by split."""

    __slots__ = ("ranks", "unit", "file", "start", "rank_base", "base", "row", "high")

    def __init__(self, ranks: dict[str, int], unit: str) -> None:
        self.ranks = ranks
        self.unit = unit  # "line" (JSON lines) or "row" (Parquet), for messages
        self.file: str | None = None
        self.start = -1
        self.rank_base = 0
        self.base = 0
        self.row = 0
        # The newest record time of the split so far, as the core has it (record_time's
        # ms): every stage after this one carries it so, and the trigger stage moves
        # partition time on it as replay does (None: no record yet).
        self.high: Timestamp | None = None

    def enter(self, file: str, start: int, first_row: int, out: _Blocks) -> None:
        """A row of another split than the last one: close the last, open this one.

        `first_row` is where the split's rows start counting: its byte offset for JSON
        lines, the row index of its first row for Parquet.  A block never spans splits:
        Spark may read the splits of one file in any order.
        """
        self.close(out)
        rank = self.ranks.get(normalize_path(file))
        if rank is None:
            raise ArchiveError(f"{file}: read by Spark but not listed in the archive")
        self.file, self.start = file, start
        self.rank_base = rank << RANK_SHIFT
        self.base = self.rank_base + first_row
        self.row = 0
        self.high = None

    def close(self, out: _Blocks) -> None:
        """Close the block and write the summary of the current split."""
        out.close_block()
        if self.file is not None and self.high is not None:
            out.summary(self.base, self.high)
        self.file = None

    def where(self) -> str:
        """Where the current row is (1-based), for an operator looking for it."""
        if self.unit == "row":
            return f"{self.file} row {self.row}"
        if self.start <= 0:
            return f"{self.file} line {self.row}"
        return f"{self.file} line {self.row} of the block at byte {self.start}"


def _route(item: Any, pos: int, splits: _Splits, out: _Blocks, text: str | bytes) -> None:
    """Check what routing and time need; a line that is not a record goes on as malformed.

    The core's parse_record_line has the last word; it runs here only for a line that
    looks wrong, so that a malformed line is named by its file and line.  Checks that need
    the partition's earlier lines (a redelivery may leave out its value) wait for ingress.
    """
    if type(item) is dict and "control" in item:
        try:
            control = parse_control_line(item)
        except ScenarioError as exc:
            reason = str(exc)
        else:
            high = splits.high
            if high is None or control.ts > high:  # a command moves time as a record does
                high = splits.high = control.ts
            out.control(pos, control, high)
            return
    elif type(item) is dict:
        ts = item.get("ts")
        topic = item.get("topic")
        partition = item.get("partition")
        if partition is None:
            partition = 0
        routable = bool((type(ts) is int or type(ts) is float) and type(topic) is str and topic
                        and type(partition) is int and 0 <= partition < 2**31)
        reason = "'partition' is out of range"
        if routable and not _looks_wrong(item):
            _add(item, ts, topic, partition, pos, splits, out, text)
            return
        try:
            parse_record_line(item, InputOffsets(keep_values=False))
        except ScenarioError as exc:
            reason = str(exc)
        else:
            if routable:
                _add(item, ts, topic, partition, pos, splits, out, text)
                return
    else:
        reason = "expected a JSON object"
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    out.malformed.append((pos, splits.where(), reason, text))


def _looks_wrong(item: dict[str, Any]) -> bool:
    headers = item.get("headers")
    if headers and (type(headers) is not dict
                    or not all(type(v) is str for v in headers.values())):
        return True
    key, offset, raw = item.get("key"), item.get("offset"), item.get("raw")
    return ((key is not None and type(key) is not str)
            or (offset is not None and (type(offset) is not int or offset < 0))
            or (raw is not None and type(raw) is not str)
            or (headers is not None and not headers and type(headers) is not dict))


def _add(item: dict[str, Any], ts: Any, topic: Any, partition: int, pos: int,
         splits: _Splits, out: _Blocks, line: str | bytes) -> None:
    ts = record_time(ts)  # partition time moves on the times the core decides on
    high = splits.high
    if high is None or ts > high:
        high = splits.high = ts
    group = out.groups.get((topic, partition))
    if group is None:
        group = out.groups[(topic, partition)] = []
    # The record goes on as its JSON text: ingress decodes it once more (as fast as
    # unmarshalling the decoded dict), and the text costs nothing to encode.
    if type(line) is not bytes:
        line = line.encode("utf-8", "surrogatepass")
    group.append((pos, high, line))
    if "value" not in item and "raw" not in item:
        # A redelivery that leaves its value out: the stages after this one keep the
        # value of that offset (and no other), since the line that had it comes earlier.
        offset = item.get("offset")
        if type(offset) is int:
            out.wanted.setdefault((topic, partition), []).append(offset)


class _ReadBatches:
    """A read stage over Arrow batches of its input rows (mapInArrow's function)."""

    def __init__(self, ranks: dict[str, int]) -> None:
        self.ranks = ranks

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Parse every record for routing; a later stage gets the record as a line."""
        with paused_gc():
            yield from self._run(batches)

    def _run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError


class ReadLines(_ReadBatches):
    """The read stage over JSON-lines files (value, file path, split start)."""

    def _run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        splits = _Splits(self.ranks, "line")
        out = _Blocks()
        for batch in batches:
            lines = batch.column(0).to_pylist()
            files = batch.column(1).to_pylist()
            starts = batch.column(2).to_pylist()
            for line, file, start in zip(lines, files, starts, strict=True):
                if start != splits.start or file != splits.file:
                    splits.enter(file, start, start, out)
                _read_line(line, splits, out)
            out.close_block()
            yield from out.emit()
        splits.close(out)
        yield from out.emit()


def _read_line(line: str | bytes, splits: _Splits, out: _Blocks) -> None:
    """Number one line of the current split, parse it, and route it (or report it)."""
    pos = splits.base + splits.row
    splits.row += 1
    if out.block is None:
        out.block = pos
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        if not line.strip():
            return  # blank lines are skipped, as replay skips them
        text = line if isinstance(line, str) else line.decode("utf-8", "replace")
        out.malformed.append((pos, splits.where(), f"not a JSON line: {exc}", text))
        return
    _route(item, pos, splits, out, line)


# Lines of a split handled as one block by the local reader (as an Arrow batch would be).
BLOCK_LINES = 10_000
# Bytes read from a file at a time by the local reader.
READ_BYTES = 8 << 20


class ReadLocalLines:
    """The read stage over JSON-lines files on the local disk, read by the task itself.

    With a local master, the task opens the file and reads its split: Spark's text reader
    would read the lines in the JVM and hand them over through Arrow, which cost more CPU
    than parsing them.  A split takes the lines that start in its byte range (a line
    starts at the beginning of the file or after a newline), so every line belongs to
    exactly one split; lines end at LF, CR LF or CR, as in Hadoop's line reader.  Input
    rows: the index of one task in `tasks`, each a list of splits (archive path, local
    path, start, end).
    """

    def __init__(self, ranks: dict[str, int],
                 tasks: list[list[tuple[str, str, int, int]]]) -> None:
        self.ranks = ranks
        self.tasks = tasks

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Read, parse and route the lines of this task's splits."""
        with paused_gc():
            for batch in batches:
                for task in batch.column(0).to_pylist():
                    yield from self._run(self.tasks[task])

    def _run(self, task: list[tuple[str, str, int, int]]) -> Iterator[pa.RecordBatch]:
        splits = _Splits(self.ranks, "line")
        out = _Blocks()
        for file, path, start, end in task:
            splits.enter(file, start, start, out)
            for lines in _split_lines(path, start, end):
                for line in lines:
                    _read_line(line, splits, out)
                out.close_block()
                yield from out.emit()
        splits.close(out)
        yield from out.emit()


def _split_lines(path: str, start: int, end: int) -> Iterator[list[bytes]]:
    """The lines that start in [start, end) of a file, BLOCK_LINES at most at a time."""
    with open(path, "rb") as handle:
        if start > 0:
            handle.seek(start - 1)
            handle.readline()  # the rest of the line that starts before this split
        position = handle.tell()
        rest = b""
        pending: list[bytes] = []
        while position < end:
            data = handle.read(min(READ_BYTES, end - position))
            if not data:
                break
            position += len(data)
            if position >= end and not data.endswith(b"\n"):
                data += handle.readline()  # the last line goes on past the split
            data = rest + data
            cut = data.rfind(b"\n") + 1
            if position < end and cut:
                data, rest = data[:cut], data[cut:]
            elif position < end:
                rest = data
                continue
            else:
                rest = b""
            pending.extend(data.splitlines())
            while len(pending) >= BLOCK_LINES:
                yield pending[:BLOCK_LINES]
                del pending[:BLOCK_LINES]
        pending.extend(rest.splitlines())
        if pending:
            yield pending


class ReadParquet(_ReadBatches):
    """The read stage over Parquet files with the record columns.

    Rows become the same records a JSON line would give.
    """

    def __init__(self, ranks: dict[str, int], columns: tuple[str, ...]) -> None:
        super().__init__(ranks)
        self.columns = columns

    def _run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        splits = _Splits(self.ranks, "row")
        out = _Blocks()
        names = self.columns
        for batch in batches:
            values = {name: _column(batch.column(i)) for i, name in enumerate(names)}
            files = batch.column(len(names)).to_pylist()
            starts = batch.column(len(names) + 1).to_pylist()
            rows = batch.column(len(names) + 2).to_pylist()
            for i, (file, start, row) in enumerate(zip(files, starts, rows, strict=True)):
                if start != splits.start or file != splits.file:
                    splits.enter(file, start, row, out)
                pos = splits.rank_base + row
                splits.row = row + 1
                if out.block is None:
                    out.block = pos
                item = {name: column[i] for name, column in values.items()
                        if column[i] is not None}
                _parquet_item(item)
                _route(item, pos, splits, out, orjson.dumps(item, default=str))
            out.close_block()
            yield from out.emit()
        splits.close(out)
        yield from out.emit()


def _column(array: pa.Array) -> list[Any]:
    if pa.types.is_timestamp(array.type):
        micros = pc.cast(pc.cast(array, pa.timestamp("us")), pa.int64())
        return [None if v is None else v / 1e6 for v in micros.to_pylist()]
    return array.to_pylist()  # type: ignore[no-any-return]


def _parquet_item(item: dict[str, Any]) -> None:
    # Parquet cannot hold "any JSON": `value` is the JSON text (or bytes) of the value,
    # which is what `raw` means in a JSON line; headers are a map or a JSON object text.
    value = item.pop("value", None)
    if value is not None:
        item["raw"] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    elif isinstance(item.get("raw"), bytes):
        item["raw"] = item["raw"].decode("utf-8", "replace")
    headers = item.get("headers")
    if isinstance(headers, list):
        item["headers"] = dict(headers)
    elif isinstance(headers, str):
        try:
            item["headers"] = orjson.loads(headers)
        except orjson.JSONDecodeError:
            pass  # left as text: the ingress stage reports it as a malformed record


def read_records(spark: Any, archive: Archive) -> Any:
    """The read stage: a DataFrame of READ_SCHEMA rows over every file of the archive."""
    ranks = archive.ranks()
    frames = []
    local = {file: path for file in archive.json_files
             if (path := local_path(spark, file)) is not None}
    if local:
        tasks = local_splits(spark, local)
        frames.append(spark.range(0, len(tasks), 1, len(tasks))
                      .mapInArrow(ReadLocalLines(ranks, tasks), READ_DDL))
    others = [file for file in archive.json_files if file not in local]
    if others:
        lines = spark.read.text(others).select(
            "value", "_metadata.file_path", "_metadata.file_block_start"
        )
        frames.append(lines.mapInArrow(ReadLines(ranks), READ_DDL))
    if archive.parquet_files:
        table = spark.read.option("mergeSchema", "true").parquet(*archive.parquet_files)
        present = [c for c in PARQUET_COLUMNS if c in table.columns]
        if "ts" not in present or "topic" not in present:
            raise ArchiveError(f"{archive.root}: Parquet files need at least the columns "
                               f"'ts' and 'topic' (found {table.columns})")
        frames.append(table.select(*present, "_metadata.file_path",
                                   "_metadata.file_block_start", "_metadata.row_index")
                      .mapInArrow(ReadParquet(ranks, tuple(present)), READ_DDL))
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    return frame
