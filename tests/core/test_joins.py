"""Join conditions (seed 003, spec section 4): the state machines, the JoinBook, and the
same paths through the processor and the engine with time moved by hand.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onceflow.calls import CallContext, Callee
from onceflow.durations import parse_duration
from onceflow.engine import Engine
from onceflow.envelope import Document, Record, record_time, seconds
from onceflow.joins import (
    COMPLETE,
    DISCARDED,
    PENDING,
    AllJoin,
    JoinBook,
    JoinDocument,
    OnlyOneJoin,
)
from onceflow.journal import JournalRecord
from onceflow.store import MemoryState
from onceflow.triggers import TriggerDef, parse_triggers


def doc(identity: str, type_: str, activation: str | None = "act", ts: float = 0.0,
        body: Any = None, offset: int = 0) -> Document:
    """A document whose record time is `ts` seconds (kept in milliseconds)."""
    envelope: dict[str, Any] = {"uuid": identity, "body": body or {}}
    if activation is not None:
        envelope["activation"] = activation
    return Document(type=type_, identity=identity, activation=activation, envelope=envelope,
                    ts=record_time(ts), topic=type_, partition=0, offset=offset,
                    message_id=f"{type_}/0@{offset}", delivery_count=1)


# -- AllJoin ------------------------------------------------------------------------------

def test_all_join_waits_for_every_type_then_completes_with_members_in_arrival_order() -> None:
    join = AllJoin(frozenset({"a", "b", "c"}), timeout=60_000)
    state, step = join.on_document(None, doc("c-1", "c", ts=10))
    assert step.kind == PENDING
    assert join.deadline(state) == 70_000  # first document ts + join_timeout, in ms
    state, step = join.on_document(state, doc("a-1", "a", ts=20))
    assert step.kind == PENDING
    assert join.deadline(state) == 70_000  # later members do not move the deadline
    state, step = join.on_document(state, doc("b-1", "b", ts=30))
    assert step.kind == COMPLETE
    assert state is None
    assert [m.identity for m in step.members] == ["c-1", "a-1", "b-1"]
    assert [m.ts for m in step.members] == [10_000, 20_000, 30_000]


def test_all_join_state_is_a_plain_json_value() -> None:
    join = AllJoin(frozenset({"a", "b"}), timeout=None)
    state, _ = join.on_document(None, doc("a-1", "a", ts=5, body={"x": [1, 2]}))
    restored = json.loads(json.dumps(state))
    assert join.deadline(restored) is None  # join_timeout none: never expires
    _, step = join.on_document(restored, doc("b-1", "b", ts=6))
    assert step.kind == COMPLETE
    assert step.members[0].envelope["body"] == {"x": [1, 2]}
    assert step.members[0].identity == "a-1"


def test_all_join_discards_a_second_instance_of_a_pending_type() -> None:
    join = AllJoin(frozenset({"a", "b"}), timeout=60_000)
    state, _ = join.on_document(None, doc("a-1", "a"))
    again, step = join.on_document(state, doc("a-2", "a", ts=1))
    assert step.kind == DISCARDED
    assert again == state  # the waiting a-1 is kept, a-2 is not
    assert "a-1" in step.reason
    _, step = join.on_document(again, doc("b-1", "b", ts=2))
    assert [m.identity for m in step.members] == ["a-1", "b-1"]


def test_a_redelivery_of_a_waiting_member_is_neither_joined_nor_discarded() -> None:
    join = AllJoin(frozenset({"a", "b"}), timeout=60_000)
    state, _ = join.on_document(None, doc("a-1", "a", offset=3))
    assert join.waiting(state, doc("a-1", "a", offset=3))  # the broker delivers it again
    assert not join.waiting(state, doc("a-1", "a", offset=4))  # a re-sent copy
    resent = doc("a-1", "a", offset=4)
    resent.given_message_id, resent.delivery_count = "a/0@3", 2
    assert not join.waiting(state, resent)  # headers claim a redelivery: a re-sent copy
    resent.redelivers = 3
    assert join.waiting(state, resent)  # a live replay's verified stand-in for one
    resent.redelivers = 4  # a marker naming its own (or a later) offset means nothing
    assert not join.waiting(state, resent)
    assert join.waiting(json.loads(json.dumps(state)), doc("a-1", "a", offset=3))
    assert not join.waiting(state, doc("b-1", "b", offset=3))
    assert not join.waiting(None, doc("a-1", "a", offset=3))


def test_all_join_timeout_drops_the_pending_documents() -> None:
    join = AllJoin(frozenset({"a", "b", "c"}), timeout=60_000)
    state, _ = join.on_document(None, doc("a-1", "a"))
    state, _ = join.on_document(state, doc("b-1", "b", ts=1))
    assert sorted(d.identity for d in join.on_timeout(state)) == ["a-1", "b-1"]


# -- OnlyOneJoin ----------------------------------------------------------------------------

def test_only_one_runs_the_first_and_discards_the_rest_of_the_window() -> None:
    join = OnlyOneJoin(timeout=30_000)
    state, step = join.on_document(None, doc("a-1", "a", ts=100))
    assert step.kind == COMPLETE
    assert [m.identity for m in step.members] == ["a-1"]
    assert join.deadline(state) == 130_000
    for other in (doc("b-1", "b", ts=101), doc("a-2", "a", ts=130)):
        kept, step = join.on_document(state, other)
        assert step.kind == DISCARDED
        assert kept == state
    assert join.on_timeout(state) == []  # a closing window drops nothing
    # After the time-out the book deletes the state: the next document opens a window.
    state, step = join.on_document(None, doc("b-2", "b", ts=131))
    assert step.kind == COMPLETE and join.deadline(state) == 161_000


def test_only_one_without_timeout_never_reopens() -> None:
    join = OnlyOneJoin(timeout=None)
    state, _ = join.on_document(None, doc("a-1", "a"))
    assert join.deadline(state) is None
    _, step = join.on_document(state, doc("a-2", "a", ts=10**9))
    assert step.kind == DISCARDED


# -- JoinBook -------------------------------------------------------------------------------

def all_trigger(timeout: int | None = 60_000, types: tuple[str, ...] = ("a", "b"),
                **more: Any) -> TriggerDef:
    return TriggerDef(name="j", types=types, condition="all", join_timeout=timeout, **more)


def test_join_book_keeps_one_join_per_activation() -> None:
    book = JoinBook(all_trigger(), {})
    assert book.on_document(doc("a-1", "a", "x", ts=0)).kind == PENDING
    assert book.on_document(doc("b-1", "b", "y", ts=1)).kind == PENDING
    assert len(book) == 2
    step = book.on_document(doc("b-2", "b", "x", ts=2))
    assert step.kind == COMPLETE
    assert [m.identity for m in step.members] == ["a-1", "b-2"]
    assert book.get("x") is None and book.get("y") is not None


def test_join_book_expires_only_after_the_deadline_has_passed() -> None:
    book = JoinBook(all_trigger(timeout=60_000), {})
    book.on_document(doc("a-1", "a", "x", ts=0))
    book.on_document(doc("a-2", "a", "y", ts=30))
    assert book.next_deadline() == 60_000
    assert book.expire(60_000) == []  # at the deadline the join is still open
    expired = book.expire(60_001)
    assert [(act, [d.identity for d in docs]) for act, docs in expired] == [("x", ["a-1"])]
    assert book.expire(90_000) == []
    assert [act for act, _ in book.expire(90_001)] == ["y"]
    assert len(book) == 0


def test_join_book_skips_stale_deadlines_of_completed_joins() -> None:
    book = JoinBook(all_trigger(timeout=60_000), {})
    book.on_document(doc("a-1", "a", "x", ts=0))
    book.on_document(doc("b-1", "b", "x", ts=10))  # completes
    book.on_document(doc("a-2", "a", "x", ts=70))  # a new join for x, deadline 130
    assert book.expire(100_000) == []  # the old deadline 60 must not drop the new join
    assert [d.identity for _, docs in book.expire(130_001) for d in docs] == ["a-2"]


def test_open_joins_survive_a_restart() -> None:
    store: dict[str, Any] = {}
    book = JoinBook(all_trigger(timeout=60_000), store)
    book.on_document(doc("a-1", "a", "x", ts=0))
    book.on_document(doc("a-2", "a", "y", ts=50))
    # A new worker builds its book over the same (changelogged) store.
    store = json.loads(json.dumps(store))
    after = JoinBook(all_trigger(timeout=60_000), store)
    assert after.next_deadline() == 60_000
    step = after.on_document(doc("b-1", "b", "y", ts=55))
    assert [m.identity for m in step.members] == ["a-2", "b-1"]
    assert [d.identity for _, docs in after.expire(60_001) for d in docs] == ["a-1"]


def test_join_book_restore_undoes_a_document() -> None:
    book = JoinBook(all_trigger(timeout=60_000), {})
    book.on_document(doc("a-1", "a", "x", ts=0))
    step = book.on_document(doc("b-1", "b", "x", ts=1))
    assert step.kind == COMPLETE and book.get("x") is None
    book.restore("x", step.previous)  # the run was suspended: a-1 waits again
    assert list(book.get("x")["members"]) == ["a"]
    assert [d.identity for _, docs in book.expire(60_001) for d in docs] == ["a-1"]


def test_join_book_refuses_a_trigger_without_join() -> None:
    with pytest.raises(ValueError):
        JoinBook(TriggerDef(name="s", types=("a",)), {})
    with pytest.raises(ValueError):
        JoinBook(TriggerDef(name="o", types=("a", "b"), condition="any"), {})


# -- through the engine, with time moved by hand ---------------------------------------------

class Recorder:
    """A service that keeps what it was given and fails when told to."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, CallContext]] = []

    def __call__(self, document: Any, context: CallContext) -> Any:
        self.calls.append((document, context))
        return {"seen": context.identity}


