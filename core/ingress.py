"""Ingress: the duplicate-ID cache per topic-partition (HornetQ / Artemis), delivery
counts, envelope validation and routing of documents to triggers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import journal as J
from .envelope import (
    H_DELIVERY_COUNT,
    H_DUP_ID,
    BadEnvelope,
    Document,
    Record,
    check_envelope,
    envelope_fields,
    parse_delivery_count,
)
from .journal import JournalRecord
from .store import Store
from .triggers import TriggerDef, TriggerSet


class IdCache:
    """A fixed-size circular cache of duplicate IDs for one topic-partition.

    With size n, the (n+1)th ID stored overwrites slot 0.  Each ID remembers the message
    id of the record that first carried it: the broker redelivering that same record is
    not a resend (Artemis checks IDs when a message is sent to an address, never when a
    queue redelivers it), so it passes on to the exactly-once check.
    """

    __slots__ = ("_store", "_scope", "size", "_next")

    def __init__(self, store: Store, scope: str, size: int) -> None:
        self._store = store
        self._scope = scope
        self.size = size
        self._next: int = store.get(scope + "#next") or 0

    def seen(self, dup_id: str, message_id: str) -> bool:
        """Record dup_id; True when another record already carried it (drop this one)."""
        store = self._store
        id_key = self._scope + "|" + dup_id
        first = store.get(id_key)
        if first is not None:
            return bool(first[1] != message_id)
        slot = self._next
        slot_key = self._scope + "#" + str(slot)
        evicted = store.get(slot_key)
        if evicted is not None:
            del store[self._scope + "|" + evicted]
        store[slot_key] = dup_id
        store[id_key] = [slot, message_id]
        self._next = (slot + 1) % self.size
        store[self._scope + "#next"] = self._next
        return False

    def __contains__(self, dup_id: str) -> bool:
        return self._store.get(self._scope + "|" + dup_id) is not None

    def ids(self) -> list[str]:
        """The IDs held, oldest slot first (for views and tests)."""
        out = []
        for i in range(self.size):
            slot = (self._next + i) % self.size
            value = self._store.get(self._scope + "#" + str(slot))
            if value is not None:
                out.append(value)
        return out


class DeliveryCounter:
    """Delivery counts from the header, or derived from per-partition progress.

    A record at or below the highest offset already started for its partition is a
    redelivery (count 2); any other counts 1.  The store holds that highest offset, so
    a worker that persists it knows after a restart which records it had started.
    """

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    def count(self, record: Record) -> int:
        """The record's delivery count (-1 when the header cannot be read)."""
        scope = record.topic + "/" + str(record.partition)
        highest = self._store.get(scope)
        if highest is None or record.offset > highest:
            self._store[scope] = record.offset
            derived = 1
        else:
            derived = 2
        header = parse_delivery_count(record.headers.get(H_DELIVERY_COUNT))
        return derived if header is None else header

    def highest(self, topic: str, partition: int) -> int | None:
        """The highest offset started on a partition, if any."""
        value = self._store.get(topic + "/" + str(partition))
        return None if value is None else int(value)


@dataclass(slots=True)
class Admitted:
    """What ingress made of one record: journal records, and documents per trigger."""

    journal: list[JournalRecord] = field(default_factory=list)
    routed: list[tuple[TriggerDef, Document]] = field(default_factory=list)
    rejected_reason: str | None = None


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

    def subscribed(self, topic: str) -> bool:
        """Whether some trigger reads this topic."""
        return topic in self._routes

    def cache(self, topic: str, partition: int) -> IdCache:
        """The duplicate-ID cache of one topic-partition."""
        key = (topic, partition)
        cache = self._caches.get(key)
        if cache is None:
            settings = self.triggers.topic(topic)
            store = self._id_store(topic, settings.persist_id_cache)
            cache = IdCache(store, f"{topic}/{partition}", settings.id_cache_size)
            self._caches[key] = cache
        return cache

    def admit(self, record: Record, position: int = 0) -> Admitted:
        """Run the ingress rules on one record."""
        result = Admitted()
        delivery_count = self.delivery.count(record)
        message_id = record.message_id
        value = record.value
        dup_id = record.headers.get(H_DUP_ID)
        if dup_id is not None and self.cache(record.topic, record.partition).seen(
            dup_id, message_id
        ):
            uuid, activation = envelope_fields(value)
            result.journal.append(self._ingress_record(
                record, J.DUPLICATE_ID, uuid or message_id, activation, position,
                f"dup-id {dup_id!r} was already received on {record.topic}/{record.partition}",
            ))
            return result
        try:
            check_envelope(value)
        except BadEnvelope as exc:
            uuid, activation = envelope_fields(value)
            result.rejected_reason = exc.reason
            result.journal.append(self._ingress_record(
                record, J.BAD_INPUT, uuid or message_id, activation, position, exc.reason
            ))
            return result
        uuid = value.get("uuid")
        doc_type = value.get("type")
        if doc_type is None:
            doc_type = record.topic
        activation = value.get("activation")
        document = Document(
            type=doc_type,
            identity=uuid if uuid else message_id,
            activation=activation,
            envelope=value,
            ts=record.ts,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            message_id=message_id,
            delivery_count=delivery_count,
            key=record.key,
            headers=record.headers,
            position=position,
        )
        for trigger in self._routes.get(record.topic, ()):
            if doc_type in trigger.types:
                result.routed.append((trigger, document))
        if not result.routed:
            reason = (
                f"no trigger takes document type {doc_type!r} from topic {record.topic!r}"
            )
            result.rejected_reason = reason
            result.journal.append(self._ingress_record(
                record, J.BAD_INPUT, document.identity, activation, position, reason
            ))
        return result

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
