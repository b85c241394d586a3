"""The core's Store interface over one table partition, with writes held until a flush.

A batch reads and writes through `PartitionStore` views; the writes stay in the
partition's `TableBuffer` (visible to every later read) until the worker flushes them:
first to the table's changelog topic, then, once the broker has acknowledged them, to the
local store.  So the local store never holds a value the changelog could lose, and one
flush makes a whole batch durable.

Keys are the core's strings under a prefix (a trigger name, a kind of entry); values are
JSON-able and stored as JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import orjson

from .raw_partition import RawPartition

_ABSENT: Final = object()


class StateCorrupt(Exception):
    """A stored state value that cannot be read: the worker must stop, not guess.

    The message names the table's changelog topic, the partition and the key.
    """


def _decode(buffer: TableBuffer, key: bytes, data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StateCorrupt(f"the stored value of key {key!r} in {buffer.topic} partition "
                           f"{buffer.partition} is not JSON ({exc})") from None


class TableBuffer:
    """The writes of one table partition since the last flush (None: deleted)."""

    __slots__ = ("raw", "topic", "partition", "writes")

    def __init__(self, raw: RawPartition, topic: str, partition: int) -> None:
        self.raw = raw
        self.topic = topic
        self.partition = partition
        self.writes: dict[bytes, Any] = {}

    def read(self, key: bytes) -> Any:
        """The current value under key (buffered or stored), or _ABSENT."""
        value = self.writes.get(key, _ABSENT)  # (no value written is _ABSENT)
        if value is not _ABSENT:
            return _ABSENT if value is None else value
        data = self.raw.get(key)
        return _ABSENT if data is None else _decode(self, key, data)

    def encoded(self) -> dict[bytes, bytes | None]:
        """The buffered writes as changelog bytes."""
        dumps = orjson.dumps
        return {key: None if value is None else dumps(value)
                for key, value in self.writes.items()}

    def applied(self, encoded: dict[bytes, bytes | None], offset: int | None) -> None:
        """The writes reached the changelog: store them locally and forget them."""
        self.raw.apply(encoded, offset)
        for key in encoded:
            self.writes.pop(key, None)


class UndoLog:
    """The values a run of takes overwrote, to put back if they must be rolled back."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[TableBuffer, bytes, Any]] = []

    def roll_back(self) -> None:
        """Put every overwritten value back, newest first."""
        entries = self.entries
        for index in range(len(entries) - 1, -1, -1):
            buffer, key, old = entries[index]
            buffer.writes[key] = None if old is _ABSENT else old
        self.entries.clear()


class PartitionStore:
    """A core `Store` over the keys of one table partition that start with a prefix."""

    __slots__ = ("buffer", "_prefix", "_prefix_len", "undo", "_last", "_last_raw")

    def __init__(self, buffer: TableBuffer, prefix: str) -> None:
        self.buffer = buffer
        self._prefix = prefix.encode()
        self._prefix_len = len(self._prefix)
        self.undo: UndoLog | None = None
        # The last key asked for and its bytes: a document's history key is looked up and
        # then written, and a partition's delivery progress read and written, for every
        # record, each time with the same key object.
        self._last: Any = _ABSENT  # (no key is)
        self._last_raw = b""

    def _key(self, key: Any) -> bytes:
        if key is self._last:
            return self._last_raw
        raw = self._prefix + (key if type(key) is str else str(key)).encode()
        self._last = key
        self._last_raw = raw
        return raw

    def get(self, key: Any, default: Any = None, /) -> Any:
        """The value under key, or default."""
        value = self.buffer.read(self._key(key))
        return default if value is _ABSENT else value

    def __getitem__(self, key: Any) -> Any:
        value = self.buffer.read(self._key(key))
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any, /) -> None:
        raw_key = self._key(key)
        if self.undo is not None:
            self.undo.entries.append((self.buffer, raw_key, self.buffer.read(raw_key)))
        self.buffer.writes[raw_key] = value

    def __delitem__(self, key: Any, /) -> None:
        raw_key = self._key(key)
        old = self.buffer.read(raw_key)
        if old is _ABSENT:
            raise KeyError(key)
        if self.undo is not None:
            self.undo.entries.append((self.buffer, raw_key, old))
        self.buffer.writes[raw_key] = None

    def __contains__(self, key: object, /) -> bool:
        return self.buffer.read(self._key(key)) is not _ABSENT

    def items(self) -> Iterator[tuple[str, Any]]:
        """Every (key, value) under the prefix: stored ones merged with buffered writes."""
        writes = self.buffer.writes
        prefix = self._prefix
        cut = self._prefix_len
        for raw_key, data in self.buffer.raw.scan(prefix):
            if raw_key not in writes:
                yield raw_key[cut:].decode(), _decode(self.buffer, raw_key, data)
        for raw_key, value in list(writes.items()):
            if value is not None and raw_key.startswith(prefix):
                yield raw_key[cut:].decode(), value

    def values(self) -> list[Any]:
        """Every value under the prefix."""
        return [value for _, value in self.items()]

    def keys(self) -> list[str]:
        """Every key under the prefix."""
        return [key for key, _ in self.items()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return sum(1 for _ in self.items())


async def flush_state(sender: Any, buffers: list[TableBuffer]) -> int:
    """Make every buffered write durable: changelog first, then the local store.

    Returns how many entries were written.  `sender` is a tables.outbox.Sender.
    """
    from .outbox import Outbox

    outbox = Outbox()
    encoded: list[tuple[TableBuffer, dict[bytes, bytes | None]]] = []
    for buffer in buffers:
        if buffer.writes:
            entries = buffer.encoded()
            outbox.add_entries(buffer.topic, buffer.partition, entries)
            encoded.append((buffer, entries))
    if not encoded:
        return 0
    offsets = await sender.send(outbox)
    for buffer, entries in encoded:
        buffer.applied(entries, offsets.get((buffer.topic, buffer.partition)))
    return outbox.count
