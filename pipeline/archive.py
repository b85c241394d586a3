"""Archives of records: which files, in what order, and the read stage.

An archive is a file or a folder (local or any Hadoop file system: hdfs://, s3a://,
gs://, abfs://) of JSON-lines files in the scenario record format and Parquet files with
the same columns.  Files are taken in path order, records in file order: that order is
the archive's "file order", the order `onceflow replay` would read the concatenation in.

The read stage itself (`read_records`) is in `read_stage.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from onceflow.errors import OnceflowError

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSION_SUFFIXES = ("", ".gz", ".bz2", ".zst", ".lz4", ".snappy", ".deflate")
PARQUET_SUFFIXES = (".parquet", ".parq")
PARQUET_COLUMNS = ("ts", "topic", "partition", "offset", "key", "headers", "value", "raw")
RANK_SHIFT = 40
# How many bytes of JSON lines a byte of a compressed or Parquet file holds, roughly (for
# sizing tasks, never for results).
COMPRESSED_RATIO = 4


class ArchiveError(OnceflowError):
    """The archive cannot be read as a whole (missing, empty, unreadable)."""


@dataclass(frozen=True, slots=True)
class Archive:
    """The files of an archive in file order, by format."""

    root: str
    files: tuple[str, ...]
    sizes: tuple[int, ...] = ()  # each file's length in bytes, when listed

    def input_bytes(self) -> int | None:
        """About how many bytes of JSON lines the archive holds (None: not known).

        A compressed or Parquet file counts COMPRESSED_RATIO times its length.
        """
        if len(self.sizes) != len(self.files):
            return None
        return sum(size * (1 if _is_plain_json(name) else COMPRESSED_RATIO)
                   for name, size in zip(self.files, self.sizes, strict=True))

    @property
    def json_files(self) -> list[str]:
        """The JSON-lines files."""
        return [f for f in self.files if not _is_parquet(f)]

    @property
    def parquet_files(self) -> list[str]:
        """The Parquet files."""
        return [f for f in self.files if _is_parquet(f)]

    def ranks(self) -> dict[str, int]:
        """Each file's place in file order, keyed by its normalized path."""
        return {normalize_path(f): rank for rank, f in enumerate(self.files)}


def estimate_records(archive: Archive) -> int | None:
    """How many input records an archive on this machine holds (None: not all local).

    Lines of JSON-lines files (blank ones included, so an upper bound), rows in the
    footers of Parquet files.  Cheap next to a replay: for progress lines, not results.
    """
    import pyarrow.parquet as pq

    total = 0
    for name in archive.files:
        if name.startswith("file:"):
            path = unquote(urlsplit(name).path)
        elif "://" in name:
            return None
        else:
            path = name
        if not os.path.isfile(path):
            return None
        if _is_parquet(name):
            total += pq.ParquetFile(path).metadata.num_rows
            continue
        last = b"\n"
        with open(path, "rb") as source:
            while chunk := source.read(1 << 22):
                total += chunk.count(b"\n")
                last = chunk[-1:]
        if last != b"\n":
            total += 1
    return total


def _is_plain_json(path: str) -> bool:
    return path.lower().endswith(JSON_SUFFIXES)


def _is_parquet(path: str) -> bool:
    return path.lower().endswith(PARQUET_SUFFIXES)


def _is_record_file(name: str) -> bool:
    lower = name.lower()
    if lower.startswith((".", "_")):
        return False
    if lower.endswith(PARQUET_SUFFIXES):
        return True
    return any(lower.endswith(s + c) for s in JSON_SUFFIXES for c in COMPRESSION_SUFFIXES)


def normalize_path(path: str) -> str:
    """One spelling per file: percent-decoding and `file:///` as `file:/`."""
    path = unquote(path)
    if path.startswith("file:///"):
        path = "file:/" + path[len("file:///"):]
    return path


