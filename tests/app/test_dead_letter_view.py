"""What the console shows of a dead-letter record, whatever the record holds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from onceflow.app.dead_letters import PREVIEW_CHARS, dead_letter_item


def record(value: bytes | None, *, key: bytes | None = b"k", headers: Any = (),
           timestamp: Any = 1_700_000_000_000) -> Any:
    return SimpleNamespace(partition=3, offset=9, timestamp=timestamp, key=key, value=value,
                           headers=headers)


def test_a_copy_onceflow_wrote_gives_its_reason_coordinates_and_value() -> None:
    body = {"reason": "the value is not JSON", "topic": "orders", "partition": 1,
            "offset": 42, "ts": 12.5, "headers": {"dup-id": "d-1"}, "raw": "<b>x</b>"}
    item = dead_letter_item(record(orjson.dumps(body), headers=[("reason", b"header says")]))
    assert item["reason"] == "the value is not JSON"  # the copy's own, not the header's
    assert item["original"] == {"topic": "orders", "partition": 1, "offset": 42, "ts": 12.5}
    assert item["original_headers"] == {"dup-id": "d-1"}
    assert item["preview"] == "<b>x</b>" and item["onceflow_copy"] is True
    assert (item["partition"], item["offset"], item["ts"]) == (3, 9, 1_700_000_000.0)


@pytest.mark.parametrize("value", [
    b"\xff\xfe\x00", b"", b"null", b"[1]", b'"text"', b"{", b'{"reason": 5, "topic": 1}',
    orjson.dumps({"topic": "t", "partition": True, "offset": 1}),
    orjson.dumps({"topic": "t", "partition": 0, "offset": 1.5}),
    orjson.dumps({"headers": [1, 2], "value": None}),
    b'{"value": ' + b"[" * 600 + b"]" * 600 + b"}"])
def test_anything_else_is_shown_as_text_and_never_fails(value: bytes) -> None:
    item = dead_letter_item(record(value, key=b"\xff", headers=None, timestamp=None))
    assert item["original"] is None and item["ts"] is None and item["key"] == "\ufffd"
    assert isinstance(item["preview"], str) and len(item["preview"]) <= PREVIEW_CHARS + 40
    orjson.dumps(item)  # the view can always answer it


def test_null_values_and_null_header_values_stay_null() -> None:
    item = dead_letter_item(record(None, key=None, headers=[("reason", None), ("x", b"1")]))
    assert item["preview"] is None and item["key"] is None and item["value_bytes"] == 0
    assert item["headers"] == {"reason": None, "x": "1"} and item["reason"] is None


def test_long_texts_are_clipped_saying_how_long_they_were() -> None:
    body = {"reason": "r" * 5000, "topic": "t", "partition": 0, "offset": 0,
            "value": {"text": "v" * 10_000}}
    item = dead_letter_item(record(orjson.dumps(body), key=b"k" * 3000,
                                   headers=[(f"h{i}", b"x") for i in range(50)]))
    assert item["reason"].endswith("... (5000 characters)")
    assert item["key"].endswith("... (3000 characters)")
    assert item["preview"].startswith('{"text":"vvv') and item["preview"].endswith(
        "... (10011 characters)")
    assert len(item["headers"]) == 20
