"""What the core sends besides journal records: outputs, and dead-letter copies.

Every runner sends what a decision made as it is.  A dead letter (a copy kept on
`DEAD_LETTER_TOPIC` of something onceflow did not process or could not send) is built
here and nowhere else, so the replay, the worker and the Spark pipeline keep the same
fields.  The worker's last-resort copy of a record it failed on (agents/partition_worker.py
`raw_letter`) is the one exception: it must read nothing that can fail.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from .envelope import H_DUP_ID, Document, Record, seconds
from .journal import JournalRecord, bad_input
from .pickling import by_fields
from .triggers import TriggerDef
from .values import (
    MAX_DEPTH,
    NotJson,
    clip,
    deep_json,
    is_text,
    nested_deeper_than,
    safe_headers,
)

DEAD_LETTER_TOPIC: Final = "onceflow.dead-letter"


@dataclass(init=False, slots=True)
class Output:
    """A document for an output, error, in-doubt, reply-to or the dead-letter topic."""

    topic: str
    key: str | None
    value: Any
    headers: dict[str, str]

    # Written out: mypyc compiles it, the dataclass's generated one stays interpreted.
    def __init__(self, topic: str, key: str | None, value: Any,
                 headers: dict[str, str]) -> None:
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = headers

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)


def dead_letter(record: Record, reason: str, *, raw_key: bytes | None = None,
                null_headers: Iterable[str] = ()) -> Output:
    """The dead-letter copy of a record onceflow did not process: nothing is lost.

    {"reason", "topic", "partition", "offset", "ts" (seconds), "headers" (and
    "headers_base64" for those that are not UTF-8), then "value", or "raw" (and
    "raw_base64") for a value that is not JSON or nests deeper than a JSON writer takes}.
    `raw_key`: the key's bytes when they are not UTF-8 ("key_base64"); `null_headers`:
    names of headers whose value was null (kept as null).
    """
    value = record.value
    body: dict[str, Any] = {"reason": reason, "topic": record.topic,
                            "partition": record.partition, "offset": record.offset,
                            "ts": seconds(record.ts)}
    body.update(safe_headers(record.headers))
    if isinstance(value, NotJson):
        body["raw"] = value.text
        if value.data is not None:
            body["raw_base64"] = base64.b64encode(value.data).decode("ascii")
    elif nested_deeper_than(value, MAX_DEPTH):
        body["raw"] = deep_json(value)  # deeper than a JSON writer takes inside a record
    else:
        body["value"] = value
    if raw_key is not None:
        body["key_base64"] = base64.b64encode(raw_key).decode("ascii")
    nulls = [name for name in null_headers if name not in record.headers and is_text(name)]
    if nulls:
        kept = dict(body.get("headers") or {})
        for name in nulls:
            kept[name] = None
        body["headers"] = kept
    return Output(DEAD_LETTER_TOPIC, record.key, body, {"reason": reason})


def document_letter(doc: Document, reason: str, **fields: Any) -> Output:
    """The dead-letter copy of an admitted document (dead_letter of its record).

    It adds "identity" and "delivery_count", and `fields` (the trigger or triggers).
    """
    record = Record(doc.topic, doc.partition, doc.offset, doc.ts, doc.envelope, doc.key,
                    doc.headers)
    letter = dead_letter(record, reason)
    letter.value["identity"] = doc.identity
    letter.value["delivery_count"] = doc.delivery_count
    letter.value.update(fields)
    return letter


def output_letter(output: Output, doc: Document, reason: str, **fields: Any) -> Output:
    """The dead-letter copy of an output that could not be sent, and the document it answers.

    {"reason", `fields` (where it was going), the document's "topic", "partition",
    "offset", "ts" (seconds), the output's "headers" and "value"}.
    """
    body: dict[str, Any] = {"reason": reason, **fields, "topic": doc.topic,
                            "partition": doc.partition, "offset": doc.offset,
                            "ts": seconds(doc.ts), "headers": dict(output.headers),
                            "value": output.value}
    return Output(DEAD_LETTER_TOPIC, output.key, body, {"reason": reason})


def unread_letter(reason: str, where: str, raw: str | None) -> Output:
    """The dead-letter copy of an input line that is not a record: {"reason", "where", "raw"}."""
    return Output(DEAD_LETTER_TOPIC, None, {"reason": reason, "where": where, "raw": raw},
                  {"reason": reason})


def output_headers(trigger: TriggerDef, identity: str, activation: str | None
                   ) -> dict[str, str]:
    """The headers of every document a trigger publishes.

    The dup-id lets a consumer or a bridge drop a second copy.
    """
    headers = {H_DUP_ID: f"{trigger.name}:{identity}", "trigger": trigger.name,
               "identity": identity}
    if activation is not None:
        headers["activation"] = activation
    return headers


def output_headers_text(trigger: TriggerDef, identity: str, activation: str | None
                        ) -> tuple[int, int]:
    """(how many headers, characters of their names and values) of output_headers.

    What a bound on an output's record size needs, without building the headers: the
    worker measures every service result against the record limit before its output
    exists (agents/fitting.py).  Kept beside output_headers, whose headers it counts.
    """
    name = len(trigger.name)
    chars = (len(H_DUP_ID) + name + 1 + len(identity) + len("trigger") + name
             + len("identity") + len(identity))
    if activation is None:
        return 3, chars
    return 4, chars + len("activation") + len(activation)


def error_output(trigger: TriggerDef, documents: list[Any], key: str | None, identity: str,
                 activation: str | None, error_type: str, message: str,
                 attempts: int) -> Output:
    """The error document of a run (or of a document the trigger could not take)."""
    value = {
        "trigger": trigger.name,
        "identity": identity,
        "activation": activation,
        "error": {"type": error_type, "message": message},
        "attempts": attempts,
        "documents": documents,
    }
    return Output(trigger.error, key, value, output_headers(trigger, identity, activation))


def reference(doc: Document) -> dict[str, Any]:
    """Where a document's record is, in place of its content."""
    return {"topic": doc.topic, "partition": doc.partition, "offset": doc.offset,
            "identity": clip(doc.identity), "type": clip(doc.type)}


def rejection(record: Record, reason: str, identity: str | None, activation: str | None,
              trigger: str | None = None, position: int = -1, *,
              raw_key: bytes | None = None, null_headers: Iterable[str] = ()
              ) -> tuple[JournalRecord, Output]:
    """A record that is not decided: its `bad-input` journal record and its dead letter.

    `identity` and `activation`: what could be read of the record; `trigger`: None at
    ingress.  `raw_key` and `null_headers` as for dead_letter.
    """
    return (bad_input(trigger, identity, activation, record.ts, record.topic,
                      record.partition, record.offset, reason, position),
            dead_letter(record, reason, raw_key=raw_key, null_headers=null_headers))


def refusal(trigger: TriggerDef, doc: Document, why: str) -> tuple[JournalRecord, Output]:
    """A document a trigger cannot take whole: `bad-input` for it, and its error document.

    The error document (BadInput) refers to the input record, which stays on its topic.
    """
    reason = (f"{why}: trigger {trigger.name!r} does not take it; the record stays on "
              f"its topic")
    record = bad_input(trigger.name, doc.identity, doc.activation, doc.ts, doc.topic,
                       doc.partition, doc.offset, reason, doc.position)
    error = error_output(trigger, [reference(doc)], doc.key or doc.activation, doc.identity,
                         doc.activation, "BadInput", reason, 0)
    return record, error
