"""Record values and headers as bytes and text: JSON decoding, nesting depth, header text.

Every runner reads a record's value and headers through these, so that a value that is
not JSON, or a header that is not UTF-8, is told apart the same way everywhere.
"""

from __future__ import annotations

import base64
from typing import Any, Final

import orjson

# How deep a document may nest arrays and objects, its envelope object being level 1.
# Every runner writes documents out again (routed, held, joined, dead-lettered, in error
# documents) inside a few levels of its own, and orjson writes at most 254 levels; a
# deeper document is bad input at ingress, in every runner alike.
MAX_DEPTH: Final = 128
# The longest string ingress stores under a record's own strings (ingress.MAX_KEY_LENGTH);
# what a record quotes is clipped to it.
KEY_LENGTH: Final = 1000


def clip(text: str, keep: int = KEY_LENGTH) -> str:
    """The text, or its first `keep` characters and how long it was."""
    if len(text) <= keep:
        return text
    return f"{text[:keep]}... ({len(text)} characters)"


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
