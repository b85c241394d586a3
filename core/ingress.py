"""Ingress: duplicate-ID caches (HornetQ / Artemis), delivery counts, envelopes, routing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from . import journal as J
from .envelope import (
    H_DELIVERY_COUNT,
    H_DUP_ID,
    H_MESSAGE_ID,
    MAX_DELIVERY_COUNT,
    UNDEFINED_DELIVERY,
    BadEnvelope,
    Document,
    Record,
    check_envelope,
    envelope_fields,
    parse_delivery_count,
)
from .journal import JournalRecord
from .keys import dup_id_key, id_next_key, id_slot_key, partition_scope, redelivered_key
from .outputs import Output, rejection
from .store import Store
from .triggers import TriggerDef, TriggerSet
from .values import KEY_LENGTH, MAX_DEPTH, header_problem, nested_deeper_than

# The longest dup-id, activation and (of a record with a dup-id) message id ingress
# takes, in characters, in every runner.  They become state keys and values (the
# duplicate-ID cache, history keys of join triggers, open joins and only-one windows);
# bounded so, every such state record fits the worker's smallest record limit whatever
# the characters.  The identity needs no bound of its own: one longer than
# MAX_IDENTITY_LENGTH is never a history key.
MAX_KEY_LENGTH: Final = KEY_LENGTH


def activation_too_long(activation: str | None) -> str | None:
    """Why an activation cannot be a state key, or None."""
    if activation is not None and len(activation) > MAX_KEY_LENGTH:
        return (f"the activation is longer than {MAX_KEY_LENGTH} characters "
                f"({len(activation)}): it cannot key history entries or joins")
    return None


def keys_too_long(headers: dict[str, str] | None, value: Any) -> str | None:
    """Why ingress cannot store a record's keys (dup-id, message id, activation), or None.

    `headers` as the core reads them, `value` the decoded envelope (anything).
    """
    dup_id = headers.get(H_DUP_ID) if headers else None
    if dup_id is not None:
        if len(dup_id) > MAX_KEY_LENGTH:
            return (f"the dup-id is longer than {MAX_KEY_LENGTH} characters ({len(dup_id)}): "
                    f"the duplicate-ID cache cannot hold it")
        message_id = headers.get(H_MESSAGE_ID) if headers else None
        if message_id is not None and len(message_id) > MAX_KEY_LENGTH:
            return (f"the message-id of a record with a dup-id is longer than "
                    f"{MAX_KEY_LENGTH} characters ({len(message_id)}): the duplicate-ID "
                    f"cache cannot hold it")
    if type(value) is dict:
        activation = value.get("activation")
        if type(activation) is str:
            return activation_too_long(activation)
    return None


class IdCache:
    """A fixed-size circular cache of duplicate IDs for one topic-partition.

    With size n, the (n+1)th ID stored overwrites slot 0.  Each ID remembers the offset
    of the record that first carried it: the broker redelivering that same record is not
    a resend (Artemis checks IDs when a message is sent to an address, never when a queue
    redelivers it), so it passes on to the exactly-once check.  Any other record carrying
    a cached ID is dropped, whatever its headers say: a producer retry copies every
    header (`delivery-count` and `message-id` included), and a publisher can write any.
    A live replay's stand-in for a redelivery passes when its signed marker, checked by
    the runner, names that offset (Record.delivered_offset).

    Stored per ID: `[slot, message_id, offset]`.  An entry written by versions before
    0.9, `[slot, message_id]`, has no offset, so no record can be shown to be a
    redelivery of its first carrier: every record with that ID is dropped.
    """

    __slots__ = ("_store", "_scope", "size", "_next")

    def __init__(self, store: Store, scope: str, size: int) -> None:
        self._store = store
        self._scope = scope
        self.size = size
        self._next: int = store.get(id_next_key(scope)) or 0

    def seen(self, dup_id: str, message_id: str, offset: int) -> bool:
        """Record dup_id; True when another record already carried it (drop this one).

        `offset`: the offset the delivery is of (Record.delivered_offset).
        """
        store = self._store
        id_key = dup_id_key(self._scope, dup_id)
        first = store.get(id_key)
        if first is not None:
            return not (len(first) > 2 and first[2] == offset)
        slot = self._next
        slot_key = id_slot_key(self._scope, slot)
        evicted = store.get(slot_key)
        if evicted is not None:
            del store[dup_id_key(self._scope, evicted)]
        store[slot_key] = dup_id
        store[id_key] = [slot, message_id, offset]
        self._next = (slot + 1) % self.size
        store[id_next_key(self._scope)] = self._next
        return False

    def __contains__(self, dup_id: str) -> bool:
        return self._store.get(dup_id_key(self._scope, dup_id)) is not None

    def ids(self) -> list[str]:
        """The IDs held, oldest slot first (for views and tests)."""
        out = []
        for i in range(self.size):
            slot = (self._next + i) % self.size
            value = self._store.get(id_slot_key(self._scope, slot))
            if value is not None:
                out.append(value)
        return out


# How many redelivered offsets a partition's progress remembers with their counts.  Beyond
# it the lowest go: a redelivery of one of them counts 2 again (still a redelivery).
MAX_REDELIVERED_OFFSETS: Final = 4096


def combined_count(derived: int, header: str | None) -> int:
    """The delivery count max(D, H) of spec section 1.

    The header only raises a count; one that is not a plain count (1 to 2^31-1) is
    ignored, and makes the count undefined (-1) only when D is 1.
    """
    if header is None:
        return derived
    given = parse_delivery_count(header)
    if given == UNDEFINED_DELIVERY:
        return UNDEFINED_DELIVERY if derived == 1 else derived
    return given if given > derived else derived


def header_ignored(headers: dict[str, str] | None) -> str | None:
    """Why a record's `delivery-count` header was ignored, or None (absent or a count)."""
    header = headers.get(H_DELIVERY_COUNT) if headers else None
    if header is None or parse_delivery_count(header) != UNDEFINED_DELIVERY:
        return None
    shown = header if len(header) <= 40 else header[:40] + "..."
    return (f"header 'delivery-count' {shown!r} is not a count from 1 to "
            f"{MAX_DELIVERY_COUNT}: ignored")


