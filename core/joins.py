"""Join conditions (seed 003): All (AND) and Only one (XOR), per activation.

Each condition is a small state machine over a plain, JSON-able state value:
`on_document(state, doc) -> (state, step)`, `deadline(state)`, `on_timeout(state)`.
A JoinBook keeps the states of one trigger in a store, with an in-memory index of
deadlines that a restart rebuilds from the store.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from .envelope import Document, delivered_offset, iso_time, record_time
from .store import Store
from .triggers import ALL, ONLY_ONE, TriggerDef
from .values import clip

PENDING: Final = "pending"
DISCARDED: Final = "discarded"
COMPLETE: Final = "complete"
# The document would make the join's stored state larger than the runner can keep.
REFUSED: Final = "refused"
# A runner's limit on what one activation's join may store: None when `state` fits,
# else how it is too large ("is N bytes, more than ...").
JoinFits = Callable[[str, Any], str | None]


def _same(value: Any) -> Any:
    return value


class JoinDocument(dict[str, Any]):
    """What a join trigger's service receives: {"activation", "documents": {type: envelope}}."""


def join_document(activation: str | None, members: list[Document]) -> JoinDocument:
    """The join document of completed members, in arrival order."""
    return JoinDocument(
        activation=activation,
        documents={member.type: member.envelope for member in members},
    )


@dataclass(init=False, slots=True)
class JoinStep:
    """What a document did to its join."""

    kind: str
    members: list[Document]
    previous: Any  # the state before this document, restored on suspension
    reason: str

    # Written out, not generated: compiled, a dataclass __init__ stays interpreted.
    def __init__(self, kind: str, members: list[Document] | None = None,
                 previous: Any = None, reason: str = "") -> None:
        self.kind = kind
        self.members = [] if members is None else members
        self.previous = previous
        self.reason = reason


class AllJoin:
    """All (AND): run once an instance of every type with one activation has arrived."""

    # Members wait in the open join until every type has arrived.
    holds_members = True

    def __init__(self, types: frozenset[str], timeout: int | None,
                 serialize: bool = True) -> None:
        self.types = types
        self.timeout = timeout
        # Pending members are kept as JSON-able dicts for changelogged stores; a store
        # that lives only in memory (replay, a Spark group) keeps the objects themselves.
        self._encode: Callable[[Document], Any] = Document.to_json if serialize else _same
        self._decode: Callable[[Any], Document] = Document.from_json if serialize else _same

    def on_document(self, state: Any, doc: Document) -> tuple[Any, JoinStep]:
        """Add the document; COMPLETE gives every member and a state of None."""
        if state is None:
            deadline = None if self.timeout is None else doc.ts + self.timeout
            members: dict[str, Any] = {}
        else:
            deadline = state["deadline"]
            members = state["members"]
            if doc.type in members:
                held = members[doc.type]
                identity = held.identity if isinstance(held, Document) else held["identity"]
                return state, JoinStep(
                    DISCARDED,
                    reason=f"a {doc.type!r} document ({identity}) is already waiting "
                    f"in the open join",
                )
        if len(members) + 1 == len(self.types):
            decode = self._decode
            complete = [decode(m) for m in members.values()]
            complete.append(doc)
            return None, JoinStep(COMPLETE, complete, previous=state)
        members = dict(members)
        members[doc.type] = self._encode(doc)
        return {"deadline": deadline, "members": members}, JoinStep(PENDING, previous=state)

    @staticmethod
    def waiting(state: Any, doc: Document) -> bool:
        """Whether doc is a redelivery of the member of its type waiting in the open join.

        Only the same record is: the same (topic, partition, offset), or a live replay's
        verified stand-in for it.  Headers never make a record a redelivery: a re-sent
        copy is a second instance of its type.
        """
        if state is None:
            return False
        held = state["members"].get(doc.type)
        if held is None:
            return False
        return member_coordinates(held) == (doc.topic, doc.partition, doc.delivered_offset)

    @staticmethod
    def deadline(state: Any) -> int | None:
        """When the open join expires, in ms (None: never): it accepts a document at it."""
        return state["deadline"] if state is not None else None

    def on_timeout(self, state: Any) -> list[Document]:
        """The pending documents dropped by the time-out."""
        return [self._decode(m) for m in state["members"].values()]


