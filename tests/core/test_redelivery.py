"""Redelivery is a fact about offsets, never a header (issue 26 §3, spec sections 1-4).

The core's pieces: the delivery count max(D, H), the stand-in a runner verified, the
duplicate-ID cache, a join's interrupted run as one unit, expired members, the maximum
delivery count and resubmitted documents.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from engine_feed import Feed, engine_for
from onceflow.calls import Callee
from onceflow.engine import Engine
from onceflow.envelope import Document, Record, parse_coordinates, record_time
from onceflow.errors import ConfigError
from onceflow.ingress import DeliveryCounter, combined_count, header_ignored
from onceflow.joins import JoinBook
from onceflow.outputs import DEAD_LETTER_TOPIC
from onceflow.processor import Sink
from onceflow.triggers import TriggerDef, parse_triggers


def rec(offset: int, headers: dict[str, str] | None = None, redelivers: int | None = None,
        partition: int = 0) -> Record:
    return Record("t", partition, offset, 0, {}, None, headers or {}, redelivers)


# -- the delivery count ----------------------------------------------------------------------

def test_each_redelivery_of_an_offset_counts_one_more() -> None:
    counter = DeliveryCounter({})
    assert [counter.count(rec(o)) for o in (0, 1, 0, 0, 1, 2, 0)] == [1, 1, 2, 3, 2, 1, 4]


def test_counts_survive_a_restart_through_the_store_as_json() -> None:
    store: dict[str, Any] = {}
    counter = DeliveryCounter(store)
    for offset in (0, 1, 1, 1):
        counter.count(rec(offset))
    stored = json.loads(json.dumps(store))  # what a changelogged table gives back
    assert DeliveryCounter(stored).count(rec(1)) == 4
    assert DeliveryCounter(stored).count(rec(0)) == 2


def test_the_redelivered_offsets_kept_are_bounded_lowest_first() -> None:
    store: dict[str, Any] = {}
    counter = DeliveryCounter(store, max_redelivered=3)
    counter.count(rec(9))
    for offset in (1, 2, 3, 4):
        assert counter.count(rec(offset)) == 2
    assert sorted(store["t/0#again"], key=int) == ["2", "3", "4"]
    assert counter.count(rec(4)) == 3
    assert counter.count(rec(1)) == 2  # forgotten: still a redelivery, counted afresh


@pytest.mark.parametrize(("derived", "header", "expected"), [
    (1, None, 1), (2, None, 2), (1, "1", 1), (2, "1", 2), (3, "2", 3), (1, "5", 5),
    (2, "5", 5), (1, "junk", -1), (2, "junk", 2), (1, "0", -1), (3, "-1", 3),
    (1, "2147483648", -1), (2, "9" * 5000, 2), (1, "\u0663", -1), (2, " 2", 2),
])
def test_the_header_only_raises_the_count(derived: int, header: str | None,
                                          expected: int) -> None:
    assert combined_count(derived, header) == expected


def test_the_reason_says_an_invalid_header_was_ignored() -> None:
    assert header_ignored({}) is None and header_ignored({"delivery-count": "3"}) is None
    said = header_ignored({"delivery-count": "x" * 5000})
    assert said is not None and "ignored" in said and len(said) < 200
    engine = engine_for({"name": "t", "service": "scripted", "types": ["t"], "use_history": False})
    sink = engine.process(rec(0, {"delivery-count": "junk"}))
    (record,) = sink.journal
    assert record.outcome == "processed" and "ignored" in (record.reason or "")


def test_a_verified_stand_in_counts_as_a_delivery_of_the_offset_it_names() -> None:
    counter = DeliveryCounter({})
    assert counter.count(rec(0)) == 1
    assert counter.count(rec(5, redelivers=0)) == 2
    assert counter.count(rec(6, redelivers=0)) == 3
    assert counter.count(rec(0)) == 4  # the broker's own redelivery counts on from there
    assert counter.count(rec(7, redelivers=7)) == 1  # names itself: means nothing
    assert counter.count(rec(8, redelivers=-1)) == 1


def test_a_routed_document_keeps_its_count_and_each_route_redelivery_adds_one() -> None:
    counter = DeliveryCounter({})
    assert counter.routed("route", 0, 4, 1) == 1
    assert counter.routed("route", 0, 4, 1) == 2
    assert counter.routed("route", 0, 4, 1) == 3
    assert counter.routed("route", 0, 5, 2) == 2  # an input redelivery, routed once
    assert counter.routed("route", 0, 5, 2) == 3
    assert counter.routed("route", 0, 6, -1) == -1
    assert counter.routed("route", 0, 6, -1) == 2


@pytest.mark.parametrize(("text", "expected"), [
    ("orders/0@5", ("orders", 0, 5)), ("a.b-c_d/12@0", ("a.b-c_d", 12, 0)),
    ("", None), ("orders", None), ("orders/0", None), ("/0@5", None), ("orders/@5", None),
    ("orders/0@", None), ("orders/-1@5", None), ("orders/0@+5", None), ("orders/0@5 ", None),
    ("orders/\u0663@5", None), ("orders/0@" + "9" * 19, None), ("x" * 10_000 + "/0@1", None),
    ("orders/0@5\x00", None),
])
def test_coordinates_are_read_strictly(text: str, expected: Any) -> None:
    assert parse_coordinates(text) == expected


# -- the duplicate-ID cache ------------------------------------------------------------------

def test_a_spoofed_redelivery_with_a_cached_dup_id_is_dropped() -> None:
    engine = engine_for({"name": "t", "service": "scripted", "types": ["t"], "use_history": False})
    first = {"dup-id": "d", "message-id": "m"}
    assert [r.outcome for r in engine.process(rec(0, first)).journal] == ["processed"]
    spoof = {**first, "delivery-count": "2"}
    assert [r.outcome for r in engine.process(rec(1, spoof)).journal] == ["duplicate-id"]
    assert [r.outcome for r in engine.process(rec(0, first)).journal] == ["in-doubt"]
    assert [r.outcome for r in engine.process(rec(2, first, redelivers=0)).journal] == [
        "in-doubt"]


# -- joins -----------------------------------------------------------------------------------

def join_doc(identity: str, doc_type: str, offset: int, ts: float = 0,
             activation: str = "x") -> Document:
    """A document whose record time is `ts` seconds (kept in milliseconds)."""
    return Document(doc_type, identity, activation, {"uuid": identity}, record_time(ts),
                    doc_type, 0, offset, None, 1)


@pytest.mark.parametrize("serialize", [True, False])
def test_an_expired_join_remembers_its_members_until_the_history_ttl(serialize: bool
                                                                     ) -> None:
    trigger = TriggerDef(name="j", types=("a", "b"), join_timeout=10_000, history_ttl=100_000)
    store: dict[str, Any] = {}
    book = JoinBook(trigger, store, serialize=serialize)
    book.on_document(join_doc("a-1", "a", 3, ts=0))
    assert [a for a, _ in book.expire(11_000)] == ["x"]  # times in ms
    assert len(book) == 0 and book.get("x") is None and book.pending() == []
    assert book.expired(join_doc("a-1", "a", 3, ts=50))
    assert not book.expired(join_doc("a-1", "a", 4, ts=50))  # a re-sent copy is new
    if serialize:  # the marker survives a restart, and its time is indexed again
        book = JoinBook(trigger, json.loads(json.dumps(store)))
        assert book.next_deadline() == 110_000
    book.on_document(join_doc("b-1", "b", 9, ts=60))  # a new join; the marker stays
    assert book.expired(join_doc("a-1", "a", 3, ts=60)) and len(book) == 1
    assert book.expire(110_001) and not book.expired(join_doc("a-1", "a", 3, ts=110.001))
    assert book.expire(200_000) == [] and len(book.store) == 0  # everything forgotten


def test_an_expired_members_marker_holds_a_bounded_number_of_members() -> None:
    trigger = TriggerDef(name="j", types=("a", "b"), join_timeout=1_000, history_ttl=10**9)
    book = JoinBook(trigger, {})
    for n in range(100):
        book.on_document(join_doc(f"a-{n}", "a", n, ts=n * 10))
        book.expire(n * 10_000 + 5_000)
    assert len(book.store["x"]["gone"]["coords"]) == 64
    assert book.expired(join_doc("a-99", "a", 99, ts=1000))
    assert not book.expired(join_doc("a-0", "a", 0, ts=1000))


def test_an_interrupted_join_asks_the_resolver_once_with_the_join_document() -> None:
    asked: list[tuple[Any, Any]] = []

    def resolver(payload: Any, context: Any) -> str:
        asked.append((payload, context.identity))
        return "IN_DOUBT"

    triggers = parse_triggers({"trigger": [{"name": "j", "service": "scripted", "types": ["a", "b"],
                                            "resolver": "x:y"}]})
    engine = Engine(triggers, callees={"j": (Callee("s", lambda d: None, False, False),
                                             Callee("r", resolver, True, False))})
    engine.seed_history("j", "b-1", "processing", 5_000, activation="x")  # ms
    feed = Feed(engine)
    assert feed.send("a", 1, uuid="a-1", activation="x") == [("j", "join-pending", "a-1")]
    assert feed.send("b", 5, uuid="b-1", activation="x") == [("j", "in-doubt", "a-1"),
                                                            ("j", "in-doubt", "b-1")]
    assert asked == [({"activation": "x", "documents": {
        "a": {"uuid": "a-1", "activation": "x"}, "b": {"uuid": "b-1", "activation": "x"}}},
        "a-1+b-1")]
    (copy,) = feed.outputs
    assert copy.topic == "j.in-doubt" and set(copy.value["documents"]) == {"a", "b"}
    assert engine.processors["j"].joins.get("x") is None  # nothing waits any more


# -- max_delivery_count and resubmitted documents ---------------------------------------------

@pytest.mark.parametrize("value", [0, -1, True, "5", 1.5, 2**31])
def test_max_delivery_count_must_be_a_whole_number_from_1(value: Any) -> None:
    with pytest.raises(ConfigError, match="max_delivery_count"):
        parse_triggers({"trigger": [{"name": "t", "service": "scripted", "types": ["a"],
                                     "max_delivery_count": value}]})


def test_reaching_max_delivery_count_rejects_and_dead_letters_before_deciding() -> None:
    engine = engine_for({"name": "t", "service": "scripted",
                         "types": ["t"], "max_delivery_count": 2})
    assert [r.outcome for r in engine.process(rec(0)).journal] == ["processed"]
    sink = engine.process(rec(0))
    (record,) = sink.journal
    assert record.outcome == "rejected" and "delivery count 2" in (record.reason or "")
    (letter,) = [o for o in sink.outputs or [] if o.topic == DEAD_LETTER_TOPIC]
    assert letter.value["delivery_count"] == 2 and letter.value["identity"] == "t/0@0"


@pytest.mark.parametrize("table", [
    {"name": "t", "service": "scripted", "types": ["t"], "use_history": False},
    {"name": "t", "service": "scripted", "types": ["t"]},
    {"name": "t", "service": "scripted",
     "types": ["t"], "use_history": False, "resolver": "scripted"},
])
def test_a_resubmitted_document_is_new_whatever_its_count_or_history(table: Any) -> None:
    engine = engine_for(table)
    processor = engine.processors["t"]
    engine.process(rec(0))
    doc = Document("t", "t/0@0", None, {"body": {"resolve": "DUPLICATE"}}, 1, "t", 0, 0,
                   None, 7, resubmitted=True)
    sink = Sink()
    run = processor.take(doc, sink)
    assert run is not None and sink.journal == []
    assert Document.from_json(json.loads(json.dumps(doc.to_json()))).resubmitted