def engine_for(*triggers: dict[str, Any], service: Recorder | None = None,
               state: MemoryState | None = None) -> Engine:
    trigger_set = parse_triggers({"trigger": list(triggers)})
    callees = None
    if service is not None:
        callees = {t["name"]: (Callee("test:svc", service, True, False), None)
                   for t in triggers}
    return Engine(trigger_set, callees=callees, state=state)


class Feed:
    """Records in file order, with offsets per topic-partition like input.jsonl."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.offsets: dict[str, int] = {}
        self.position = 0

    def send(self, topic: str, ts: float, **value: Any) -> list[tuple[Any, ...]]:
        offset = self.offsets.get(topic, -1) + 1
        self.offsets[topic] = offset
        record = Record(topic, 0, offset, record_time(ts), value)
        out = self.engine.process(record, self.position)
        self.position += 1
        return [(r.trigger, r.outcome, r.identity, r.activation, seconds(r.ts))
                for r in out.journal]


FULFIL = {"name": "fulfil", "service": "scripted",
          "types": ["order", "payment"], "join_timeout": "1m"}


def test_service_gets_one_join_document_with_each_member_by_type() -> None:
    service = Recorder()
    feed = Feed(engine_for(FULFIL, service=service))
    assert feed.send("order", 0, uuid="o-1", activation="c", body={"n": 1}) == [
        ("fulfil", "join-pending", "o-1", "c", 0)]
    assert service.calls == []
    journal = feed.send("payment", 5, uuid="p-1", activation="c", body={"n": 2})
    assert journal == [("fulfil", "processed", "o-1", "c", 0),
                       ("fulfil", "processed", "p-1", "c", 5)]
    ((payload, context),) = service.calls
    assert isinstance(payload, JoinDocument)
    assert payload["activation"] == "c"
    assert payload["documents"]["order"]["body"] == {"n": 1}
    assert payload["documents"]["payment"]["body"] == {"n": 2}
    assert context.activation == "c"


def test_history_of_members_is_written_when_the_join_runs_not_while_pending() -> None:
    engine = engine_for(FULFIL)
    feed = Feed(engine)
    feed.send("order", 0, uuid="o-1", activation="c")
    assert dict(engine.state.history_store("fulfil")) == {}
    feed.send("payment", 7, uuid="p-1", activation="c")
    history = engine.processors["fulfil"].history
    assert history is not None
    for identity in ("o-1", "p-1"):
        entry = history.lookup("c\x1f" + identity, 7000)
        assert entry is not None and entry.completed and not entry.failed
        assert entry.started == 7000  # the start of the join's run


def test_a_redelivered_waiting_member_gets_no_terminal_record_before_its_join_ends() -> None:
    engine = engine_for(FULFIL)
    feed = Feed(engine)
    feed.send("order", 0, uuid="o-1", activation="c")
    again = engine.process(Record("order", 0, 0, 1000, {"uuid": "o-1", "activation": "c"}), 1)
    assert [(r.outcome, r.identity, r.offset) for r in again.journal] == [
        ("join-pending", "o-1", 0)]
    assert feed.send("payment", 2, uuid="p-1", activation="c") == [
        ("fulfil", "processed", "o-1", "c", 0), ("fulfil", "processed", "p-1", "c", 2)]


def advance(engine: Engine, ts: int) -> list[JournalRecord]:
    """Move the engine's partition time to ts by hand; the journal records it made."""
    made: list[JournalRecord] = []
    engine.partition.advance(ts, made)
    return made