def list_archive(spark: Any, path: str) -> Archive:
    """The record files under `path`, sorted by path (through Hadoop's file systems).

    A scenario folder (triggers.toml beside input.jsonl) contributes its input.jsonl only.
    """
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    root = jvm.org.apache.hadoop.fs.Path(path)
    fs = root.getFileSystem(conf)
    if not fs.exists(root):
        raise ArchiveError(f"{path}: no such file or folder")
    status = fs.getFileStatus(root)
    if status.isFile():
        return Archive(path, (fs.makeQualified(root).toString(),), (int(status.getLen()),))
    scenario_input = jvm.org.apache.hadoop.fs.Path(root, "input.jsonl")
    if fs.exists(jvm.org.apache.hadoop.fs.Path(root, "triggers.toml")) and fs.exists(
        scenario_input
    ):
        return Archive(path, (fs.makeQualified(scenario_input).toString(),),
                       (int(fs.getFileStatus(scenario_input).getLen()),))
    found = []
    entries = fs.listFiles(root, True)
    while entries.hasNext():
        entry = entries.next()
        file_path = entry.getPath()
        relative = file_path.toString()[len(fs.makeQualified(root).toString()):]
        if any(part.startswith((".", "_")) for part in relative.split("/") if part):
            continue
        if _is_record_file(file_path.getName()):
            found.append((file_path.toString(), int(entry.getLen())))
    if not found:
        raise ArchiveError(
            f"{path}: no record files (expected *.jsonl, *.json, *.ndjson, optionally "
            f"compressed, or *.parquet)"
        )
    found.sort()
    return Archive(path, tuple(f for f, _ in found), tuple(size for _, size in found))


def direct_io(spark: Any) -> bool:
    """Whether the tasks read and write local files themselves, not through Spark.

    Only with a local master, where the tasks run on this machine; the setting
    `spark.onceflow.direct=false` turns it off (everything through Spark's own readers
    and writers, as on a cluster).
    """
    if not str(spark.sparkContext.master).startswith("local"):
        return False
    return str(spark.conf.get("spark.onceflow.direct", "true")).lower() != "false"


def local_path(spark: Any, file: str) -> str | None:
    """The path of an uncompressed JSON-lines file that the tasks can open themselves.

    Only with a local master (the tasks run on this machine) and a `file:` path, unless
    `spark.onceflow.direct` is false.
    """
    if not direct_io(spark):
        return None
    if not file.startswith("file:") or not file.lower().endswith(JSON_SUFFIXES):
        return None
    path = urlsplit(file).path
    return unquote(path) if os.path.isfile(unquote(path)) else None


def local_splits(spark: Any, files: dict[str, str]) -> list[list[tuple[str, str, int, int]]]:
    """Splits of local files packed into tasks as Spark packs a file scan's splits.

    Split size: spark.sql.files.maxPartitionBytes, but no more than a fair share of the
    bytes per core; a file costs spark.sql.files.openCostInBytes more.
    """
    conf = spark._jsparkSession.sessionState().conf()
    max_bytes, open_cost = int(conf.filesMaxPartitionBytes()), int(conf.filesOpenCostInBytes())
    sizes = {file: os.path.getsize(path) for file, path in files.items()}
    parallelism = int(spark.sparkContext.defaultParallelism)
    per_core = sum(size + open_cost for size in sizes.values()) // max(1, parallelism)
    split_bytes = max(1, min(max_bytes, max(open_cost, per_core)))
    splits = [(file, path, start, min(start + split_bytes, sizes[file]))
              for file, path in files.items()
              for start in range(0, max(1, sizes[file]), split_bytes)]
    splits.sort(key=lambda split: split[3] - split[2], reverse=True)
    tasks: list[list[tuple[str, str, int, int]]] = []
    current: list[tuple[str, str, int, int]] = []
    current_bytes = 0
    for split in splits:
        if current and current_bytes + split[3] - split[2] > split_bytes:
            tasks.append(current)
            current, current_bytes = [], 0
        current.append(split)
        current_bytes += split[3] - split[2] + open_cost
    if current:
        tasks.append(current)
    return tasks