class DeliveryCounter:
    """Delivery counts derived from per-partition progress (D), raised by the header (H).

    A record at or below the highest offset already started for its partition is a
    redelivery: count 1 + the number of earlier starts of that offset (2 the first
    time, 3 the next, ...); any other counts 1.  The store holds, per partition, that
    highest offset (key "<topic>/<partition>") and, for offsets started more than once
    only, how many times they were redelivered (key "<topic>/<partition>#again": a dict
    of offset text -> redeliveries, at most MAX_REDELIVERED_OFFSETS, the lowest evicted
    first).  A worker flushes this store durably before any service runs, so after a
    restart it knows which records it had started, and how often.
    """

    __slots__ = ("_store", "_scopes", "_max_again")

    def __init__(self, store: Store, max_redelivered: int = MAX_REDELIVERED_OFFSETS) -> None:
        self._store = store
        self._scopes: dict[str, dict[int, str]] = {}
        self._max_again = max_redelivered

    def count(self, record: Record) -> int:
        """The record's delivery count (-1 when undefined, see combined_count)."""
        derived = self.derive(record.topic, record.partition, record.offset,
                              record.delivered_offset)
        header = record.headers.get(H_DELIVERY_COUNT) if record.headers else None
        return combined_count(derived, header)

    def derive(self, topic: str, partition: int, offset: int,
               delivered: int | None = None) -> int:
        """D for a record at `offset`, a delivery of `delivered` (default: the same).

        Records the start: the next delivery of that offset counts one more.
        """
        scope = self._scope(topic, partition)
        store = self._store
        highest = store.get(scope)
        if delivered is None:
            delivered = offset
        if highest is None or offset > highest:
            store[scope] = offset
            if delivered == offset:
                return 1
            highest = offset
        if delivered > highest:  # cannot be (delivered <= offset), but never count it
            return 1
        again_key = redelivered_key(scope)
        stored = store.get(again_key)
        again: dict[str, int] = dict(stored) if stored else {}
        name = str(delivered)
        before = again.get(name, 0)
        again[name] = before + 1
        if len(again) > self._max_again:
            keep = sorted(again, key=int)[-self._max_again:]
            again = {k: again[k] for k in keep}
        store[again_key] = again
        count = 2 + before
        return count if count < MAX_DELIVERY_COUNT else MAX_DELIVERY_COUNT

    def routed(self, topic: str, partition: int, offset: int, carried: int) -> int:
        """The count of a routed document read at `offset` of the repartition topic.

        It keeps the count it was routed with (`carried`); each redelivery of its route
        record adds one (an undefined count becomes the route topic's).
        """
        derived = self.derive(topic, partition, offset)
        if derived == 1:
            return carried
        if carried < 1:
            return derived
        total = carried + derived - 1
        return total if total < MAX_DELIVERY_COUNT else MAX_DELIVERY_COUNT

    def highest(self, topic: str, partition: int) -> int | None:
        """The highest offset started on a partition, if any."""
        value = self._store.get(self._scope(topic, partition))
        return None if value is None else int(value)

    def _scope(self, topic: str, partition: int) -> str:
        """The store key of a topic partition, "<topic>/<partition>", made once."""
        scopes = self._scopes.get(topic)
        if scopes is None:
            scopes = self._scopes[topic] = {}
        scope = scopes.get(partition)
        if scope is None:
            scope = scopes[partition] = partition_scope(topic, partition)
        return scope