def test_moving_time_by_hand_expires_a_join_exactly_after_its_deadline() -> None:
    engine = engine_for(FULFIL)
    feed = Feed(engine)
    feed.send("order", 0, uuid="o-1", activation="c")
    assert advance(engine, 60_000) == []  # at the deadline the join still accepts
    assert advance(engine, 59_000) == []  # time never goes back
    (record,) = advance(engine, 60_001)
    assert (record.trigger, record.outcome, record.identity, record.ts) == (
        "fulfil", "join-expired", "o-1", 0)
    # A later payment with that activation starts a new join.
    assert feed.send("payment", 61, uuid="p-1", activation="c") == [
        ("fulfil", "join-pending", "p-1", "c", 61)]


def test_a_record_past_the_deadline_expires_the_join_before_it_is_joined() -> None:
    feed = Feed(engine_for(FULFIL))
    feed.send("order", 0, uuid="o-1", activation="c")
    assert feed.send("payment", 61, uuid="p-1", activation="c") == [
        ("fulfil", "join-expired", "o-1", "c", 0),
        ("fulfil", "join-pending", "p-1", "c", 61),
    ]


def test_a_late_record_older_than_partition_time_does_not_expire_anything() -> None:
    engine = engine_for(FULFIL)
    feed = Feed(engine)
    feed.send("order", 100, uuid="o-1", activation="c")  # deadline 160
    feed.send("order", 10, uuid="o-2", activation="d")  # deadline 70, time stays 100
    assert engine.partition.now == 100_000
    assert feed.send("payment", 160, uuid="p-1", activation="c") == [
        ("fulfil", "join-expired", "o-2", "d", 10),
        ("fulfil", "processed", "o-1", "c", 100),
        ("fulfil", "processed", "p-1", "c", 160),
    ]


