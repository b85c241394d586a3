"""One partition of one table, as raw bytes: the local copy a worker reads and writes.

Two kinds serve the worker: `RocksPartition` over a Faust RocksDB store (the worker), and
`DictPartition` over a dict (agent tests, the in-process cluster).  Both store exactly the
bytes of the table's changelog records, so Faust's own recovery (which copies changelog
records into the store byte for byte) restores what onceflow wrote.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from onceflow.errors import OnceflowError

# Faust keeps the last changelog offset applied to a partition under this key, and starts
# recovery after it.
FAUST_OFFSET_KEY = b"__faust\0offset__"


class StorageError(OnceflowError):
    """The local store failed (a full disk, an I/O error): never a record's fault.

    The worker stops on it (agents/partition_worker.py, stops_the_worker); the message names the
    store's directory and the cause.
    """

    def __init__(self, path: str, cause: BaseException) -> None:
        super().__init__(f"the local store {path} failed: {cause}")
        self.path = path
        self.cause = cause


class RawPartition(Protocol):
    """Bytes in, bytes out, for one table partition."""

    def get(self, key: bytes) -> bytes | None:
        """The value under key, or None."""

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with prefix, in key order."""

    def apply(self, writes: Mapping[bytes, bytes | None], offset: int | None) -> None:
        """Write (None deletes) in one atomic batch, with the changelog offset they reach."""


class DictPartition:
    """A table partition in a dict."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.offset: int | None = None

    def get(self, key: bytes) -> bytes | None:
        """The value under key, or None."""
        return self.data.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) under prefix, in key order."""
        for key in sorted(k for k in self.data if k.startswith(prefix)):
            yield key, self.data[key]

    def apply(self, writes: Mapping[bytes, bytes | None], offset: int | None) -> None:
        """Write the batch."""
        for key, value in writes.items():
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        if offset is not None:
            self.offset = offset


class RocksPartition:
    """A partition of a Faust RocksDB-backed table (store='rocksdb://', raw keys and values).

    The database handle is asked of the Faust store on every call: Faust closes and
    reopens partition databases when partitions move, and a handle kept here would hold
    RocksDB's lock on a database this worker no longer owns.
    """

    def __init__(self, store: Any, partition: int) -> None:
        self._store = store
        self.partition = partition

    def _db(self) -> Any:
        return self._store._db_for_partition(self.partition)

    def _failed(self, exc: Exception) -> StorageError:
        """A failure of RocksDB (rocksdict raises plain Exceptions) as a StorageError."""
        if isinstance(exc, StorageError):
            return exc
        try:
            path = str(self._store.partition_path(self.partition))
        except Exception:  # noqa: BLE001 - the message names what it can
            path = f"of partition {self.partition}"
        return StorageError(path, exc)

    def get(self, key: bytes) -> bytes | None:
        """The value under key, or None."""
        try:
            value = self._db().get(key)
        except Exception as exc:
            raise self._failed(exc) from exc
        return None if value is None else bytes(value)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) under prefix, in key order."""
        try:
            for key, value in self._db().items(from_key=prefix):
                if not key.startswith(prefix):
                    break
                if key != FAUST_OFFSET_KEY:
                    yield bytes(key), bytes(value)
        except Exception as exc:
            raise self._failed(exc) from exc

    def apply(self, writes: Mapping[bytes, bytes | None], offset: int | None) -> None:
        """Write the batch and the changelog offset it reaches, atomically."""
        # Not installed where the wheel is built (setup.py type-checks this module).
        from rocksdict import WriteBatch  # type: ignore[import-not-found,unused-ignore]

        batch = WriteBatch(raw_mode=True)
        for key, value in writes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if offset is not None:
            batch.put(FAUST_OFFSET_KEY, str(offset).encode())
        try:
            self._db().write(batch)
        except Exception as exc:
            raise self._failed(exc) from exc
