"""The narrow state interface the core reads and writes through.

A plain dict satisfies it (replay, tests, Spark groups); so does a Faust table backed by
RocksDB (the worker).  Values are JSON-able (lists, dicts, strings, numbers) so that any
changelog serializer can carry them.  A caller that changes a value in place must put it
back, or a changelogged store never sees the change.

`MemoryState` is the dict-backed state of a partition: replay, tests, one Spark group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol


class Store(Protocol):
    """Mapping-like state: get, put, delete, and iteration for sweeps."""

    def get(self, key: Any, default: Any = None, /) -> Any:
        """The value under key, or default."""

    def __setitem__(self, key: Any, value: Any, /) -> None:
        """Store value under key."""

    def __delitem__(self, key: Any, /) -> None:
        """Remove key (KeyError when absent)."""

    def __contains__(self, key: object, /) -> bool:
        """Whether key is present."""

    def keys(self) -> Any:
        """Every key (for sweeps and index rebuilds)."""

    def items(self) -> Any:
        """Every (key, value) pair."""

    def values(self) -> Any:
        """Every value."""

    def __iter__(self) -> Iterator[Any]:
        """Iterate keys."""

    def __len__(self) -> int:
        """Number of entries."""


def keyed_dict() -> dict[str, Any]:
    """An empty dict whose table keeps each key's hash beside it.

    CPython gives a dict holding only str keys a compact table without hashes, so a lookup
    that misses must read every probed key object to compare hashes: in a store of a few
    hundred thousand keys each of those reads is a cache miss.  A dict that once held a
    non-str key keeps the general table (hash stored in the entry) through every resize,
    so the probe compares hashes in the table and touches a key only on a hash match.
    Semantics are those of any dict.
    """
    table: dict[Any, Any] = {0: None}
    del table[0]
    return table


class MemoryState:
    """Dict stores for every piece of state: replay, tests, one Spark group."""

    # Nothing here is written to a changelog, so state values may be plain objects.
    serialized = False

    def __init__(self) -> None:
        self.progress: dict[str, Any] = {}
        self.ids: dict[str, Any] = keyed_dict()
        self.volatile_ids: dict[str, Any] = keyed_dict()
        self.history: dict[str, dict[str, Any]] = {}
        self.joins: dict[str, dict[str, Any]] = {}

    def id_store(self, topic: str, persist: bool) -> Store:
        """Where a topic's duplicate-ID caches live."""
        return self.ids if persist else self.volatile_ids

    def history_store(self, trigger: str) -> Store:
        """A trigger's document history."""
        store = self.history.get(trigger)
        if store is None:
            store = self.history[trigger] = keyed_dict()
        return store

    def join_store(self, trigger: str) -> Store:
        """A trigger's open joins."""
        store = self.joins.get(trigger)
        if store is None:
            store = self.joins[trigger] = keyed_dict()
        return store