def test_xor_window_reopens_after_the_timeout() -> None:
    service = Recorder()
    feed = Feed(engine_for({"name": "pick", "service": "scripted",
                            "types": ["a", "b"], "condition": "only_one",
                            "join_timeout": "10s"}, service=service))
    assert feed.send("a", 0, uuid="a-1", activation="x")[0][1] == "processed"
    assert feed.send("b", 10, uuid="b-1", activation="x")[0][1] == "join-discarded"
    assert feed.send("b", 11, uuid="b-2", activation="x")[0][1] == "processed"
    # The service sees exactly the document that opened each window (for an XOR over
    # two types the core hands it as a one-member join document, by type).
    payloads = [payload for payload, _ in service.calls]
    assert all(isinstance(p, JoinDocument) for p in payloads)
    assert [list(p["documents"]) for p in payloads] == [["a"], ["b"]]
    winners = [p["documents"][t]["uuid"] for p, t in zip(payloads, "ab", strict=True)]
    assert winners == ["a-1", "b-2"]


def test_xor_over_one_type_listed_twice_gives_the_service_the_document_itself() -> None:
    service = Recorder()
    feed = Feed(engine_for({"name": "once", "service": "scripted",
                            "types": ["a", "a"], "condition": "only_one",
                            "join_timeout": "10s"}, service=service))
    assert feed.send("a", 0, uuid="a-1", activation="x")[0][1] == "processed"
    assert feed.send("a", 5, uuid="a-2", activation="x")[0][1] == "join-discarded"
    ((payload, _),) = service.calls
    assert payload["uuid"] == "a-1"


