"""What travels between the worker and its tools: topic names, routed documents, controls.

The repartition topic (`onceflow.route`) carries, in one ordered stream per partition,
documents routed to the partition that owns their routing key, clock ticks and control
messages (suspend, resume, history seeds and removals, barriers).  Ordering them in one
stream is what lets a tick or a control take effect exactly between two documents.

Anyone who can write to the topic can put anything on it, so `read_message` checks every
record before the worker acts on it: a record it cannot apply is `BadMessage`, which the
partition journals as bad input and copies to the dead-letter topic (agents/partition_worker.py)
instead of failing its batch, which would stop the worker on that record after every
restart.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

import orjson
from onceflow.envelope import Document, Record, Timestamp
from onceflow.journal import JournalRecord
from onceflow.keys import kafka_partition
from onceflow.outputs import DEAD_LETTER_TOPIC, Output
from onceflow.tables.outbox import Outbox, OutRecord
from onceflow.values import json_kind

from .signing import RouteSigner

ROUTE_TOPIC: Final = "onceflow.route"
JOURNAL_TOPIC: Final = "onceflow.journal"
ACKS_TOPIC: Final = "onceflow.acks"

# Kinds of route-topic messages.
DOC: Final = "doc"
TICK: Final = "tick"
SUSPEND: Final = "suspend"
RESUME: Final = "resume"
FORGET: Final = "forget"
SEED: Final = "seed"
BARRIER: Final = "barrier"
SWEEP: Final = "sweep"
KINDS: Final = (DOC, TICK, SUSPEND, RESUME, FORGET, SEED, BARRIER, SWEEP)
# Controls that act with an admin's power carry a unique "id" and the time they were made,
# "at" (seconds), inside the signed value: a worker applies each once, and none older than
# CONTROL_MAX_AGE seconds (agents/controls.py), so a copy produced again is refused.
ADMIN_KINDS: Final = (SUSPEND, RESUME, FORGET, SEED, SWEEP)
CONTROL_MAX_AGE: Final = 300.0


class BadMessage(Exception):
    """A record of the repartition topic that the worker cannot read; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# The fields of a routed document (Document.to_json): name -> (types, may be null,
# required).
_NUMBER: Final = (int, float)
_DOC_FIELDS: dict[str, tuple[tuple[type, ...], bool, bool]] = {
    "type": ((str,), False, True),
    "identity": ((str,), False, True),
    "activation": ((str,), True, True),
    "envelope": ((dict,), False, True),
    "ts_ms": ((int,), False, False),  # record time in ms; a message from an earlier
    "ts": (_NUMBER, False, False),  # version has "ts" in seconds instead
    "topic": ((str,), False, True),
    "partition": ((int,), False, True),
    "offset": ((int,), False, True),
    "message_id": ((str,), False, True),
    "delivery_count": ((int,), False, True),
    "key": ((str,), True, False),
    "headers": ((dict,), True, False),
    "position": ((int,), False, False),
    "redelivers": ((int,), True, False),
    "resubmitted": ((bool,), False, False),
    "resubmitted_by": ((str,), False, False),
}


def _check(message: dict[str, Any], name: str, types: tuple[type, ...], *,
           null: bool = False, required: bool = True, what: str = "") -> None:
    """Raise BadMessage unless message[name] is one of `types` (bool is not a number)."""
    where = f"{what}field {name!r}"
    if name not in message:
        if required:
            raise BadMessage(f"{where} is missing")
        return
    value = message[name]
    if value is None:
        if null:
            return
        raise BadMessage(f"{where} is null")
    if isinstance(value, bool) and bool not in types:
        raise BadMessage(f"{where} must be {_expected(types)}, got a boolean")
    if not isinstance(value, types):
        raise BadMessage(f"{where} must be {_expected(types)}, got {json_kind(value)}")


def _expected(types: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", dict: "an object",
             list: "an array", bool: "a boolean"}
    if types == _NUMBER:
        return "a number"
    return " or ".join(names.get(t, t.__name__) for t in types)


def routed_document(data: Any) -> Document:
    """The document of a routed message ("d"), checked field by field."""
    if not isinstance(data, dict):
        raise BadMessage(f"field 'd' must be an object, got {json_kind(data)}")
    for name, (types, null, required) in _DOC_FIELDS.items():
        _check(data, name, types, null=null, required=required, what="document ")
    if "ts_ms" not in data and "ts" not in data:
        raise BadMessage("document field 'ts_ms' (its record time) is missing")
    headers = data.get("headers") or {}
    if not all(isinstance(v, str) for v in headers.values()):
        raise BadMessage("document field 'headers' must map names to strings")
    try:
        return Document.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:  # what the checks above did not see
        raise BadMessage(f"field 'd' is not a routed document ({exc!r})") from None


