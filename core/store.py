"""The narrow state interface the core reads and writes through.

A plain dict satisfies it (replay, tests, Spark groups); so does a Faust table backed by
RocksDB (the worker).  Values are JSON-able (lists, dicts, strings, numbers) so that any
changelog serializer can carry them.  A caller that changes a value in place must put it
back, or a changelogged store never sees the change.
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