def test_or_condition_keeps_no_join_state() -> None:
    engine = engine_for({"name": "any", "service": "scripted",
                         "types": ["a", "b"], "condition": "any"})
    feed = Feed(engine)
    assert feed.send("a", 0, uuid="a-1", activation="x")[0][1] == "processed"
    assert feed.send("a", 1, uuid="a-2", activation="x")[0][1] == "processed"
    assert engine.processors["any"].joins is None


def test_a_join_that_failed_reports_error_for_each_member_and_one_error_document() -> None:
    engine = engine_for(FULFIL)
    feed = Feed(engine)
    feed.send("order", 0, uuid="o-1", activation="c")
    out = engine.process(Record("payment", 0, 0, 1000, {"uuid": "p-1", "activation": "c",
                                                     "body": {"raise": "fatal"}}), 1)
    assert [(r.outcome, r.identity) for r in out.journal] == [("error", "o-1"),
                                                              ("error", "p-1")]
    errors = [o for o in out.outputs if o.topic == "fulfil.error"]
    assert len(errors) == 1
    assert [d["uuid"] for d in errors[0].value["documents"]] == ["o-1", "p-1"]
    # A re-sent member of that join is rejected (its completed entry says failed).
    assert feed.send("order", 2, uuid="o-1", activation="c")[0][1] == "rejected"


def test_missing_activation_goes_to_the_error_topic_with_a_reason() -> None:
    engine = engine_for(FULFIL)
    out = engine.process(Record("order", 0, 0, 0, {"uuid": "o-1"}), 0)
    assert [(r.trigger, r.outcome) for r in out.journal] == [("fulfil", "bad-input")]
    (error,) = [o for o in out.outputs if o.topic == "fulfil.error"]
    assert "activation" in error.value["error"]["message"]
    assert error.value["documents"] == [{"uuid": "o-1"}]


def test_suspended_join_run_keeps_the_pending_member_and_resumes_to_completion() -> None:
    calls: list[str] = []

    def flaky(document: Any, context: CallContext) -> Any:
        calls.append(context.identity)
        if len(calls) == 1:
            from onceflow.errors import TransientError
            raise TransientError("warehouse API down")
        return {"ok": True}

    triggers = parse_triggers({"trigger": [dict(FULFIL, on_retry_failure="suspend")]})
    engine = Engine(triggers, callees={"fulfil": (Callee("t:f", flaky, True, False), None)})
    feed = Feed(engine)
    feed.send("order", 0, uuid="o-1", activation="c")
    assert feed.send("payment", 1, uuid="p-1", activation="c") == [
        ("fulfil", "suspended", "p-1", "c", 1)]
    # Nothing of the failed run stays in history, o-1 waits again, p-1 is held.
    assert dict(engine.state.history_store("fulfil")) == {}
    assert list(engine.processors["fulfil"].joins.get("c")["members"]) == ["order"]
    assert [d.identity for d in engine.held["fulfil"]] == ["p-1"]
    assert feed.send("order", 2, uuid="o-9", activation="e") == []  # held, no record
    out = engine.resume("fulfil")
    outcomes = [(r.outcome, r.identity) for r in out.journal]
    assert outcomes == [("resumed", None), ("processed", "o-1"), ("processed", "p-1"),
                        ("join-pending", "o-9")]
    assert engine.held["fulfil"] == []


