"""Ingress (spec sections 1 and 2): the duplicate-ID cache against a plain reference
model, delivery counts, envelope validation and routing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onceflow.engine import Engine
from onceflow.envelope import (
    BadEnvelope,
    Document,
    Record,
    check_envelope,
    parse_delivery_count,
    record_time,
    seconds,
)
from onceflow.ingress import MAX_KEY_LENGTH, DeliveryCounter, IdCache, Ingress
from onceflow.journal import JournalRecord
from onceflow.outputs import DEAD_LETTER_TOPIC
from onceflow.scenario import InputOffsets, parse_record_line
from onceflow.store import MemoryState
from onceflow.triggers import TriggerDef, parse_triggers
from onceflow.values import NotJson, decode_value, encode_value
from reference_models import ReferenceIdCache

# -- IdCache --------------------------------------------------------------------------------

def test_id_cache_size_two_overwrites_slot_zero_with_the_third_id() -> None:
    cache = IdCache({}, "t/0", 2)
    assert not cache.seen("d1", "m1", 101)
    assert not cache.seen("d2", "m2", 102)
    assert cache.ids() == ["d1", "d2"]
    assert not cache.seen("d3", "m3", 103)  # overwrites slot 0: d1 is gone
    assert "d1" not in cache and "d2" in cache and "d3" in cache
    assert cache.ids() == ["d2", "d3"]
    assert not cache.seen("d1", "m4", 104)  # d1 is accepted again, and evicts d2
    assert cache.seen("d3", "m5", 105)
    assert not cache.seen("d2", "m6", 106)


def test_id_cache_lets_the_first_carrier_through_again() -> None:
    cache = IdCache({}, "t/0", 10)
    assert not cache.seen("d1", "t/0@0", 0)
    assert not cache.seen("d1", "t/0@0", 0)  # the broker redelivering the same record
    assert not cache.seen("d1", "t/0@0", 0)  # and again
    assert cache.seen("d1", "t/0@7", 7)  # a re-sent copy
    assert cache.ids() == ["d1"]


def test_id_cache_drops_a_producer_retry_that_repeats_every_header() -> None:
    cache = IdCache({}, "t/0", 10)
    assert not cache.seen("d1", "m1", 0)
    assert cache.seen("d1", "m1", 1)  # same dup-id and message-id, a new offset
    assert cache.seen("d1", "m1", 2)  # whatever its delivery-count header says
    assert cache.seen("d1", "m2", 4)


def test_id_cache_drops_every_record_of_an_entry_without_an_offset() -> None:
    # Written before 0.9: no offset, so no record can be shown to be its first carrier.
    store: dict[str, Any] = {"t/0|d1": [0, "t/0@5"], "t/0#0": "d1", "t/0#next": 1}
    cache = IdCache(store, "t/0", 10)
    assert cache.seen("d1", "t/0@5", 5)
    assert cache.seen("d1", "t/0@5", 6)
    assert not cache.seen("d2", "t/0@7", 7)  # other ids are stored as usual, with offsets
    assert not cache.seen("d2", "t/0@7", 7)


def test_id_cache_survives_a_restart_over_its_store() -> None:
    store: dict[str, Any] = {}
    cache = IdCache(store, "t/0", 3)
    for i, dup in enumerate(["a", "b", "c", "d"]):
        cache.seen(dup, f"m{i}", i)
    again = IdCache(store, "t/0", 3)
    assert again.ids() == cache.ids() == ["b", "c", "d"]
    assert again.seen("b", "other", 107)
    assert not again.seen("e", "m9", 108)  # continues at the right slot: overwrites b
    assert again.ids() == ["c", "d", "e"]


def test_id_caches_of_two_partitions_share_a_store_but_not_their_ids() -> None:
    store: dict[str, Any] = {}
    p0, p1 = IdCache(store, "t/0", 2), IdCache(store, "t/1", 2)
    assert not p0.seen("d1", "m1", 109)
    assert not p1.seen("d1", "m2", 110)
    assert p0.seen("d1", "m3", 111) and p1.seen("d1", "m4", 112)
    p0.seen("x", "m5", 113)
    p0.seen("y", "m6", 114)  # evicts d1 from partition 0 only
    assert "d1" not in p0 and "d1" in p1


operations = st.lists(
    st.tuples(st.sampled_from(["d0", "d1", "d2", "d3", "d4", "d5"]),
              st.sampled_from(["m0", "m1", "m2"]), st.integers(0, 3), st.sampled_from([1, 2])),
    # (the delivery count is drawn and ignored: no header makes a record a redelivery)
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 5), ops=operations, restart_at=st.integers(0, 60))
def test_id_cache_equals_the_reference_model(size: int,
                                             ops: list[tuple[str, str, int, int]],
                                             restart_at: int) -> None:
    store: dict[str, Any] = {}
    cache = IdCache(store, "t/0", size)
    model = ReferenceIdCache(size)
    for i, (dup, mid, offset, count) in enumerate(ops):
        if i == restart_at:  # a persisted cache is rebuilt from its store
            cache = IdCache(store, "t/0", size)
        assert cache.seen(dup, mid, offset) == model.seen(dup, mid, offset, count)
        assert cache.ids() == model.ids()
        assert len(cache.ids()) <= size
    for dup in ["d0", "d1", "d2", "d3", "d4", "d5"]:
        assert (dup in cache) == (dup in model.first)


# -- delivery counts -------------------------------------------------------------------------

def rec(offset: int, headers: dict[str, str] | None = None, partition: int = 0,
        topic: str = "t", value: Any = None, ts: int = 0) -> Record:
    return Record(topic, partition, offset, ts, {} if value is None else value, None,
                  headers or {})


def test_delivery_count_derived_from_the_highest_offset_started() -> None:
    counter = DeliveryCounter({})
    assert counter.count(rec(0)) == 1
    assert counter.count(rec(1)) == 1
    assert counter.count(rec(1)) == 2  # same offset again: a redelivery
    assert counter.count(rec(0)) == 2  # at or below the highest started
    assert counter.count(rec(5)) == 1
    assert counter.count(rec(3)) == 2
    assert counter.highest("t", 0) == 5
    assert counter.count(rec(0, partition=1)) == 1  # partitions are counted apart
    assert counter.highest("t", 1) == 0
    assert counter.highest("t", 2) is None


def test_delivery_count_survives_a_restart_through_its_store() -> None:
    store: dict[str, Any] = {}
    DeliveryCounter(store).count(rec(4))
    after = DeliveryCounter(store)
    assert after.count(rec(4)) == 2
    assert after.count(rec(2)) == 2
    assert after.count(rec(5)) == 1


@pytest.mark.parametrize("header,expected", [
    ("1", 1), ("2", 2), ("17", 17), ("007", 7), ("2147483647", 2**31 - 1),
    ("-1", -1), ("0", -1), ("000", -1), ("garbage", -1), ("2.5", -1), ("", -1),
    # Only plain ASCII digits: int() would read these as 3, 10, 2, 3 and 2.
    (" 3 ", -1), ("1_0", -1), ("+2", -1), ("\u0663", -1), ("\uff12", -1), ("2\n", -1),
    # Above 2^31-1 (a Kafka INT32): undefined, however many digits.
    ("2147483648", -1), ("18446744073709551616", -1), ("9" * 5000, -1),
])
def test_delivery_count_header_only_raises_the_derived_count(header: str,
                                                              expected: int) -> None:
    assert parse_delivery_count(header) == expected
    counter = DeliveryCounter({})
    assert counter.count(rec(0, {"delivery-count": header})) == expected
    # On a redelivered offset (D = 2) the header can only raise the count; an invalid
    # one is ignored there (undefined only when D is 1).
    assert counter.count(rec(0, {"delivery-count": header})) == max(2, expected)


# -- envelope ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    {}, {"body": None}, {"type": "a", "uuid": "u", "activation": "x", "body": [1]},
    {"uuid": ""}, {"extra": 5, "reply-to": "r"},
])
def test_good_envelopes(value: Any) -> None:
    check_envelope(value)


@pytest.mark.parametrize("value,words", [
    (NotJson("x"), "not JSON"),
    ([1], "not an object"),
    ("s", "not an object"),
    (None, "not an object"),
    (3, "not an object"),
    ({"type": 1}, "'type'"),
    ({"uuid": None}, "'uuid'"),
    ({"uuid": ["u"]}, "'uuid'"),
    ({"activation": {"id": 1}}, "'activation'"),
    ({"activation": True}, "'activation'"),
])
def test_bad_envelopes_say_why(value: Any, words: str) -> None:
    with pytest.raises(BadEnvelope) as info:
        check_envelope(value)
    assert words in info.value.reason


def test_values_that_are_not_json_are_kept_as_text() -> None:
    assert decode_value(b'{"a": 1}') == {"a": 1}
    assert decode_value(b"[1]") == [1]
    assert decode_value(b"not json") == NotJson("not json")
    assert decode_value(b"") == NotJson("")
    assert decode_value(None) == NotJson("")
    assert encode_value(NotJson("raw \u00e9")) == "raw \u00e9".encode()
    assert decode_value(encode_value({"x": "y"})) == {"x": "y"}


def test_message_id_is_the_header_else_the_coordinates() -> None:
    assert rec(7, partition=2).message_id == "t/2@7"
    assert rec(7, {"message-id": "JMS-1"}).message_id == "JMS-1"
    assert rec(7, {"message-id": "JMS-1"}).given_message_id == "JMS-1"
    # An empty header gives no message id: the coordinates, for the document too.
    empty = rec(7, {"message-id": ""}, topic="order", value={"uuid": "u-7"})
    assert (empty.given_message_id, empty.message_id) == (None, "order/0@7")
    (_, document), = admit(make_ingress(), empty).routed[:1]
    assert (document.given_message_id, document.message_id) == (None, "order/0@7")


# -- Ingress.admit_into ------------------------------------------------------------------------


@dataclass(slots=True)
class Admitted:
    """What ingress made of one record: journal records, documents per trigger, why rejected."""

    journal: list[JournalRecord]
    routed: list[tuple[TriggerDef, Document]]
    rejected_reason: str | None


def admit(ingress: Ingress, record: Record, position: int = 0) -> Admitted:
    """One record through ingress, its results gathered for asserting."""
    journal: list[JournalRecord] = []
    document, targets, letter = ingress.admit_into(record, position, journal)
    routed = [(trigger, document) for trigger in targets] if document is not None else []
    return Admitted(journal, routed, None if letter is None else letter.value["reason"])


TRIGGERS = parse_triggers({
    "trigger": [
        {"name": "one", "service": "scripted", "types": ["order"]},
        {"name": "two", "service": "scripted", "types": ["order", "refund"], "condition": "any"},
        {"name": "inbox", "service": "scripted", "types": ["memo"], "topics": ["mail"]},
    ],
    "topic": {"order": {"id_cache_size": 2}, "mail": {"persist_id_cache": False}},
})


def make_ingress(state: MemoryState | None = None) -> Ingress:
    state = state or MemoryState()
    return Ingress(TRIGGERS, state.progress, state.id_store)


def test_made_up_document_types_are_rejected_and_do_not_grow_the_route_cache() -> None:
    # A producer inventing a type per record must not grow the worker's memory.
    ingress = make_ingress()
    for offset in range(2000):
        admitted = admit(ingress, rec(offset, topic="order",
                                     value={"uuid": f"u-{offset}", "type": f"t{offset}"}))
        assert [r.outcome for r in admitted.journal] == ["bad-input"]
        assert "no trigger takes document type" in admitted.journal[0].reason
    assert admit(ingress, rec(2000, topic="order", value={"uuid": "u"})).routed
    assert sum(len(by_type) for by_type in ingress._route_cache.values()) == 1


def test_admit_builds_the_document_and_routes_it_to_every_trigger_of_its_type() -> None:
    admitted = admit(make_ingress(),
        rec(0, {"message-id": "m-1"}, topic="order",
            value={"uuid": "u-1", "activation": "a", "body": 1}, ts=12500), position=4)
    assert admitted.journal == [] and admitted.rejected_reason is None
    assert [t.name for t, _ in admitted.routed] == ["one", "two"]
    document = admitted.routed[0][1]
    assert (document.type, document.identity, document.activation, document.ts) == (
        "order", "u-1", "a", 12500)
    assert (document.message_id, document.delivery_count, document.position) == (
        "m-1", 1, 4)


@pytest.mark.parametrize("value,headers,identity", [
    ({"uuid": "u-1"}, {}, "u-1"),
    ({}, {}, "order/0@0"),
    ({"uuid": ""}, {}, "order/0@0"),  # design 7: empty uuid -> message id
    ({}, {"message-id": "JMS-9"}, "JMS-9"),
    ({"uuid": "u-2"}, {"message-id": "JMS-9"}, "u-2"),
])
def test_identity_is_the_uuid_else_the_message_id(value: dict, headers: dict,
                                                  identity: str) -> None:
    admitted = admit(make_ingress(), rec(0, headers, topic="order", value=value))
    assert admitted.routed[0][1].identity == identity


def test_type_comes_from_the_field_else_the_topic() -> None:
    ingress = make_ingress()
    routed = admit(ingress, rec(0, topic="mail", value={"type": "memo"})).routed
    assert [(t.name, d.type) for t, d in routed] == [("inbox", "memo")]
    untyped = admit(ingress, rec(1, topic="mail", value={"uuid": "u"}))
    assert untyped.routed == []
    (record,) = untyped.journal
    assert (record.trigger, record.outcome, record.identity) == (None, "bad-input", "u")
    assert "'mail'" in (record.reason or "")


def test_a_topic_no_trigger_reads_is_bad_input() -> None:
    admitted = admit(make_ingress(), rec(0, topic="nobody", value={"uuid": "u"}))
    assert [(r.outcome, r.identity) for r in admitted.journal] == [("bad-input", "u")]
    assert admitted.rejected_reason


def test_dup_id_is_checked_per_partition_and_redelivery_passes() -> None:
    ingress = make_ingress()
    first = admit(ingress, rec(0, {"dup-id": "d"}, topic="order", value={"uuid": "u-1"}))
    assert len(first.routed) == 2
    again = admit(ingress, rec(1, {"dup-id": "d"}, topic="order", value={"uuid": "u-2",
                                                                         "activation": "x"}))
    assert [(r.trigger, r.outcome, r.identity, r.activation) for r in again.journal] == [
        (None, "duplicate-id", "u-2", "x")]
    assert again.routed == []
    redelivered = admit(ingress, rec(0, {"dup-id": "d"}, topic="order",
                                    value={"uuid": "u-1"}))
    assert len(redelivered.routed) == 2
    assert redelivered.routed[0][1].delivery_count == 2
    other_partition = admit(ingress, rec(0, {"dup-id": "d"}, topic="order", partition=1,
                                        value={"uuid": "u-3"}))
    assert len(other_partition.routed) == 2


def test_records_without_dup_id_are_never_dropped_by_the_cache() -> None:
    ingress = make_ingress()
    for offset in range(5):
        admitted = admit(ingress, rec(offset, topic="order", value={"uuid": "same"}))
        assert admitted.journal == [] and len(admitted.routed) == 2


def test_persisted_cache_survives_restart_and_the_memory_one_does_not() -> None:
    state = MemoryState()
    ingress = make_ingress(state)
    admit(ingress, rec(0, {"dup-id": "d"}, topic="order", value={"uuid": "o"}))
    admit(ingress, rec(0, {"dup-id": "d"}, topic="mail", value={"type": "memo", "uuid": "m"}))
    assert state.ids and state.volatile_ids
    # Restart: the changelogged state comes back, the in-memory caches do not.
    restarted = MemoryState()
    restarted.progress = state.progress
    restarted.ids = state.ids
    after = make_ingress(restarted)
    order = admit(after, rec(1, {"dup-id": "d"}, topic="order", value={"uuid": "o2"}))
    assert [r.outcome for r in order.journal] == ["duplicate-id"]
    mail = admit(after, rec(1, {"dup-id": "d"}, topic="mail",
                           value={"type": "memo", "uuid": "m2"}))
    assert mail.journal == [] and len(mail.routed) == 1


def test_bad_input_reaches_no_trigger_and_is_kept_in_the_dead_letter_topic() -> None:
    engine = Engine(TRIGGERS)
    out = engine.process(Record("order", 0, 0, 3000, NotJson("<xml/>"), "k",
                                {"message-id": "m-7"}), 0)
    assert [(r.trigger, r.outcome, r.identity, r.activation, r.ts) for r in out.journal] == [
        (None, "bad-input", "m-7", None, 3000)]
    (dead,) = out.outputs
    assert dead.topic == DEAD_LETTER_TOPIC
    assert dead.value["raw"] == "<xml/>"
    assert "not JSON" in dead.value["reason"]
    # The worker goes on: the next record is processed.
    out = engine.process(Record("order", 0, 1, 4000, {"uuid": "u"}), 1)
    assert sorted(r.outcome for r in out.journal) == ["processed", "processed"]


# -- one limit for the keys ingress stores, in every runner (issue 8 item 7) ------------------

@pytest.mark.parametrize(("headers", "value", "why"), [
    ({"dup-id": "d" * (MAX_KEY_LENGTH + 1)}, {"uuid": "u-1"}, "the dup-id is longer"),
    ({}, {"uuid": "u-1", "activation": "a" * (MAX_KEY_LENGTH + 1)}, "the activation is longer"),
    ({"dup-id": "d", "message-id": "m" * (MAX_KEY_LENGTH + 1)}, {"uuid": "u-1"},
     "the message-id of a record with a dup-id is longer"),
])
def test_keys_longer_than_the_limit_are_bad_input_with_activation_null(
        headers: dict[str, str], value: dict[str, Any], why: str) -> None:
    ingress = make_ingress()
    admitted = admit(ingress, rec(0, headers, topic="order", value=value))
    (record,) = admitted.journal
    assert (record.trigger, record.outcome, record.identity, record.activation) == (
        None, "bad-input", "u-1", None)
    assert why in (record.reason or "") and admitted.rejected_reason == record.reason
    assert admitted.routed == []
    # Nothing of it was stored: the same dup-id, within the limit, is new.
    assert "d" * (MAX_KEY_LENGTH + 1) not in ingress.cache("order", 0)


def test_keys_of_exactly_the_limit_are_taken() -> None:
    admitted = admit(make_ingress(), rec(0, {"dup-id": "d" * MAX_KEY_LENGTH}, topic="order",
                                        value={"activation": "a" * MAX_KEY_LENGTH}))
    assert admitted.journal == [] and admitted.routed


def test_a_producer_retry_repeating_dup_id_and_message_id_is_dropped() -> None:
    ingress = make_ingress()
    headers = {"dup-id": "d", "message-id": "m-1"}
    assert admit(ingress, rec(0, dict(headers), topic="order", value={"uuid": "u"})).routed
    retry = admit(ingress, rec(1, dict(headers), topic="order", value={"uuid": "u"}))
    assert [r.outcome for r in retry.journal] == ["duplicate-id"]
    redelivery = admit(ingress, rec(0, dict(headers), topic="order", value={"uuid": "u"}))
    assert redelivery.routed and redelivery.routed[0][1].delivery_count == 2
    resend = admit(ingress, rec(2, {**headers, "delivery-count": "2"}, topic="order",
                               value={"uuid": "u"}))
    assert [r.outcome for r in resend.journal] == ["duplicate-id"]  # headers prove nothing
    stand_in = rec(3, {**headers, "delivery-count": "2"}, topic="order", value={"uuid": "u"})
    stand_in.redelivers = 0  # a live replay's marker, verified by the runner
    admitted = admit(ingress, stand_in)
    assert admitted.routed and admitted.routed[0][1].delivery_count == 3  # its 2nd redelivery
    stand_in = rec(4, dict(headers), topic="order", value={"uuid": "u"})
    stand_in.redelivers = 4  # names itself: means nothing, an ordinary resend
    assert [r.outcome for r in admit(ingress, stand_in).journal] == ["duplicate-id"]


# -- record time (spec section 7) --------------------------------------------------------------

@pytest.mark.parametrize(("ts", "ms"), [
    (1.2501, 1250), (1.2505001, 1251), (5, 5000), (0.0004, 0),
    (1700000000.1234, 1700000000123), (10.001, 10001), (20.001, 20001),
])
def test_record_time_is_whole_milliseconds(ts: float, ms: int) -> None:
    got = record_time(ts)
    assert got == ms and type(got) is int


@pytest.mark.parametrize("ts", [float("inf"), float("-inf"), float("nan")])
def test_a_record_time_that_is_not_finite_is_refused(ts: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        record_time(ts)


@pytest.mark.parametrize(("ms", "reported"), [
    (5000, 5), (0, 0), (1250, 1.25), (20001, 20.001), (1700000000123, 1700000000.123),
    (-1, -0.001),
])
def test_the_journal_reports_milliseconds_as_seconds(ms: int, reported: float) -> None:
    got = seconds(ms)
    assert got == reported and type(got) is type(reported)
    assert record_time(got) == ms  # and reads back as the same time


def test_record_time_rounds_as_round_does() -> None:
    # Ties go to the even millisecond, negatives included; reported back in seconds as
    # the nearest float to the rounded value.
    import random

    picks = random.Random(7)
    values = [0.0, -0.0, 0.0005, 0.0015, 0.0025, -0.0005, -0.0015, 2.5e-3, 1e-9,
              2.0 ** 51 / 1000, 2.0 ** 51 / 1000 - 0.0005, -(2.0 ** 51) / 1000, 2.0 ** 52 / 1000,
              1.5 * 2.0 ** 52 / 1000, 9007199254740.993, 1e15, -1e15]
    values += [picks.uniform(-1e10, 1e10) for _ in range(20_000)]
    values += [picks.randrange(-10**12, 10**12) / 1000 + 0.0005 for _ in range(20_000)]
    values += [picks.randrange(0, 2**60) / 1000 for _ in range(5_000)]
    for ts in values:
        got = record_time(ts)
        assert got == round(ts * 1000.0) and type(got) is int, ts
        assert float(seconds(got)) == round(ts * 1000.0) / 1000, ts


def test_scenario_records_are_read_at_millisecond_resolution() -> None:
    record = parse_record_line({"ts": 1.2501, "topic": "t", "value": {}},
                               InputOffsets())
    assert record.ts == 1250
