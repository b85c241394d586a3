"""Document history (seed 004): processing and completed entries per (trigger, identity).

Both entries of a document share the start time, so they expire and are swept together;
one stored value holds both.  For join triggers the entry lives under the activation too,
because history follows the routing key (spec section 4).

Stored values carry a version, and only this module reads or writes them:
`[start_ms, flags, 3]` (version 3: the start time in whole milliseconds); versions 2
(`[start_seconds, flags, 2]`) and 1 (`[start_seconds, flags]`, written before values were
versioned) hold the start time in seconds and are still read, converted to milliseconds.
A value of any other shape (a newer version written by a newer worker, or damage) makes
the history unavailable for that document (`HistoryUnavailable`): it is never read as
something it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .envelope import Timestamp, record_time, seconds
from .errors import HistoryUnavailable
from .keys import key_part, pair_key
from .pickling import by_fields
from .store import Store
from .triggers import TriggerDef

PROCESSING: Final = 1
COMPLETED: Final = 2
FAILED: Final = 4
_FLAGS: Final = PROCESSING | COMPLETED | FAILED
VERSION: Final = 3  # the version of the stored values this module writes


def encode_entry(started: Timestamp, flags: int) -> list[Any]:
    """The stored value of an entry (the one encoder)."""
    return [started, flags, VERSION]


def decode_entry(value: Any) -> tuple[Timestamp, int]:
    """(started in ms, flags) of a stored value (the one decoder); HistoryUnavailable if unknown."""
    if isinstance(value, list | tuple):
        size = len(value)
        version = value[2] if size == 3 else 1 if size == 2 else None
        if version == VERSION or version in (1, 2):
            started, flags = value[0], value[1]
            if version == VERSION:
                if type(started) is int and type(flags) is int and 0 < flags <= _FLAGS:
                    return started, flags
            elif isinstance(started, int | float) and not isinstance(started, bool) and \
                    type(flags) is int and 0 < flags <= _FLAGS and started - started == 0:
                return record_time(started), flags  # seconds, as versions 1 and 2 kept it
    shown = repr(value)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    raise HistoryUnavailable(f"a stored history value this version cannot read: {shown} "
                             f"(versions 1 to {VERSION} are known)")


def history_key(identity: str, activation: str | None = None) -> str:
    """The store key of a join trigger's entries: state_key(activation, identity).

    Without an activation (an entry loaded for every activation): the identity as one
    part, which no (activation, identity) key can equal.  Triggers without joins key
    their entries by the identity itself.
    """
    return key_part(identity) if activation is None else pair_key(activation, identity)


def entry_key(by_activation: bool, identity: str, activation: str | None) -> str:
    """Where a trigger keeps a document's entries (`by_activation`: a join trigger)."""
    return history_key(identity, activation) if by_activation else identity


def state_keys(trigger: TriggerDef, identity: str,
               activation: str | None) -> tuple[str, str | None]:
    """(history key, join key) of a document of trigger: the one rule for every runner.

    A join trigger keeps a document's history under (activation, identity) and its open
    join under the activation; without an activation (bad input for a join, or a seed
    loaded for every activation) the history key is the identity as one key part, and
    there is no join state.  Any other trigger: the identity, and no join state.
    """
    if not trigger.routes_by_activation:
        return identity, None
    return history_key(identity, activation), activation