def read_message(value: bytes | None) -> tuple[str, dict[str, Any], Document | None]:
    """(kind, message, routed document or None) of a repartition-topic record.

    Raises BadMessage, with the reason, for anything a worker could not apply: a value
    that is not a JSON object, an unknown kind, a field missing or of the wrong type.
    Whether the trigger a message names exists is for the partition to say.
    """
    if value is None:
        raise BadMessage("the value is empty (null)")
    try:
        message = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise BadMessage("the value is not JSON") from None
    if not isinstance(message, dict):
        raise BadMessage(f"the value is JSON but not an object (got {json_kind(message)})")
    kind = message.get("k")
    if not isinstance(kind, str):
        raise BadMessage("field 'k' (the message kind) is missing" if kind is None else
                         f"field 'k' (the message kind) must be a string, got "
                         f"{json_kind(kind)}")
    if kind not in KINDS:
        shown = kind if len(kind) <= 80 else kind[:80] + "..."
        raise BadMessage(f"unknown message kind {shown!r} (known: {', '.join(KINDS)})")
    if kind == DOC:
        _check(message, "t", (list,))
        names = message["t"]
        if not names or not all(isinstance(n, str) and n for n in names):
            raise BadMessage("field 't' must be a non-empty array of trigger names")
        _check(message, "d", (dict,))
        return kind, message, routed_document(message["d"])
    if kind in ADMIN_KINDS:
        _check(message, "id", (str,), required=False)
        _check(message, "at", _NUMBER, required=False)
    if kind == TICK:
        _check(message, "ts", _NUMBER)
    elif kind == BARRIER:
        _check(message, "id", (str, int))
    elif kind == SEED:
        _check(message, "trigger", (str,))
        _check(message, "identity", (str,))
        _check(message, "ts", _NUMBER)
        _check(message, "activation", (str,), null=True, required=False)
        _check(message, "failed", (bool,), null=True, required=False)
        if message.get("status") not in ("processing", "completed"):
            raise BadMessage('field \'status\' must be "processing" or "completed"')
    elif kind == SWEEP:
        _check(message, "trigger", (str,), null=True, required=False)
    else:  # suspend, resume, forget
        _check(message, "trigger", (str,))
        _check(message, "reason", (str,), null=True, required=False)
        _check(message, "journal", (bool,), null=True, required=False)
        _check(message, "by", (str,), null=True, required=False)
        if kind == FORGET:
            _check(message, "key", (str,))
            if message.get("only", "processing") not in ("processing", "failed"):
                raise BadMessage('field \'only\' must be "processing" or "failed"')
    return kind, message, None


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


def route_partition(key: str, partitions: int) -> int:
    """The partition that owns a routing key (Kafka's default partitioner)."""
    return kafka_partition(key.encode(), partitions)


@dataclass(init=False, slots=True)
class Delivery:
    """One record as the worker received it (topic under its real name)."""

    topic: str
    partition: int
    offset: int
    ts: Timestamp | None  # Kafka's ms; None only on the in-memory broker (no record time)
    key: bytes | None
    value: bytes | None
    # A header value may be null (Kafka allows it; Java clients send them).
    headers: list[tuple[str, bytes | None]]
    handle: Any  # its topic-partition, under which the transport acknowledges it

    # Written out: mypyc compiles it, the dataclass's generated one stays interpreted
    # (one Delivery a record).
    def __init__(self, topic: str, partition: int, offset: int, ts: Timestamp | None,
                 key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]] | None = None,
                 handle: Any = None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.ts = ts
        self.key = key
        self.value = value
        self.headers = [] if headers is None else headers
        self.handle = handle


