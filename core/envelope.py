"""Records as consumed, documents as triggers see them, and envelope validation."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from .pickling import by_fields
from .values import MAX_DEPTH, NotJson, is_text, json_kind, nested_deeper_than

# Header names (section 1 and 2 of the spec).
H_MESSAGE_ID: Final = "message-id"
H_DELIVERY_COUNT: Final = "delivery-count"
H_DUP_ID: Final = "dup-id"
H_REPLY_TO: Final = "reply-to"
# A live replay's stand-in for a redelivery (spec section 7): "<topic>/<partition>@<offset>"
# of the record it stands in for, and a signature.  Only a runner that checks the
# signature (agents/signing.py) acts on it, by setting Record.redelivers; the core never
# reads this header.
H_REDELIVERY: Final = "onceflow-redelivery"

UNDEFINED_DELIVERY: Final = -1
ENVELOPE_STRINGS: Final = ("type", "uuid", "activation")
MAX_IDENTITY_LENGTH: Final = 96


# Record time: a whole number of milliseconds since the epoch, as Kafka stamps records.
# Every deadline, time-out and TTL inside the core is a whole number of milliseconds too,
# so that a join opened at 10.001 s with a 10 s time-out is due at exactly 20.001 s.
Timestamp = int


def record_time(ts: int | float) -> Timestamp:
    """Record time in milliseconds from a time in seconds (a scenario's `ts`).

    Rounded to the nearest millisecond, ties to even, as every runner does (spec section
    7).  Raises ValueError for a time that is not a finite number.
    """
    if type(ts) is int:
        return ts * 1000
    scaled = ts * 1000.0
    if scaled - scaled != 0.0:  # NaN or infinite (either minus itself is NaN)
        raise ValueError(f"a record time must be a finite number of seconds, got {ts!r}")
    return round(scaled)


def seconds(ms: Timestamp) -> int | float:
    """A time in milliseconds as the journal reports it: seconds, to the millisecond.

    The one place a reported `ts` is made: whole seconds are written as an integer
    (5000 -> 5), any other time as a float (20001 -> 20.001).
    """
    if ms % 1000 == 0:
        return ms // 1000
    return ms / 1000


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
    # Set by a runner, never from a header alone: the offset (of this topic partition)
    # of an earlier record that this one is a verified stand-in for (a live replay's
    # signed redelivery marker).  None: the record is only itself.
    redelivers: int | None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    def __init__(self, topic: str, partition: int, offset: int, ts: Timestamp, value: Any,
                 key: str | None = None, headers: dict[str, str] | None = None,
                 redelivers: int | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.ts = ts
        self.value = value
        self.key = key
        self.headers = {} if headers is None else headers
        self.redelivers = redelivers

    @property
    def delivered_offset(self) -> int:
        """The offset this delivery is of: its own, or the one a stand-in stands in for."""
        return delivered_offset(self.offset, self.redelivers)

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
    redelivers: int | None  # see Record.redelivers
    # Sent again by an operator (`onceflow resubmit`): New for its trigger whatever its
    # count, history or resolver (spec section 1).
    resubmitted: bool
    resubmitted_by: str | None  # the name of the admin token that resubmitted it

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    def __init__(self, type: str, identity: str, activation: str | None,
                 envelope: dict[str, Any], ts: Timestamp, topic: str, partition: int,
                 offset: int, message_id: str | None, delivery_count: int,
                 key: str | None = None, headers: dict[str, str] | None = None,
                 position: int = 0, redelivers: int | None = None,
                 resubmitted: bool = False, resubmitted_by: str | None = None) -> None:
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
        self.redelivers = redelivers
        self.resubmitted = resubmitted
        self.resubmitted_by = resubmitted_by

    @property
    def delivered_offset(self) -> int:
        """The offset of the record this delivery is of (see Record.delivered_offset)."""
        return delivered_offset(self.offset, self.redelivers)

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
        data: dict[str, Any] = {
            "type": self.type,
            "identity": self.identity,
            "activation": self.activation,
            "envelope": self.envelope,
            "ts_ms": self.ts,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "message_id": self.message_id,
            "delivery_count": self.delivery_count,
            "key": self.key,
            "headers": self.headers,
            "position": self.position,
        }
        # Only when set: most documents have neither, and readers before 0.10 know neither.
        if self.redelivers is not None:
            data["redelivers"] = self.redelivers
        if self.resubmitted:
            data["resubmitted"] = True
            if self.resubmitted_by is not None:
                data["resubmitted_by"] = self.resubmitted_by
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Document:
        """Inverse of to_json.

        Documents written before record time was kept in milliseconds (join members, held
        and routed documents) carry "ts" in seconds instead of "ts_ms": read as the same
        time in milliseconds.
        """
        ts = data.get("ts_ms")
        return cls(
            type=data["type"],
            identity=data["identity"],
            activation=data["activation"],
            envelope=data["envelope"],
            ts=ts if ts is not None else record_time(data["ts"]),
            topic=data["topic"],
            partition=data["partition"],
            offset=data["offset"],
            message_id=data["message_id"],
            delivery_count=data["delivery_count"],
            key=data.get("key"),
            headers=data.get("headers") or {},
            position=data.get("position", 0),
            redelivers=data.get("redelivers"),
            resubmitted=data.get("resubmitted") is True,
            resubmitted_by=data.get("resubmitted_by"),
        )


def delivered_offset(offset: int, redelivers: int | None) -> int:
    """The offset a delivery is of: `redelivers` when it names an earlier offset, else `offset`.

    A stand-in always comes after the record it stands in for; a marker naming this or a
    later offset means nothing and is ignored.
    """
    if redelivers is not None and 0 <= redelivers < offset:
        return redelivers
    return offset


def parse_coordinates(text: str) -> tuple[str, int, int] | None:
    """(topic, partition, offset) of "<topic>/<partition>@<offset>", or None.

    Partition and offset are plain ASCII digits (at most 18); anything else, from a
    header a publisher wrote, is None, never an exception.
    """
    if len(text) > 400:
        return None
    topic, slash, rest = text.rpartition("/")
    partition, at, offset = rest.partition("@")
    if not slash or not at or not topic:
        return None
    for digits in (partition, offset):
        if not digits or len(digits) > 18 or not digits.isascii() or not digits.isdigit():
            return None
    return topic, int(partition), int(offset)


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


def iso_time(ms: Timestamp) -> str:
    """A record time (epoch milliseconds) as an operator reads it: ISO-8601 UTC, to the ms.

    For the reasons of journal records ("started at 2026-11-23T20:00:00.123Z"); a time no
    calendar date holds is shown as the number of seconds it is.
    """
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return repr(seconds(ms))
    # What isoformat(timespec="milliseconds") writes, with "Z" for its "+00:00", put
    # together from the fields (that call and the replace were three quarters of this
    # function, and a format spec is a str.format call each).
    year = moment.year
    two = _TWO_DIGITS
    return (f"{str(year) if year >= 1000 else str(10000 + year)[1:]}-{two[moment.month]}-"
            f"{two[moment.day]}T{two[moment.hour]}:{two[moment.minute]}:"
            f"{two[moment.second]}.{str(1000 + moment.microsecond // 1000)[1:]}Z")


# "00" to "99", for iso_time.
_TWO_DIGITS: Final[tuple[str, ...]] = tuple(str(100 + n)[1:] for n in range(100))