def member_coordinates(held: Any) -> tuple[str, int, int]:
    """(topic, partition, delivered offset) of a member as join state holds it."""
    if isinstance(held, Document):
        return held.topic, held.partition, held.delivered_offset
    return (held["topic"], held["partition"],
            delivered_offset(held["offset"], held.get("redelivers")))


class OnlyOneJoin:
    """Only one (XOR): the first document runs; others are discarded until the time-out."""

    # A window keeps no member waiting (its first document ran): nothing is ever waiting.
    holds_members = False

    def __init__(self, timeout: int | None) -> None:
        self.timeout = timeout

    def on_document(self, state: Any, doc: Document) -> tuple[Any, JoinStep]:
        """Open a window and run, or discard inside an open window."""
        if state is not None:
            deadline = state["deadline"]
            until = ("until the window closes, which it never does: join_timeout is none"
                     if deadline is None else f"open until {iso_time(deadline)} (record time)")
            return state, JoinStep(
                DISCARDED,
                reason=f"{state['identity']} already ran for this activation in the window "
                f"{until}",
            )
        deadline = None if self.timeout is None else doc.ts + self.timeout
        return {"deadline": deadline, "identity": doc.identity}, JoinStep(
            COMPLETE, [doc], previous=None
        )

    @staticmethod
    def waiting(state: Any, doc: Document) -> bool:
        """A window holds no document waiting: its first one ran."""
        return False

    @staticmethod
    def deadline(state: Any) -> int | None:
        """When the window closes, in ms (None: never): it still discards at it."""
        return state["deadline"] if state is not None else None

    @staticmethod
    def on_timeout(state: Any) -> list[Document]:
        """A closing window drops no document."""
        return []


# Join state keeps, beside an activation's open join, the members that its expired joins
# dropped ("gone": {"until": the latest of their times, "coords": [[topic, partition,
# offset, until], ...]}), so that a redelivery of one of them is journaled join-expired
# again and opens no join (spec section 4).  Each is kept until its join's deadline plus
# the trigger's history_ttl (a redelivery with a later record time is a new document), at
# most MAX_GONE members per activation (the oldest go first).
GONE: Final = "gone"
MAX_GONE: Final = 64


def open_join(stored: Any) -> Any:
    """The open join (or window) of a value a join store holds (None: none is open)."""
    return _open_part(stored)


def _open_part(stored: Any) -> Any:
    """The open join (or window) of a stored value, without its expired members."""
    if stored is None or GONE not in stored:
        return stored
    if len(stored) == 1:
        return None
    state = dict(stored)
    del state[GONE]
    return state


def _with_gone(state: Any, gone: Any) -> Any:
    """The stored value of an open join (or None) and expired members (or None)."""
    if gone is None:
        return state
    if state is None:
        return {GONE: gone}
    return {**state, GONE: gone}


def current_state(state: Any) -> Any:
    """A stored join state in this version's terms: its deadline in whole milliseconds.

    States written before time was kept in milliseconds hold the deadline in seconds, a
    float (record times then were Kafka's milliseconds divided by 1000, so never an int);
    their members carry "ts" in seconds, which Document.from_json reads.
    """
    if state is not None and type(state.get("deadline")) is float:
        state = dict(state)
        state["deadline"] = record_time(state["deadline"])
    return state