def test_open_join_survives_an_engine_restart_over_the_same_state() -> None:
    first = engine_for(FULFIL)
    Feed(first).send("order", 0, uuid="o-1", activation="c")
    state = MemoryState()
    state.progress = first.state.progress
    state.ids = first.state.ids
    state.history = first.state.history
    state.joins = first.state.joins
    second = engine_for(FULFIL, state=state)
    feed = Feed(second)
    feed.offsets = {"order": 0}
    assert feed.send("payment", 30, uuid="p-1", activation="c") == [
        ("fulfil", "processed", "o-1", "c", 0), ("fulfil", "processed", "p-1", "c", 30)]


def test_restarted_engine_still_expires_joins_opened_before_the_restart() -> None:
    first = engine_for(FULFIL)
    Feed(first).send("order", 0, uuid="o-1", activation="c")
    second = engine_for(FULFIL, state=first.state)
    expired = advance(second, 61_000)
    assert [(r.outcome, r.identity, r.ts) for r in expired] == [("join-expired", "o-1", 0)]


# A join or window opened by a late record (deadline already behind partition time) is
# expired before the next record is looked at (design 4: expired when time > deadline).


def test_a_late_join_whose_deadline_is_behind_partition_time_cannot_complete() -> None:
    engine = engine_for(FULFIL)  # join_timeout 1m
    feed = Feed(engine)
    feed.send("order", 1000, uuid="o-0", activation="other")
    feed.send("order", 5, uuid="o-1", activation="c")  # deadline 65; time is 1000
    # The payment comes 995 s after o-1: the join expired long ago.
    assert feed.send("payment", 1000, uuid="p-1", activation="c") == [
        ("fulfil", "join-expired", "o-1", "c", 5),
        ("fulfil", "join-pending", "p-1", "c", 1000),
    ]


def test_a_late_xor_window_behind_partition_time_does_not_discard() -> None:
    feed = Feed(engine_for({"name": "pick", "service": "scripted",
                            "types": ["a", "b"], "condition": "only_one",
                            "join_timeout": "10s"}))
    feed.send("a", 1000, uuid="a-0", activation="other")
    feed.send("a", 5, uuid="a-1", activation="x")  # window until 15
    assert feed.send("b", 1000, uuid="b-1", activation="x") == [
        ("pick", "processed", "b-1", "x", 1000)]


# -- time in whole milliseconds (spec section 4) ---------------------------------------------
# In float seconds 10.001 + 10 is 20.000999999999998: a join opened at 10.001 with a 10 s
# time-out expired a document at exactly 20.001.  A deadline is t + d in whole ms: the
# join accepts a document at t + d and expires one millisecond later.

BOUNDARY_TRIGGERS = (
    {"name": "pair", "service": "scripted", "types": ["order", "payment"], "join_timeout": "10s"},
    {"name": "pick", "service": "scripted", "types": ["alert", "alert"], "condition": "only_one",
     "join_timeout": "10s"},
    {"name": "bill", "service": "scripted", "types": ["invoice"], "history_ttl": "10s"},
)