class Ingress:
    """Per-record ingress over id-cache and progress stores.

    `id_store(topic, persist)` gives the store for a topic's caches: the persistent
    (changelogged) one when persist_id_cache is true, a memory one otherwise.
    """

    def __init__(
        self,
        triggers: TriggerSet,
        progress: Store,
        id_store: Any,
    ) -> None:
        self.triggers = triggers
        self.delivery = DeliveryCounter(progress)
        self._id_store = id_store
        self._caches: dict[tuple[str, int], IdCache] = {}
        self._routes: dict[str, list[TriggerDef]] = {}
        for trigger in triggers.triggers:
            for topic in trigger.topics:
                self._routes.setdefault(topic, []).append(trigger)
        # topic -> document type -> the triggers that take it.
        self._route_cache: dict[str, dict[str, tuple[TriggerDef, ...]]] = {}

    def cache(self, topic: str, partition: int) -> IdCache:
        """The duplicate-ID cache of one topic-partition."""
        key = (topic, partition)
        cache = self._caches.get(key)
        if cache is None:
            settings = self.triggers.topic(topic)
            store = self._id_store(topic, settings.persist_id_cache)
            cache = IdCache(store, partition_scope(topic, partition), settings.id_cache_size)
            self._caches[key] = cache
        return cache

    def admit_into(
        self, record: Record, position: int, journal: list[JournalRecord], *,
        raw_key: bytes | None = None, null_headers: Iterable[str] = (),
    ) -> tuple[Document | None, tuple[TriggerDef, ...], Output | None]:
        """Run the ingress rules on one record: (document, its triggers, dead letter).

        Journal records go to `journal`; a rejected record's `bad-input` record and dead
        letter are onceflow.outputs.rejection's (the runner sends the dead letter).
        `raw_key`, `null_headers`: what the runner kept aside of the record, for its dead
        letter (see outputs.dead_letter).
        """
        delivery_count = self.delivery.count(record)
        headers = record.headers
        if headers:
            problem = header_problem(headers)
            if problem is not None:
                uuid_seen, activation_seen = envelope_fields(record.value)
                return self._reject(journal, record, problem, uuid_seen or record.message_id,
                                    activation_seen, position, raw_key, null_headers)
        topic = record.topic
        # record.message_id (the header's, else the coordinates) is made only where
        # needed: most records carry a uuid, and the document makes its own when asked.
        value = record.value
        if headers or type(value) is dict:
            too_long = keys_too_long(headers, value)
            if too_long is not None:
                uuid_seen, _ = envelope_fields(value)
                return self._reject(journal, record, too_long, uuid_seen or record.message_id,
                                    None, position, raw_key, null_headers)
        dup_id = headers.get(H_DUP_ID) if headers else None
        if dup_id is not None and self.cache(topic, record.partition).seen(
                dup_id, record.message_id, record.delivered_offset):
            uuid_seen, activation_seen = envelope_fields(value)
            journal.append(self._ingress_record(
                record, J.DUPLICATE_ID, uuid_seen or record.message_id,
                activation_seen, position,
                f"dup-id {dup_id!r} was already received on {topic}/{record.partition}",
            ))
            return None, (), None
        # Absent fields read as "", so one type test per field finds a present field
        # that is not a string (null included).
        if type(value) is dict:
            doc_type = value.get("type", "")
            uuid = value.get("uuid", "")
            activation = value.get("activation", "")
            valid = (type(doc_type) is str and type(uuid) is str and type(activation) is str
                     and not nested_deeper_than(value, MAX_DEPTH))
        else:
            valid = False
        if not valid:
            try:
                check_envelope(value)
            except BadEnvelope as exc:
                uuid_seen, activation_seen = envelope_fields(value)
                return self._reject(journal, record, exc.reason,
                                    uuid_seen or record.message_id, activation_seen, position,
                                    raw_key, null_headers)
        doc_type = doc_type or topic
        identity = uuid or record.message_id
        activation = activation or None
        by_type = self._route_cache.get(topic)
        if by_type is None:
            by_type = self._route_cache[topic] = {}
        targets = by_type.get(doc_type)
        if targets is None:
            targets = tuple(t for t in self._routes.get(topic, ()) if doc_type in t.types)
            if targets:
                # Only types some trigger takes: the cache stays as small as the trigger
                # file, whatever types a producer makes up.
                by_type[doc_type] = targets
        if not targets:
            reason = f"no trigger takes document type {doc_type!r} from topic {topic!r}"
            return self._reject(journal, record, reason, identity, activation, position,
                                raw_key, null_headers)
        document = Document(doc_type, identity, activation, value, record.ts, topic,
                            record.partition, record.offset, record.given_message_id,
                            delivery_count, record.key, headers, position,
                            record.redelivers)
        return document, targets, None

    @staticmethod
    def _reject(journal: list[JournalRecord], record: Record, reason: str, identity: str,
                activation: str | None, position: int, raw_key: bytes | None,
                null_headers: Iterable[str]) -> tuple[None, tuple[TriggerDef, ...], Output]:
        entry, letter = rejection(record, reason, identity, activation, None, position,
                                  raw_key=raw_key, null_headers=null_headers)
        journal.append(entry)
        return None, (), letter

    @staticmethod
    def _ingress_record(
        record: Record,
        outcome: str,
        identity: str,
        activation: str | None,
        position: int,
        reason: str,
    ) -> JournalRecord:
        return JournalRecord(
            None, outcome, identity, activation, record.ts, record.topic, record.partition,
            record.offset, reason, None, position,
        )
