"""What travels between the worker and its tools: topic names, routed documents, controls.

The repartition topic (`onceflow.route`) carries, in one ordered stream per partition,
documents routed to the partition that owns their routing key, clock ticks and control
messages (suspend, resume, history seeds and removals, barriers).  Ordering them in one
stream is what lets a tick or a control take effect exactly between two documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from onceflow.engine import DEAD_LETTER_TOPIC
from onceflow.envelope import Document
from onceflow.journal import JournalRecord
from onceflow.processor import Output
from onceflow.tables.outbox import Outbox, partition_for
from onceflow.triggers import TriggerDef

ROUTE_TOPIC = "onceflow.route"
JOURNAL_TOPIC = "onceflow.journal"
ACKS_TOPIC = "onceflow.acks"

# Kinds of route-topic messages.
DOC = "doc"
TICK = "tick"
SUSPEND = "suspend"
RESUME = "resume"
FORGET = "forget"
SEED = "seed"
BARRIER = "barrier"
SWEEP = "sweep"


@dataclass(frozen=True, slots=True)
class Names:
    """Topic names under a deployment prefix (every topic onceflow reads or writes)."""

    prefix: str = ""

    def topic(self, logical: str) -> str:
        """The real name of a logical topic."""
        return self.prefix + logical

    def logical(self, real: str) -> str:
        """The logical name of a real topic."""
        if self.prefix and real.startswith(self.prefix):
            return real[len(self.prefix):]
        return real

    @property
    def route(self) -> str:
        """The repartition topic."""
        return self.prefix + ROUTE_TOPIC

    @property
    def journal(self) -> str:
        """The journal topic."""
        return self.prefix + JOURNAL_TOPIC

    @property
    def acks(self) -> str:
        """Where barriers are acknowledged."""
        return self.prefix + ACKS_TOPIC

    @property
    def dead_letter(self) -> str:
        """Where records rejected at ingress go."""
        return self.prefix + DEAD_LETTER_TOPIC

    @property
    def app_id(self) -> str:
        """The Faust application id (consumer group, changelog topic names)."""
        return self.prefix + "onceflow"


def routing_key(trigger: TriggerDef, doc: Document) -> str:
    """What a trigger's state is keyed by: the activation for joins, else the identity."""
    if trigger.routes_by_activation and doc.activation is not None:
        return doc.activation
    return doc.identity


def route_partition(key: str, partitions: int) -> int:
    """The partition that owns a routing key (Kafka's default partitioner)."""
    return partition_for(key.encode(), partitions)


@dataclass(slots=True)
class Delivery:
    """One record as the worker received it (topic under its real name)."""

    topic: str
    partition: int
    offset: int
    ts: float
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    handle: Any = None  # what acknowledges it (a Faust message), if anything


def header_dict(headers: list[tuple[str, bytes]] | None) -> dict[str, str]:
    """Kafka headers as the core reads them (the last of a repeated name wins)."""
    if not headers:
        return {}
    return {name: value.decode("utf-8", "replace") for name, value in headers
            if value is not None}


def doc_message(triggers: list[str], doc: Document) -> bytes:
    """A routed document for some triggers."""
    return orjson.dumps({"k": DOC, "t": triggers, "d": doc.to_json()})


def control_message(kind: str, **fields: Any) -> bytes:
    """A tick or control message."""
    return orjson.dumps({"k": kind, **fields})


def add_control(outbox: Outbox, names: Names, partition: int, kind: str,
                **fields: Any) -> None:
    """Queue a control message for one partition of the route topic."""
    outbox.add(names.route, partition, kind.encode(), control_message(kind, **fields))


def add_journal(outbox: Outbox, names: Names, records: list[JournalRecord],
                limit: int | None = None) -> None:
    """Queue journal records, keyed by identity (clipped to fit `limit` when one is given)."""
    topic = names.journal
    dumps = orjson.dumps
    for record in records:
        key = record.identity.encode() if record.identity is not None else None
        value = dumps(record.as_dict())
        if limit is not None and len(value) + len(key or b"") > limit - 4096:
            from .limits import fit_journal

            key, value = fit_journal(record, key, value, limit)
        outbox.add(topic, None, key, value)


def add_outputs(outbox: Outbox, names: Names, outputs: list[Output]) -> None:
    """Queue output, error, in-doubt, reply-to and dead-letter documents."""
    dumps = orjson.dumps
    for output in outputs:
        key = output.key.encode() if output.key is not None else None
        headers = [(name, value.encode()) for name, value in output.headers.items()]
        outbox.add(names.topic(output.topic), None, key, dumps(output.value), headers)