def boundary_outcomes(start: int, late_ms: int, timeout: str = "10s") -> dict[str, str]:
    """What each trigger makes of a second document `late_ms` after start + timeout (ms)."""
    d = parse_duration(timeout)
    assert d is not None
    triggers = [dict(t, join_timeout=timeout) if "join_timeout" in t
                else dict(t, history_ttl=timeout) for t in BOUNDARY_TRIGGERS]
    feed = Feed(engine_for(*triggers))
    feed.send("order", seconds(start), uuid="o-1", activation="c")
    feed.send("alert", seconds(start), uuid="a-1", activation="w")
    feed.send("invoice", seconds(start), uuid="i-1")
    at = seconds(start + d + late_ms)
    outcomes = {}
    for topic, value in (("payment", {"uuid": "p-1", "activation": "c"}),
                         ("alert", {"uuid": "a-2", "activation": "w"}),
                         ("invoice", {"uuid": "i-1"})):
        for trigger, outcome, identity, _, _ in feed.send(topic, at, **value):
            if identity in ("o-1", "a-2", "i-1"):
                outcomes[trigger] = outcome
    return outcomes


HELD = {"pair": "processed", "pick": "join-discarded", "bill": "duplicate"}
ENDED = {"pair": "join-expired", "pick": "processed", "bill": "processed"}


def test_a_join_a_window_and_a_history_entry_hold_at_t_plus_d_exactly() -> None:
    assert boundary_outcomes(10_001, 0) == HELD


def test_a_join_a_window_and_a_history_entry_end_one_millisecond_after_t_plus_d() -> None:
    assert boundary_outcomes(10_001, 1) == ENDED


def test_the_state_machines_keep_deadlines_in_whole_milliseconds() -> None:
    join = AllJoin(frozenset({"a", "b"}), timeout=10_000)
    state, _ = join.on_document(None, doc("a-1", "a", ts=10.001))
    assert join.deadline(state) == 20_001 and type(join.deadline(state)) is int
    window = OnlyOneJoin(timeout=10_000)
    state, _ = window.on_document(None, doc("a-1", "a", ts=10.001))
    assert window.deadline(state) == 20_001
    _, step = window.on_document(state, doc("a-2", "a", ts=20.001))
    assert step.kind == DISCARDED and "open until 1970-01-01T00:00:20.001Z" in step.reason


def test_an_only_one_window_without_timeout_says_it_never_closes() -> None:
    window = OnlyOneJoin(timeout=None)
    state, _ = window.on_document(None, doc("a-1", "a"))
    _, step = window.on_document(state, doc("a-2", "a", ts=5))
    assert step.kind == DISCARDED
    assert "None" not in step.reason and "join_timeout is none" in step.reason


def test_a_join_state_stored_in_seconds_by_an_earlier_version_is_read_in_ms() -> None:
    # Before time was kept in ms, a changelogged join held its deadline in seconds (a
    # float) and its members' "ts" in seconds.
    member = doc("a-1", "a", "x").to_json()
    del member["ts_ms"]
    member["ts"] = 10.001
    store: dict[str, Any] = {"x": {"deadline": 20.001, "members": {"a": member}}}
    book = JoinBook(all_trigger(timeout=10_000), store)
    assert book.next_deadline() == 20_001
    assert book.expire(20_001) == []
    step = book.on_document(doc("b-1", "b", "x", ts=20.001))
    assert step.kind == COMPLETE and [m.ts for m in step.members] == [10_001, 20_001]
    store["y"] = {"deadline": 20.001, "members": {"a": member}}
    book.rebuild_index()
    assert [(act, [d.ts for d in docs]) for act, docs in book.expire(20_002)] == [
        ("y", [10_001])]


@given(start=st.integers(min_value=0, max_value=4_000_000_000_000),
       timeout=st.sampled_from(["250ms", "1s", "10s", "1m", "2h", "1d"]))
@settings(max_examples=60, deadline=None)
def test_any_millisecond_start_holds_until_exactly_its_deadline(start: int,
                                                                 timeout: str) -> None:
    assert boundary_outcomes(start, 0, timeout) == HELD, (start, timeout)
    assert boundary_outcomes(start, 1, timeout) == ENDED, (start, timeout)