def record_of(delivery: Delivery, topic: str, value: Any = None
              ) -> tuple[Record, bytes | None, list[str]]:
    """A delivery as the core's Record under its logical `topic`, with what is kept aside.

    `value` is the decoded value, or None for now.  Aside: the key's bytes when they are
    not UTF-8, and the names of the headers whose value is null.  The key only partitions
    what a document produces, so one that is not UTF-8 is read with U+FFFD (an Avro or
    integer key is not bad input); a dead-letter copy of the record holds its bytes
    ("key_base64").  A header whose value is null is no header (header_dict); a
    dead-letter copy names it.
    """
    key = delivery.key
    text: str | None = None
    raw_key: bytes | None = None
    if key:
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            raw_key = key
            text = key.decode("utf-8", "replace")
    headers = delivery.headers
    if headers:
        nulls = [name for name, data in headers if data is None]
        read = header_dict(headers)
    else:
        nulls = []
        read = {}
    ts = delivery.ts
    if ts is None:
        raise no_time(delivery, topic)
    return (Record(topic, delivery.partition, delivery.offset, ts, value, text, read),
            raw_key, nulls)


def no_time(delivery: Delivery, topic: str) -> TypeError:
    """The error of a delivery without a record time (the core's Record refuses one).

    `topic`: its logical name, for the message.
    """
    return TypeError(f"record {topic}/{delivery.partition}@{delivery.offset} has no time")


def header_dict(headers: list[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """Kafka headers as the core reads them (the last of a repeated name wins).

    A header whose value is null is read as absent (so a null `message-id` or `dup-id`
    is no header at all); dead-letter copies keep it as null (agents/partition_worker.py).

    Values are decoded losslessly: a byte that is not UTF-8 becomes a lone surrogate
    ("surrogateescape", as header names are by record_batches.py), never U+FFFD, so two
    different values never read as one; the core makes such a record bad input
    (onceflow.values.header_problem).
    """
    if not headers:
        return {}
    return {name: value.decode("utf-8", "surrogateescape") for name, value in headers
            if value is not None}


def doc_message(triggers: list[str], doc: Document) -> bytes:
    """A routed document for some triggers."""
    return orjson.dumps({"k": DOC, "t": triggers, "d": doc.to_json()})


def control_message(kind: str, **fields: Any) -> bytes:
    """A tick or control message (an admin's control with a new id and the time now)."""
    if kind in ADMIN_KINDS:
        fields.setdefault("id", uuid.uuid4().hex)
        fields.setdefault("at", time.time())
    return orjson.dumps({"k": kind, **fields})


def add_control(outbox: Outbox, names: Names, partition: int, kind: str, *,
                signer: RouteSigner, **fields: Any) -> None:
    """Queue a control message for one partition of the route topic, signed."""
    add_route(outbox, names, signer, partition, kind.encode(), control_message(kind, **fields))


def add_route(outbox: Outbox, names: Names, signer: RouteSigner, partition: int,
              key: bytes | None, value: bytes) -> None:
    """Queue a signed record (routed document or control) for a partition of the route topic."""
    topic = names.route
    outbox.add(topic, partition, key, value, signer.headers(topic, partition, value))


def add_journal(outbox: Outbox, names: Names, records: list[JournalRecord],
                limit: int | None = None) -> None:
    """Queue journal records, keyed by identity (clipped to fit `limit` when one is given)."""
    topic = names.journal
    dumps = orjson.dumps
    queued: list[OutRecord] = []
    for record in records:
        try:
            key = record.identity.encode() if record.identity is not None else None
            value = dumps(record.as_dict())
        except (TypeError, UnicodeEncodeError):
            # A reason quoting an exception that quotes undecodable bytes: escape them.
            from .limits import printable

            data = {name: printable(field) if isinstance(field, str) else field
                    for name, field in record.as_dict().items()}
            key = data["identity"].encode() if data.get("identity") is not None else None
            value = dumps(data)
        if limit is not None and len(value) + len(key or b"") > limit - 4096:
            from .limits import fit_journal

            key, value = fit_journal(record, key, value, limit)
        queued.append(OutRecord(key, value))
    outbox.extend(topic, None, queued)


def add_outputs(outbox: Outbox, names: Names, outputs: list[Output]) -> None:
    """Queue output, error, in-doubt, reply-to and dead-letter documents."""
    dumps = orjson.dumps
    # By logical topic, in order, queued a topic at a time (one real name a topic).
    queued: dict[str, list[OutRecord]] = {}
    for output in outputs:
        records = queued.get(output.topic)
        if records is None:
            records = queued[output.topic] = []
        key = output.key.encode() if output.key is not None else None
        headers = [(name, value.encode()) for name, value in output.headers.items()]
        records.append(OutRecord(key, dumps(output.value), headers))
    for topic, records in queued.items():
        outbox.extend(names.topic(topic), None, records)
