"""Records as consumed, documents as triggers see them, and envelope validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .pickling import by_fields

# Header names (section 1 and 2 of the spec).
H_MESSAGE_ID = "message-id"
H_DELIVERY_COUNT = "delivery-count"
H_DUP_ID = "dup-id"
H_REPLY_TO = "reply-to"

UNDEFINED_DELIVERY = -1
ENVELOPE_STRINGS = ("type", "uuid", "activation")
MAX_IDENTITY_LENGTH = 96


class NotJson:
    """A record value that is not JSON; kept as text so nothing is lost."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"NotJson({self.text[:40]!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NotJson) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def decode_value(data: bytes | str | None) -> Any:
    """Decode a record value; a value that is not JSON comes back as NotJson."""
    if data is None:
        return NotJson("")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        if isinstance(data, bytes):
            return NotJson(data.decode("utf-8", errors="replace"))
        return NotJson(data)


def encode_value(value: Any) -> bytes:
    """Encode a record value: NotJson goes back to its own bytes."""
    if isinstance(value, NotJson):
        return value.text.encode("utf-8")
    return orjson.dumps(value)


# Record time in seconds, echoed as it was given: an int stays an int.  (Spelled as a
# union on purpose: compiled with mypyc, a plain `float` attribute would turn 5 into 5.0.)
Timestamp = int | float


# The classes made once or more per document write their __init__ out: compiled, a
# dataclass-generated __init__ stays interpreted Python and costs several times more.

@dataclass(init=False, slots=True)
class Record:
    """One record of an input topic, as consumed (value already decoded)."""

    topic: str
    partition: int
    offset: int
    ts: Timestamp
    value: Any
    key: str | None
    headers: dict[str, str]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    def __init__(self, topic: str, partition: int, offset: int, ts: Timestamp, value: Any,
                 key: str | None = None, headers: dict[str, str] | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.ts = ts
        self.value = value
        self.key = key
        self.headers = {} if headers is None else headers

    @property
    def coordinates(self) -> str:
        """The record's own message id: "<topic>/<partition>@<offset>"."""
        return f"{self.topic}/{self.partition}@{self.offset}"

    @property
    def message_id(self) -> str:
        """Header `message-id` when present, else the coordinates (JMSMessageID analogue)."""
        mid = self.headers.get(H_MESSAGE_ID)
        return mid if mid else self.coordinates


@dataclass(init=False, slots=True)
class Document:
    """A validated envelope with everything the exactly-once decision needs.

    `position` orders documents the way they were consumed; runners that split work
    (Spark) use it to keep file order.
    """

    type: str
    identity: str
    activation: str | None
    envelope: dict[str, Any]
    ts: Timestamp
    topic: str
    partition: int
    offset: int
    message_id: str
    delivery_count: int
    key: str | None
    headers: dict[str, str]
    position: int

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    def __init__(self, type: str, identity: str, activation: str | None,
                 envelope: dict[str, Any], ts: Timestamp, topic: str, partition: int,
                 offset: int, message_id: str, delivery_count: int, key: str | None = None,
                 headers: dict[str, str] | None = None, position: int = 0) -> None:
        self.type = type
        self.identity = identity
        self.activation = activation
        self.envelope = envelope
        self.ts = ts
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.message_id = message_id
        self.delivery_count = delivery_count
        self.key = key
        self.headers = {} if headers is None else headers
        self.position = position

    @property
    def body(self) -> Any:
        """The envelope's body (None when absent)."""
        return self.envelope.get("body")

    @property
    def reply_to(self) -> str | None:
        """The topic an error notification goes to, from the header or the envelope."""
        target = self.headers.get(H_REPLY_TO) or self.envelope.get("reply-to")
        return target if isinstance(target, str) and target else None

    def to_json(self) -> dict[str, Any]:
        """A plain JSON-able form, for tables, repartition topics and join state."""
        return {
            "type": self.type,
            "identity": self.identity,
            "activation": self.activation,
            "envelope": self.envelope,
            "ts": self.ts,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "message_id": self.message_id,
            "delivery_count": self.delivery_count,
            "key": self.key,
            "headers": self.headers,
            "position": self.position,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Document:
        """Inverse of to_json."""
        return cls(
            type=data["type"],
            identity=data["identity"],
            activation=data["activation"],
            envelope=data["envelope"],
            ts=data["ts"],
            topic=data["topic"],
            partition=data["partition"],
            offset=data["offset"],
            message_id=data["message_id"],
            delivery_count=data["delivery_count"],
            key=data.get("key"),
            headers=data.get("headers") or {},
            position=data.get("position", 0),
        )


class BadEnvelope(Exception):
    """The record value is not a valid envelope; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def envelope_fields(value: Any) -> tuple[str | None, str | None]:
    """(uuid, activation) as far as they can be read, for journal records of bad input."""
    if not isinstance(value, dict):
        return None, None
    uuid = value.get("uuid")
    activation = value.get("activation")
    return (
        uuid if isinstance(uuid, str) and uuid else None,
        activation if isinstance(activation, str) else None,
    )


def check_envelope(value: Any) -> None:
    """Raise BadEnvelope unless the value is a JSON object with string type/uuid/activation."""
    if not isinstance(value, dict):
        if isinstance(value, NotJson):
            raise BadEnvelope("the value is not JSON")
        raise BadEnvelope(f"the value is JSON but not an object (got {json_kind(value)})")
    for name in ENVELOPE_STRINGS:
        if name in value and not isinstance(value[name], str):
            raise BadEnvelope(
                f"envelope field {name!r} must be a string, got {json_kind(value[name])}"
            )


def parse_delivery_count(header: str) -> int:
    """The header's delivery count; -1 (undefined) when it cannot be read."""
    try:
        count = int(header.strip())
    except ValueError:
        return UNDEFINED_DELIVERY
    return count if count >= 1 else UNDEFINED_DELIVERY


def json_kind(value: Any) -> str:
    """How a JSON value is named in error messages ("a string", "null", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
