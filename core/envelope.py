"""Records as consumed, documents as triggers see them, and envelope validation."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from .pickling import by_fields

# Header names (section 1 and 2 of the spec).
H_MESSAGE_ID: Final = "message-id"
H_DELIVERY_COUNT: Final = "delivery-count"
H_DUP_ID: Final = "dup-id"
H_REPLY_TO: Final = "reply-to"

UNDEFINED_DELIVERY: Final = -1
ENVELOPE_STRINGS: Final = ("type", "uuid", "activation")
MAX_IDENTITY_LENGTH: Final = 96
# How deep a document may nest arrays and objects, its envelope object being level 1.
# Every runner writes documents out again (routed, held, joined, dead-lettered, in error
# documents) inside a few levels of its own, and orjson writes at most 254 levels; a
# deeper document is bad input at ingress, in every runner alike.
MAX_DEPTH: Final = 128


class NotJson:
    """A record value that is not JSON; kept as text so nothing is lost.

    `data` holds the value's bytes when they are not UTF-8 (the text then has U+FFFD in
    their place), so that a dead-letter copy can keep them.
    """

    __slots__ = ("text", "data")

    def __init__(self, text: str, data: bytes | None = None) -> None:
        self.text = text
        self.data = data

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return NotJson, (self.text, self.data)

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
            try:
                return NotJson(data.decode("utf-8"))
            except UnicodeDecodeError:
                return NotJson(data.decode("utf-8", errors="replace"), data)
        return NotJson(data)


def encode_value(value: Any) -> bytes:
    """Encode a record value: NotJson goes back to its own bytes.

    A value nested deeper than orjson writes (a scenario's hostile document) is written
    by the standard library's encoder.
    """
    if isinstance(value, NotJson):
        return value.data if value.data is not None else value.text.encode("utf-8")
    try:
        return orjson.dumps(value)
    except TypeError:
        if not nested_deeper_than(value, 250):
            raise
        return deep_json(value).encode("utf-8")


def deep_json(value: Any) -> str:
    """JSON text of a decoded JSON value however deep it nests.

    orjson writes at most 254 levels and the standard library's encoder recurses; this
    one keeps its own stack, for the rare value (a hostile document) that needs it.
    """
    parts: list[str] = []
    stack: list[tuple[bool, Any]] = [(False, value)]
    while stack:
        literal, item = stack.pop()
        if literal:
            parts.append(item)
        elif type(item) is dict:
            stack.append((True, "}"))
            entries = list(item.items())
            for index in range(len(entries) - 1, -1, -1):
                key, child = entries[index]
                stack.append((False, child))
                comma = "," if index else ""
                stack.append((True, comma + orjson.dumps(str(key)).decode() + ":"))
            stack.append((True, "{"))
        elif type(item) is list:
            stack.append((True, "]"))
            for index in range(len(item) - 1, -1, -1):
                stack.append((False, item[index]))
                if index:
                    stack.append((True, ","))
            stack.append((True, "["))
        else:
            parts.append(orjson.dumps(item).decode())
    return "".join(parts)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether a JSON value nests arrays and objects more than `limit` levels deep.

    Recursion stops at `limit` levels, so a hostile document thousands of levels deep
    costs no deeper a stack than a document at the limit.
    """
    kind = type(value)
    if kind is dict or kind is list:
        return _deeper(value, limit)
    return False


def _deeper(container: Any, budget: int) -> bool:
    """Whether a container (level 1) nests more than `budget` levels."""
    if budget <= 0:
        return True
    # Typed per kind, so that the compiled loops walk the dict or list directly (a loop
    # over a value of unknown type goes through the iterator protocol item by item).
    if type(container) is dict:
        mapping: dict[Any, Any] = container
        for item in mapping.values():
            kind = type(item)
            if (kind is dict or kind is list) and _deeper(item, budget - 1):
                return True
        return False
    array: list[Any] = container
    for item in array:
        kind = type(item)
        if (kind is dict or kind is list) and _deeper(item, budget - 1):
            return True
    return False


def is_text(value: str) -> bool:
    """Whether a string is Unicode text that UTF-8 can encode (no lone surrogates).

    The worker decodes Kafka header names and values with "surrogateescape", so bytes
    that are not UTF-8 arrive as lone surrogates and are told apart here, never merged.
    """
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def raw_bytes(value: str) -> bytes:
    """The bytes a header string was decoded from ("surrogateescape"), for messages."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


def shown_bytes(value: str, keep: int = 60) -> str:
    """How a string that is not UTF-8 is named in a reason: its bytes, as Python writes them."""
    data = raw_bytes(value)
    shown = repr(data[:keep])
    return shown if len(data) <= keep else f"{shown}... ({len(data)} bytes)"


def header_problem(headers: dict[str, str]) -> str | None:
    """Why a record's headers cannot be read, or None.

    A header name or value that is not UTF-8 is never decoded with replacement characters:
    two different `dup-id`s (or message ids) would become the same text and the second
    document would be dropped.  Such a record is bad input, whichever header it is.
    """
    for name, value in headers.items():
        if not is_text(name):
            return (f"a header name is not UTF-8 ({shown_bytes(name)}): onceflow reads "
                    f"header names and values as UTF-8 text only")
        if not is_text(value):
            return (f"header {name!r} is not UTF-8 ({shown_bytes(value)}): onceflow reads "
                    f"header values as UTF-8 text only, and does not guess what the "
                    f"bytes mean")
    return None


def safe_headers(headers: dict[str, str]) -> dict[str, Any]:
    """Headers as JSON can carry them, for dead-letter copies.

    {"headers": the UTF-8 ones} and, when some are not UTF-8, "headers_base64": a list of
    {"name", "value"} pairs holding their bytes in base64, so nothing is lost.
    """
    if all(is_text(name) and is_text(value) for name, value in headers.items()):
        return {"headers": headers}
    text = {name: value for name, value in headers.items() if is_text(name) and is_text(value)}
    binary = [{"name": base64.b64encode(raw_bytes(name)).decode("ascii"),
               "value": base64.b64encode(raw_bytes(value)).decode("ascii")}
              for name, value in headers.items() if not (is_text(name) and is_text(value))]
    return {"headers": text, "headers_base64": binary}


# Record time in seconds, echoed as it was given: an int stays an int.  (Spelled as a
# union on purpose: compiled with mypyc, a plain `float` attribute would turn 5 into 5.0.)
Timestamp = int | float


def record_time(ts: Timestamp) -> Timestamp:
    """Record time as every runner uses it: rounded to the nearest millisecond.

    Kafka timestamps are whole milliseconds, so the worker only ever sees such times;
    replay and Spark round the `ts` of a scenario the same way (spec section 7).  An int
    stays an int; a time too large to scale is kept as it is.
    """
    if type(ts) is int:
        return ts
    scaled = ts * 1000.0
    if scaled - scaled != 0.0:  # NaN or infinite (either minus itself is NaN)
        return ts
    if -_ROUNDS_EXACTLY < scaled < _ROUNDS_EXACTLY:
        # round(scaled) / 1000 in float arithmetic: adding and taking away 1.5 * 2**52
        # leaves the nearest whole number, ties to even as round() does (below 2**51
        # every sum falls where floats are exactly the whole numbers).  Compiled, the
        # builtin round() was a lookup, a call and two allocations: 3% of a replay.
        whole = (scaled + _ROUNDER) - _ROUNDER
        return whole / 1000.0
    return round(scaled) / 1000


_ROUNDER: Final = 6755399441055744.0  # 1.5 * 2**52
_ROUNDS_EXACTLY: Final = 2251799813685248.0  # 2**51


def coordinates(topic: str, partition: int, offset: int) -> str:
    """A record's own message id: "<topic>/<partition>@<offset>".

    The JMSMessageID analogue of a record without a message-id header.
    """
    return f"{topic}/{partition}@{offset}"


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
        return coordinates(self.topic, self.partition, self.offset)

    @property
    def given_message_id(self) -> str | None:
        """Header `message-id` when present (non-empty text), else None."""
        mid = self.headers.get(H_MESSAGE_ID) if self.headers else None
        return mid if mid and is_text(mid) else None

    @property
    def message_id(self) -> str:
        """Header `message-id` when present, else the coordinates (JMSMessageID analogue)."""
        given = self.given_message_id
        return given if given is not None else self.coordinates


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
    given_message_id: str | None  # the header's; None: the record's coordinates
    delivery_count: int
    key: str | None
    headers: dict[str, str]
    position: int

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    def __init__(self, type: str, identity: str, activation: str | None,
                 envelope: dict[str, Any], ts: Timestamp, topic: str, partition: int,
                 offset: int, message_id: str | None, delivery_count: int,
                 key: str | None = None, headers: dict[str, str] | None = None,
                 position: int = 0) -> None:
        self.type = type
        self.identity = identity
        self.activation = activation
        self.envelope = envelope
        self.ts = ts
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.given_message_id = message_id
        self.delivery_count = delivery_count
        self.key = key
        self.headers = {} if headers is None else headers
        self.position = position

    @property
    def message_id(self) -> str:
        """The message-id header's value, else "<topic>/<partition>@<offset>".

        Made when asked for: most documents carry a uuid and never need it.
        """
        given = self.given_message_id
        return given if given is not None else coordinates(self.topic, self.partition,
                                                           self.offset)

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


def is_redelivery(first_offset: int | None, first_message_id: str, offset: int,
                  message_id: str, delivery_count: int) -> bool:
    """Whether a record of a partition is the broker's redelivery of an earlier one there.

    Only the same offset is (spec section 2), or, where a runner cannot make the broker
    redeliver (a live replay), a record with `delivery-count` > 1 and the first record's
    message id.  A producer retry copies every header but gets a new offset and no
    delivery count, so it is not one.
    """
    return offset == first_offset or (delivery_count > 1 and message_id == first_message_id)


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
    if nested_deeper_than(value, MAX_DEPTH):
        raise BadEnvelope(
            f"the value nests arrays and objects more than {MAX_DEPTH} levels deep: "
            f"onceflow takes documents up to {MAX_DEPTH} levels"
        )


# The largest delivery count a header may give (a Kafka INT32, as Artemis' JMSXDeliveryCount).
MAX_DELIVERY_COUNT: Final = 2**31 - 1


def parse_delivery_count(header: str) -> int:
    """The header's delivery count; -1 (undefined) when it is not a plain count.

    Only ASCII digits, nothing around them, 1..2^31-1: Python's int() also reads
    `" 2 "`, `"1_0"` and other scripts' digits (`"٣"`), and any number of digits, none
    of which a publisher means as a count.
    """
    if not header.isascii() or not header.isdigit():
        return UNDEFINED_DELIVERY
    digits = header.lstrip("0")
    if not digits or len(digits) > 10:
        return UNDEFINED_DELIVERY
    count = int(digits)
    return count if 1 <= count <= MAX_DELIVERY_COUNT else UNDEFINED_DELIVERY


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


def iso_time(seconds: float) -> str:
    """A record time (epoch seconds) as an operator reads it: ISO-8601 UTC, milliseconds.

    For the reasons of journal records ("started at 2026-11-23T20:00:00.123Z"); a time no
    calendar date holds is shown as the number it is.
    """
    try:
        moment = datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return repr(seconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
