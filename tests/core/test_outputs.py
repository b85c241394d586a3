"""The dead-letter copies the core builds for every runner (onceflow.outputs)."""

from __future__ import annotations

from onceflow.envelope import Document, Record
from onceflow.outputs import (
    DEAD_LETTER_TOPIC,
    Output,
    dead_letter,
    document_letter,
    output_headers,
    output_headers_text,
    output_letter,
    unread_letter,
)
from onceflow.triggers import TriggerDef


def test_a_record_letter_keeps_the_record_and_what_the_worker_read_aside() -> None:
    record = Record("orders", 1, 7, 12_500, {"uuid": "u-1"}, "k", {"a": "1"})
    letter = dead_letter(record, "no trigger", raw_key=b"\xff", null_headers=["n", "a"])
    assert (letter.topic, letter.key, letter.headers) == (DEAD_LETTER_TOPIC, "k",
                                                          {"reason": "no trigger"})
    assert letter.value == {"reason": "no trigger", "topic": "orders", "partition": 1,
                            "offset": 7, "ts": 12.5, "headers": {"a": "1", "n": None},
                            "value": {"uuid": "u-1"}, "key_base64": "/w=="}


def test_a_document_letter_is_its_record_letter_with_identity_and_delivery_count() -> None:
    doc = Document("a", "u-1", None, {"uuid": "u-1"}, 12_500, "orders", 1, 7, None, 3,
                   "k", {"h": "v"})
    letter = document_letter(doc, "too many", trigger="t")
    record = Record("orders", 1, 7, 12_500, {"uuid": "u-1"}, "k", {"h": "v"})
    assert letter.value == {**dead_letter(record, "too many").value, "identity": "u-1",
                            "delivery_count": 3, "trigger": "t"}


def test_an_unsent_output_and_an_unread_line_go_to_the_dead_letter_topic() -> None:
    doc = Document("a", "u-1", None, {}, 2_000, "orders", 0, 4, None, 1, None, {})
    letter = output_letter(Output("replies", "k", {"x": 1}, {"h": "v"}), doc,
                           "reply-to refused", reply_to="replies")
    assert letter.topic == DEAD_LETTER_TOPIC and letter.key == "k"
    assert letter.value == {"reason": "reply-to refused", "reply_to": "replies",
                            "topic": "orders", "partition": 0, "offset": 4, "ts": 2,
                            "headers": {"h": "v"}, "value": {"x": 1}}
    assert unread_letter("bad", "f.jsonl at 3", "{").value == {
        "reason": "bad", "where": "f.jsonl at 3", "raw": "{"}


def test_output_headers_text_counts_the_headers_output_headers_gives() -> None:
    for name, identity, activation in (("t", "u-1", None), ("bill", "ü-2", "order-7"),
                                       ("ß", "", ""), ("t", "x" * 300, None)):
        trigger = TriggerDef(name=name, types=("a",))
        headers = output_headers(trigger, identity, activation)
        assert output_headers_text(trigger, identity, activation) == (
            len(headers), sum(len(k) + len(v) for k, v in headers.items()))