class _CurrentStates:
    """A changelogged join store read through current_state (writes go straight on)."""

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    def get(self, key: Any, default: Any = None, /) -> Any:
        value = self._store.get(key)
        return default if value is None else current_state(value)

    def __getitem__(self, key: Any) -> Any:
        value = self._store.get(key)
        if value is None:
            raise KeyError(key)
        return current_state(value)

    def __setitem__(self, key: Any, value: Any, /) -> None:
        self._store[key] = value

    def __delitem__(self, key: Any, /) -> None:
        del self._store[key]

    def __contains__(self, key: object, /) -> bool:
        return key in self._store

    def keys(self) -> Any:
        return self._store.keys()

    def items(self) -> Any:
        return [(key, current_state(value)) for key, value in self._store.items()]

    def values(self) -> Any:
        return [current_state(value) for value in self._store.values()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)


class JoinBook:
    """The open joins of one trigger, keyed by activation, with a deadline index."""

    def __init__(self, trigger: TriggerDef, store: Store, *, serialize: bool = True,
                 fits: JoinFits | None = None) -> None:
        """`fits`: the runner's limit on one activation's stored state (None: no limit)."""
        self.trigger = trigger
        self.fits = fits
        # Only a changelogged store can hold states an earlier version wrote.
        self.store: Store = _CurrentStates(store) if serialize else store
        self.condition: AllJoin | OnlyOneJoin
        if trigger.kind == ALL:
            self.condition = AllJoin(trigger.join_types, trigger.join_timeout, serialize)
        elif trigger.kind == ONLY_ONE:
            self.condition = OnlyOneJoin(trigger.join_timeout)
        else:
            raise ValueError(f"trigger {trigger.name!r} has no join condition")
        self.keep_expired = trigger.history_ttl
        # The heap of (time in ms, activation): each open join's deadline, or when the
        # expired members an activation remembers are forgotten; runners may peek at
        # deadlines[0].
        self.deadlines: list[tuple[int, str]] = []
        self.rebuild_index()

    def _wake(self, stored: Any) -> int | None:
        """When a stored value next changes with time (None: never)."""
        deadline = self.condition.deadline(_open_part(stored))
        gone = stored.get(GONE) if stored is not None else None
        if gone is None:
            return deadline
        until: int = gone["until"]
        return until if deadline is None or until < deadline else deadline

    def rebuild_index(self) -> None:
        """Rebuild the deadline index from the store (after a restart or rebalance)."""
        entries = []
        for activation, stored in self.store.items():
            wake = self._wake(stored)
            if wake is not None:
                entries.append((wake, activation))
        self.deadlines[:] = entries  # in place: runners hold a reference to the list
        heapq.heapify(self.deadlines)

    def on_document(self, doc: Document) -> JoinStep:
        """Feed a New document of this trigger into the join of its activation."""
        activation = doc.activation
        assert activation is not None
        stored = self.store.get(activation)
        state = _open_part(stored)
        new_state, step = self.condition.on_document(state, doc)
        step.previous = stored
        if step.kind == DISCARDED:
            return step
        new_stored = _with_gone(new_state, stored.get(GONE) if stored is not None else None)
        if step.kind == PENDING and self.fits is not None:
            # Refused before anything changes: the join stays as it was.
            why = self.fits(activation, new_stored)
            if why is not None:
                return JoinStep(REFUSED, previous=stored, reason=(
                    f"the open join of activation {clip(activation)!r} with this "
                    f"document {why}"))
        self._put(activation, stored, new_stored)
        return step

    def _put(self, activation: str, stored: Any, new_stored: Any) -> None:
        """Store an activation's new value (None: remove it) and index when it wakes."""
        if new_stored is None:
            if stored is not None:
                del self.store[activation]
            return
        self.store[activation] = new_stored
        wake = self._wake(new_stored)
        if wake is not None and (stored is None or wake != self._wake(stored)):
            heapq.heappush(self.deadlines, (wake, activation))

    def waiting(self, doc: Document) -> bool:
        """Whether doc is a redelivery of a document waiting in its activation's open join.

        Such a delivery is the same input record: it neither joins nor is discarded, and
        its outcome is the one the waiting member gets when the join ends.
        """
        condition = self.condition
        if doc.activation is None or not condition.holds_members:
            return False
        return condition.waiting(_open_part(self.store.get(doc.activation)), doc)

    def expired(self, doc: Document) -> bool:
        """Whether doc is a redelivery of a member an expired join of its activation dropped."""
        if doc.activation is None:
            return False
        stored = self.store.get(doc.activation)
        gone = stored.get(GONE) if stored is not None else None
        if gone is None or doc.ts > gone["until"]:
            return False
        where = [doc.topic, doc.partition, doc.delivered_offset]
        return any(list(coords[:3]) == where and doc.ts <= coords[3]
                   for coords in gone["coords"])

    def members(self, activation: str) -> list[Document]:
        """The documents waiting in one activation's open join (none for a window)."""
        state = _open_part(self.store.get(activation))
        if state is None or "members" not in state:
            return []
        return self.condition.on_timeout(state)

    def drop_members(self, activation: str, types: set[str]) -> None:
        """Remove the waiting members of these types (the join is closed when none stay)."""
        stored = self.store.get(activation)
        state = _open_part(stored)
        if state is None or "members" not in state:
            return
        members = {t: m for t, m in state["members"].items() if t not in types}
        new_state = {"deadline": state["deadline"], "members": members} if members else None
        self._put(activation, stored, _with_gone(new_state, stored.get(GONE)))

    def restore(self, activation: str, previous: Any) -> None:
        """Undo a document's effect on its join (the run was suspended)."""
        stored = self.store.get(activation)
        if previous is None:
            if stored is not None:
                del self.store[activation]
        else:
            self.store[activation] = previous
            wake = self._wake(previous)
            if wake is not None:
                heapq.heappush(self.deadlines, (wake, activation))

    def next_deadline(self) -> int | None:
        """The earliest deadline in the index (may be stale)."""
        return self.deadlines[0][0] if self.deadlines else None

    def expire(self, now: int) -> list[tuple[str, list[Document]]]:
        """Close every join whose deadline has passed (deadline < now).

        Also forgets the expired members an activation remembers once their time is past.
        """
        expired: list[tuple[str, list[Document]]] = []
        heap = self.deadlines
        condition = self.condition
        while heap and heap[0][0] < now:
            wake, activation = heapq.heappop(heap)
            stored = self.store.get(activation)
            if stored is None or self._wake(stored) != wake:
                continue  # completed or replaced since it was indexed
            state = _open_part(stored)
            gone = stored.get(GONE)
            dropped: list[Document] = []
            deadline = condition.deadline(state)
            if deadline is not None and deadline < now:
                dropped = condition.on_timeout(state)
                state = None
                if dropped:
                    until = deadline + self.keep_expired
                    kept = gone["coords"] if gone is not None else []
                    added: list[list[Any]] = [[*member_coordinates(doc), until]
                                              for doc in dropped]
                    gone = {"until": until, "coords": (list(kept) + added)[-MAX_GONE:]}
            if gone is not None:
                live: list[list[Any]] = [c for c in gone["coords"] if c[3] >= now]
                if not live:
                    gone = None
                elif len(live) < len(gone["coords"]):
                    latest: int = max(c[3] for c in live)
                    gone = {"until": latest, "coords": live}
            new_stored = _with_gone(state, gone)
            if new_stored is None:
                del self.store[activation]
            else:
                self.store[activation] = new_stored
                next_wake = self._wake(new_stored)
                if next_wake is not None:
                    heapq.heappush(heap, (next_wake, activation))
            if dropped:
                expired.append((activation, dropped))
        return expired

    def pending(self) -> list[Document]:
        """Every document waiting in an open join (for views, audits and tests)."""
        out: list[Document] = []
        for stored in self.store.values():
            state = _open_part(stored)
            if state is not None and "members" in state:
                out.extend(self.condition.on_timeout(state))
        return out

    def get(self, activation: str) -> Any:
        """The state of one activation's open join (for views); None when none is open."""
        return _open_part(self.store.get(activation))

    def __len__(self) -> int:
        """How many joins (or windows) are open; remembered expired members are not counted."""
        return sum(1 for stored in self.store.values() if _open_part(stored) is not None)
