"""Every record the worker writes fits the broker's record limit (ONCEFLOW_MAX_RECORD_BYTES).

A broker refuses a record batch larger than its `message.max.bytes` (Apache Kafka: 1048588
by default), and a refused record fails the worker's whole batch, again after every
restart.  What the worker derives from a document can be larger than the document (an
error document wraps its members, a join holds several, the dead-letter copy of a value
that is not UTF-8 has three bytes for each bad one), so the worker measures what it writes:

- output, error, in-doubt, reply-to and dead-letter records that would not fit go out by
  reference: the input records they came from stay on their topics, and the record says
  where they are, how large the copy would have been and why it was left out;
- journal records clip their longest fields (an identity of a megabyte, a reason quoting
  one);
- documents that cannot be routed or held within the limit are bad input for their
  trigger (see agents/partition_worker.py), and so are those an open join cannot keep (the
  core refuses them, asking join_state_fits: onceflow.joins.JoinBook);
- what ingress itself stores under a record's own strings (the duplicate-ID cache: the
  `dup-id` and the message id; history keys and joins: the activation) is bounded by the
  core, in every runner: a record whose `dup-id`, activation, or (with a `dup-id`) message
  id is longer than MAX_KEY_LENGTH characters is bad input at ingress
  (onceflow.ingress.keys_too_long).

Sizes are those of a record batch holding the one record: Kafka checks batches, and the
worker's producer never puts a record that does not fit beside others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson
from onceflow.envelope import Document
from onceflow.ingress import MAX_KEY_LENGTH, activation_too_long
from onceflow.journal import JournalRecord
from onceflow.outputs import Output, reference
from onceflow.tables.outbox import HEADER_OVERHEAD, RECORD_OVERHEAD, record_size
from onceflow.values import clip

__all__ = ["MAX_KEY_LENGTH", "SETTING", "activation_too_long", "clip", "fit", "fit_journal",
           "record_size", "reference", "rough_size", "too_large"]

SETTING: Final = "ONCEFLOW_MAX_RECORD_BYTES"
# Characters kept of a field clipped to make a record fit; equal to MAX_KEY_LENGTH, so
# that the dup-id, message id and activation are never clipped in journal records.
CLIP: Final = MAX_KEY_LENGTH
# orjson's encoder and Fragment as constants for encode (every output): compiled, a Final
# is read from a C static, `orjson.dumps` looked up on the module each time.
_dumps: Final = orjson.dumps
_Fragment: Final = orjson.Fragment


def output_size(output: Output, value: bytes, limit: int | None = None) -> int:
    """record_size of an output whose value is encoded as `value`.

    With a `limit`, an output that clearly fits (even if every character of its key and
    headers took four bytes) is not measured exactly: the answer is then only a bound.
    """
    headers = output.headers
    if limit is not None:
        chars = 0
        for name, text in headers.items():  # (a loop: a generator object a call, else)
            chars += len(name) + len(text)
        rough = rough_size(output.key, chars, len(headers), len(value))
        if rough <= limit:
            return rough
    key = output.key.encode() if output.key is not None else None
    return record_size(key, value, [(k, v.encode()) for k, v in headers.items()])


def rough_size(key: str | None, header_chars: int, headers: int, value: int) -> int:
    """output_size's bound: as if every character of the key and headers took four bytes.

    `header_chars`: the characters of the header names and values; `headers`: how many;
    `value`: the bytes of the encoded value.
    """
    return (RECORD_OVERHEAD + value + 4 * (len(key or "") + header_chars)
            + HEADER_OVERHEAD * headers)


def too_large(what: str, size: int, limit: int) -> str:
    """The reason a record goes out by reference."""
    return f"{what} {over_limit(size, limit)}"


def over_limit(size: int, limit: int) -> str:
    """How a record is too large: "is N bytes, more than ONCEFLOW_MAX_RECORD_BYTES (L)"."""
    return f"is {size} bytes, more than {SETTING} ({limit})"


def join_state_fits(prefix: str, limit: int) -> Callable[[str, Any], str | None]:
    """The record limit of one trigger's join table, as the core asks it (JoinBook).

    For an activation and the value its join would store: None when the changelog record
    fits, else how it is too large.
    """
    def fits(activation: str, state: Any) -> str | None:
        size = record_size((prefix + activation).encode(), orjson.dumps(state))
        return None if size <= limit else over_limit(size, limit)
    return fits


def _small_headers(headers: dict[str, str]) -> dict[str, str]:
    return {name: clip(value) for name, value in headers.items()}


def _small_key(key: str | None) -> str | None:
    return None if key is None else clip(key)


def encode(output: Output) -> bytes:
    """Encode an output's value once; later encodings (wire.add_outputs) reuse the bytes."""
    value = output.value
    data = _dumps(value)
    if type(value) is not _Fragment:
        output.value = _Fragment(data)
    return data