@dataclass(init=False, slots=True)
class HistoryEntry:
    """What the history knows of one document (a value: do not change it)."""

    started: Timestamp
    flags: int

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    # Written out, not generated: compiled, a dataclass __init__ stays interpreted.
    def __init__(self, started: Timestamp, flags: int) -> None:
        self.started = started
        self.flags = flags

    @property
    def processing(self) -> bool:
        """A processing entry exists."""
        return bool(self.flags & PROCESSING)

    @property
    def completed(self) -> bool:
        """A completed entry exists."""
        return bool(self.flags & COMPLETED)

    @property
    def failed(self) -> bool:
        """The run that completed ended in a service error."""
        return bool(self.flags & FAILED)

    @staticmethod
    def stored(value: Any) -> HistoryEntry:
        """The entry of a value a history store holds (see decode_entry)."""
        started, flags = decode_entry(value)
        return HistoryEntry(started, flags)

    def describe(self) -> dict[str, Any]:
        """A readable form for views and the CLI."""
        return {
            "started": seconds(self.started),
            "processing": self.processing,
            "completed": self.completed,
            "failed": self.failed,
        }


class History:
    """Entries of one trigger over a store, with the TTL applied on every lookup."""

    __slots__ = ("_store", "ttl")

    def __init__(self, store: Store, ttl: int) -> None:
        self._store = store
        self.ttl = ttl

    def lookup(self, key: str, now: Timestamp) -> HistoryEntry | None:
        """The live entry for key at record time `now`, in ms.

        An entry older than the TTL is ignored: one started at t with TTL d is seen up to
        t + d exactly, and not a millisecond later.
        """
        try:
            value = self._store.get(key)
        except Exception as exc:  # the store's own failure: history is unavailable
            raise HistoryUnavailable(f"document history cannot be read: {exc}", exc) from exc
        if value is None:
            return None
        entry = HistoryEntry.stored(value)
        if now - entry.started > self.ttl:
            return None
        return entry

    def entry(self, key: str) -> HistoryEntry | None:
        """The stored entry for key, whatever its age (None: no entry)."""
        value = self._store.get(key)
        return None if value is None else HistoryEntry.stored(value)

    def mark_processing(self, key: str, started: Timestamp) -> None:
        """Write the processing entry, immediately before the service runs."""
        self._put(key, encode_entry(started, PROCESSING))

    def mark_completed(self, key: str, started: Timestamp, failed: bool) -> None:
        """Add the completed entry (success or failure) beside the processing entry."""
        self._put(key, encode_entry(started, PROCESSING | COMPLETED | (FAILED if failed else 0)))

    def remove(self, key: str) -> None:
        """Drop both entries (a transient failure that ends in retry or suspension)."""
        try:
            if key in self._store:
                del self._store[key]
        except Exception as exc:
            raise HistoryUnavailable(f"document history cannot be written: {exc}", exc) from exc

    def seed(self, key: str, status: str, started: Timestamp, failed: bool = False) -> None:
        """Load an entry from outside (scenario history.jsonl, migrations)."""
        if status == "processing":
            added = PROCESSING
        elif status == "completed":
            added = COMPLETED | (FAILED if failed else 0)
        else:
            raise ValueError(f'history status must be "processing" or "completed", got {status!r}')
        value = self._store.get(key)
        flags = decode_entry(value)[1] if value is not None else 0
        self._put(key, encode_entry(started, flags | added))

    def expired_keys(self, now: Timestamp) -> list[str]:
        """Keys whose entries are older than the TTL at time `now`."""
        horizon = now - self.ttl
        return [key for key, value in self._store.items() if _started(value) < horizon]

    def sweep(self, now: Timestamp) -> int:
        """Remove every entry older than the TTL; both entries of a document go together."""
        keys = self.expired_keys(now)
        for key in keys:
            del self._store[key]
        return len(keys)

    def __len__(self) -> int:
        return len(self._store)

    def _put(self, key: str, value: list[Any]) -> None:
        try:
            self._store[key] = value
        except Exception as exc:
            raise HistoryUnavailable(f"document history cannot be written: {exc}", exc) from exc


def _started(value: Any) -> float:  # a float: inf for a value this version cannot read
    """The start time of a stored value (one this version cannot read never expires).

    Such a value is reported when its document comes; a sweep must not stop on it.
    """
    try:
        return decode_entry(value)[0]
    except HistoryUnavailable:
        return float("inf")
