"""Archives of records: which files, in what order, and the read stage.

An archive is a file or a folder (local or any Hadoop file system: hdfs://, s3a://,
gs://, abfs://) of JSON-lines files in the scenario record format and Parquet files with
the same columns.  Files are taken in path order, records in file order: that order is
the archive's "file order", the order `onceflow replay` would read the concatenation in.

The read stage itself is in `read_stage.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from onceflow.errors import OnceflowError

from .rows import READ_DDL

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSION_SUFFIXES = ("", ".gz", ".bz2", ".zst", ".lz4", ".snappy", ".deflate")
PARQUET_SUFFIXES = (".parquet", ".parq")
PARQUET_COLUMNS = ("ts", "topic", "partition", "offset", "key", "headers", "value", "raw")
RANK_SHIFT = 40


class ArchiveError(OnceflowError):
    """The archive cannot be read as a whole (missing, empty, unreadable)."""


@dataclass(frozen=True, slots=True)
class Archive:
    """The files of an archive in file order, by format."""

    root: str
    files: tuple[str, ...]

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
        return Archive(path, (fs.makeQualified(root).toString(),))
    scenario_input = jvm.org.apache.hadoop.fs.Path(root, "input.jsonl")
    if fs.exists(jvm.org.apache.hadoop.fs.Path(root, "triggers.toml")) and fs.exists(
        scenario_input
    ):
        return Archive(path, (fs.makeQualified(scenario_input).toString(),))
    found = []
    entries = fs.listFiles(root, True)
    while entries.hasNext():
        entry = entries.next()
        file_path = entry.getPath()
        relative = file_path.toString()[len(fs.makeQualified(root).toString()):]
        if any(part.startswith((".", "_")) for part in relative.split("/") if part):
            continue
        if _is_record_file(file_path.getName()):
            found.append(file_path.toString())
    if not found:
        raise ArchiveError(
            f"{path}: no record files (expected *.jsonl, *.json, *.ndjson, optionally "
            f"compressed, or *.parquet)"
        )
    return Archive(path, tuple(sorted(found)))


def read_records(spark: Any, archive: Archive) -> Any:
    """The read stage: a DataFrame of READ_SCHEMA rows over every file of the archive."""
    from .read_stage import ReadLines, ReadParquet

    ranks = archive.ranks()
    frames = []
    if archive.json_files:
        lines = spark.read.text(archive.json_files).select(
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