def fit(output: Output, kind: str, members: list[Document], limit: int) -> str | None:
    """Make an output fit the limit; the note for the journal when it went by reference.

    An output that fits keeps its value encoded (an orjson.Fragment); one that does not
    gets a small dict in its place.  `kind` is "output" (a service result), "error",
    "reply" (a reply-to copy), "in-doubt" or "dead-letter"; `members` are the documents
    it came from.
    """
    original = output.value
    try:
        data = encode(output)
    except TypeError as exc:  # orjson cannot write it (a service's result, most likely)
        return _unwritable(output, kind, members, exc)
    size = output_size(output, data, limit)
    if size <= limit:
        return None
    if type(original) is orjson.Fragment:
        original = orjson.loads(data)
    if kind == "dead-letter" and isinstance(original, dict) and _clip_headers(output, original,
                                                                             limit):
        return None
    refs = [reference(member) for member in members]
    if kind == "output":
        note = (f"{too_large('the service result', size, limit)}: it was not published; "
                f"{output.topic} has a record saying so")
        value: dict[str, Any] = {"trigger": output.headers.get("trigger"),
                                 "identity": clip(output.headers.get("identity", "")),
                                 "activation": _clip_or_none(output.headers.get("activation")),
                                 "documents": refs}
    elif kind in ("error", "reply") and isinstance(original, dict):
        what = "the error document" if kind == "error" else "the reply-to copy"
        note = f"{too_large(what, size, limit)}: it refers to the input records"
        value = {name: _clipped(field) for name, field in original.items()
                 if name != "documents"}
        value["documents"] = refs
    elif kind == "dead-letter" and isinstance(original, dict):
        note = f"{too_large('the dead-letter copy', size, limit)}: it refers to the record"
        value = {name: _clipped(field) for name, field in original.items()
                 if name not in ("value", "raw")}
        value["reason"] = f"{value.get('reason', '')} ({note})"
        if members:
            value["document"] = refs[0]
    else:
        what = f"the {kind} document"
        note = f"{too_large(what, size, limit)}: it refers to the input record"
        value = {"documents": refs}
    value["oversized"] = {"size": size, "limit": limit, "reason": note}
    output.value = value
    output.headers = _small_headers(output.headers)
    output.key = _small_key(output.key)
    if output_size(output, orjson.dumps(value)) > limit:
        # The references themselves (a join of thousands of members): the first ten.
        value["documents"] = refs[:10]
        value["oversized"]["documents"] = len(refs)
    return note


def printable(text: str) -> str:
    """Text any JSON writer takes: lone surrogates (undecodable bytes) as escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _unwritable(output: Output, kind: str, members: list[Document], exc: TypeError) -> str:
    """An output JSON cannot hold (a set, an integer over 64 bits, 255 levels deep...).

    Like an output too large: replaced by a record that refers to the input records and
    says why; the note goes to the journal records of its documents.
    """
    what = "the service result" if kind == "output" else f"the {kind} document"
    note = (f"{what} cannot be written as JSON ({printable(f'{type(exc).__name__}: {exc}')})"
            f": it was not published; {output.topic} has a record saying so")
    headers = {name: printable(value) for name, value in output.headers.items()}
    value: dict[str, Any] = {"documents": [reference(member) for member in members][:10],
                             "unwritable": {"reason": note}}
    for name in ("trigger", "identity", "activation"):
        if name in headers:
            value[name] = clip(headers[name])
    output.value = value
    output.headers = _small_headers(headers)
    output.key = _small_key(None if output.key is None else printable(output.key))
    return note


def _clip_headers(output: Output, original: dict[str, Any], limit: int) -> bool:
    """A dead-letter copy made to fit by clipping the record's headers (a huge dup-id).

    True when it fits so, its value kept whole; False leaves the output as it was.
    """
    headers = original.get("headers")
    if not isinstance(headers, dict):
        return False
    small = {name: clip(value) if isinstance(value, str) else value
             for name, value in headers.items()}
    if small == headers:
        return False
    value = {**original, "headers": small,
             "clipped": f"headers clipped to {CLIP} characters to fit {SETTING} ({limit})"}
    data = orjson.dumps(value)
    key, kafka_headers = output.key, output.headers
    output.key, output.headers = _small_key(key), _small_headers(kafka_headers)
    if output_size(output, data) > limit:
        output.key, output.headers = key, kafka_headers
        return False
    output.value = orjson.Fragment(data)
    return True


def _clip_or_none(text: str | None) -> str | None:
    return None if text is None else clip(text)


def _clipped(field: Any) -> Any:
    """A field of a record made small: long strings clipped, containers summarized."""
    if isinstance(field, str):
        return clip(field)
    if isinstance(field, dict):
        encoded = orjson.dumps(field)
        if len(encoded) <= CLIP * 4:
            return field
        return {name: _clipped(value) for name, value in list(field.items())[:50]}
    if isinstance(field, list):
        return [_clipped(value) for value in field[:50]]
    return field


def fit_journal(record: JournalRecord, key: bytes | None, value: bytes, limit: int
                ) -> tuple[bytes | None, bytes]:
    """A journal record's key and value, with its longest fields clipped if it must."""
    if record_size(key, value) <= limit:
        return key, value
    data = record.as_dict()
    for name in ("identity", "activation", "reason", "topic", "trigger"):
        if isinstance(data.get(name), str):
            data[name] = clip(data[name])
    data["clipped"] = f"fields clipped to fit {SETTING} ({limit})"
    identity = data.get("identity")
    return (identity.encode() if identity is not None else None), orjson.dumps(data)
