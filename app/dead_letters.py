"""The dead-letter topic as the console shows it: the newest records, each summed up safely.

`onceflow.dead-letter` holds a copy of every record the worker could not use (bad input,
a refused route record, a record the worker failed on): a JSON object with the reason, the
record's coordinates, its headers and its value (or its raw text), keyed by the record's
key (core outputs.dead_letter).  Anyone with write access to the topic can put anything
there too, so nothing is assumed of a record: a value that is not JSON, not an object,
nested too deep to write again, a null header value or a binary key is shown as text, and
every text is clipped.  The page sets it as text only, so markup in it is never run.
"""

from __future__ import annotations

from typing import Any

import orjson

DEFAULT_DEAD_LETTERS = 50  # records listed when the request does not say
MAX_DEAD_LETTERS = 100  # the most one request lists (each record is read whole)
PREVIEW_CHARS = 1000  # of the value
TEXT_CHARS = 1000  # of the reason, the key, a header value
MAX_HEADERS = 20  # the original record's headers shown


def clipped(text: str, limit: int = TEXT_CHARS) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def as_text(data: bytes | None, limit: int = TEXT_CHARS) -> str | None:
    """Bytes as text (a byte that is not UTF-8 shows as U+FFFD), clipped; None stays None."""
    if data is None:
        return None
    return clipped(data.decode("utf-8", "replace"), limit)


def _whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def dead_letter_item(record: Any) -> dict[str, Any]:
    """What the console shows of one dead-letter record (an aiokafka ConsumerRecord).

    `reason` is the copy's own (else its `reason` header), `original` the coordinates of
    the record it copies (null when the copy does not say), `preview` the start of the
    value it kept: the JSON value written again, or the raw text of a value that was not
    JSON; for a record that is not onceflow's copy, its whole value as text.
    """
    headers: dict[str, str | None] = {}
    for name, data in record.headers or ():
        if len(headers) < MAX_HEADERS:
            headers[clipped(str(name), 200)] = as_text(data)
    value: bytes | None = record.value
    body: Any = None
    if value is not None:
        try:
            body = orjson.loads(value)
        except orjson.JSONDecodeError:
            body = None
    reason = headers.get("reason")
    original = None
    preview: str | None = None
    kept: dict[str, str] = {}
    if isinstance(body, dict):
        if isinstance(body.get("reason"), str):
            reason = body["reason"]
        topic, partition, offset = body.get("topic"), body.get("partition"), body.get("offset")
        if isinstance(topic, str) and _whole_number(partition) and _whole_number(offset):
            original = {"topic": clipped(topic, 300), "partition": partition,
                        "offset": offset,
                        "ts": body.get("ts") if isinstance(body.get("ts"), int | float)
                        and not isinstance(body.get("ts"), bool) else None}
        if isinstance(body.get("headers"), dict):
            for name, data in list(body["headers"].items())[:MAX_HEADERS]:
                kept[clipped(str(name), 200)] = clipped(str(data), TEXT_CHARS)
        if "value" in body:
            try:
                preview = orjson.dumps(body["value"]).decode()
            except orjson.JSONEncodeError:  # nested deeper than orjson writes
                preview = None
        elif isinstance(body.get("raw"), str):
            preview = body["raw"]
    if preview is None and value is not None:
        preview = value.decode("utf-8", "replace")
    return {"partition": record.partition, "offset": record.offset,
            "ts": record.timestamp / 1000 if _whole_number(record.timestamp) else None,
            "key": as_text(record.key), "reason": clipped(reason) if reason else None,
            "original": original, "original_headers": kept,
            "preview": None if preview is None else clipped(preview, PREVIEW_CHARS),
            "value_bytes": len(value) if value is not None else 0,
            "onceflow_copy": original is not None, "headers": headers}
