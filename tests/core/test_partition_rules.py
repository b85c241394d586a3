"""The core's per-partition rules (onceflow.partition) and the versioned history values.

Replay and Spark drive them through Engine, the worker through agents/partition_worker.py: these
tests hold them to their contract once, whichever runner calls them.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_feed import Feed, engine_for
from onceflow.calls import Callee
from onceflow.envelope import Document
from onceflow.errors import HistoryUnavailable
from onceflow.history import (
    VERSION,
    History,
    HistoryEntry,
    decode_entry,
    encode_entry,
    state_keys,
)
from onceflow.journal import JournalRecord
from onceflow.keys import key_part, pair_key
from onceflow.partition import (
    ClockLimit,
    HeldInMemory,
    Partition,
    SweepHorizon,
    routing_key,
    seed_route,
)
from onceflow.runners import build_processors
from onceflow.store import MemoryState
from onceflow.triggers import parse_triggers


def partition_for(*tables: dict[str, Any]) -> tuple[Partition, MemoryState]:
    triggers = parse_triggers({"trigger": list(tables)})
    callees = {t.name: (Callee("test", lambda document: None, True, False), None)
               for t in triggers.triggers}
    state = MemoryState()
    processors = build_processors(triggers, callees, state.history_store, state.join_store,
                                  serialize_state=False)
    return Partition(processors, HeldInMemory(list(processors))), state


def doc(identity: str, ts: int = 0, activation: str | None = None) -> Document:
    envelope = {"uuid": identity, "activation": activation}
    return Document("a", identity, activation, envelope, ts, "a", 0, 0, identity, 1)


# -- time ---------------------------------------------------------------------------------

def test_partition_time_moves_only_forward_and_never_past_its_limit() -> None:
    partition, _ = partition_for({"name": "t", "service": "scripted", "types": ["a"]})
    journal: list[JournalRecord] = []
    assert partition.advance(100, journal) and partition.now == 100
    assert not partition.advance(50, journal) and partition.now == 100
    wall = [400]
    partition.clock = ClockLimit(lambda: wall[0], 100, "the skew (0.1 s)")
    assert partition.advance(10_000, journal) and partition.now == 500
    wall[0] = 300
    assert not partition.advance(10_000, journal) and partition.now == 500
    assert journal == []


def test_the_clock_limit_refuses_a_time_resets_a_stored_one_and_says_why() -> None:
    partition, _ = partition_for({"name": "t", "service": "scripted", "types": ["a"]})
    assert partition.time_refused(10**15) is None  # no clock (replay, Spark): no limit
    assert partition.start_at(10**15) is None and partition.now == 10**15
    wall = 1_800_000_000_000
    partition.clock = ClockLimit(lambda: wall, 60_000, "THE_SKEW (60 s)")
    why = partition.start_at(wall + 60_001)  # stored beyond the limit: from the wall clock
    assert partition.now == wall and why == (
        "its time 2027-01-15T08:01:00Z (1800000060.001) is 60.001 s ahead of this worker's "
        "clock, more than THE_SKEW (60 s): it would move partition time forward and expire "
        "every open join of the partition")
    assert partition.start_at(wall + 60_000) is None and partition.now == wall + 60_000
    assert partition.time_refused(wall + 60_001) == why
    assert partition.time_refused(wall + 60_000) is None
    partition.now = wall + 70_000  # a record at or behind partition time moves nothing
    assert partition.time_refused(wall + 61_000) is None
    assert partition.time_refused(wall + 61_000, tick=True) is not None  # a tick: checked


def test_a_join_expires_when_time_passes_its_deadline_and_on_a_late_record() -> None:
    partition, _ = partition_for({"name": "j", "service": "scripted",
                                  "types": ["a", "b"], "join": "all",
                                  "join_timeout": "10s"})
    processor = partition.processors["j"]
    journal: list[JournalRecord] = []
    partition.advance(0, journal)
    from onceflow.processor import Sink
    sink = Sink()
    processor.take(doc("u-1", 0, activation="act"), sink)
    assert [r.outcome for r in sink.journal] == ["join-pending"]
    partition.advance(10_000, journal)  # the deadline itself (ms): not expired
    assert journal == []
    partition.advance(5_000, journal)  # a late record: time stays, nothing is due yet
    assert journal == []
    partition.advance(10_001, journal)
    assert [(r.outcome, r.activation) for r in journal] == [("join-expired", "act")]


# -- sweeps -------------------------------------------------------------------------------

def test_sweeps_follow_each_triggers_interval_and_a_horizon_holds_them_back() -> None:
    partition, state = partition_for(
        {"name": "fast", "service": "scripted",
         "types": ["a"], "history_ttl": "1m", "history_sweep_interval": "1m"},
        {"name": "slow", "service": "scripted",
         "types": ["a"], "history_ttl": "1m", "history_sweep_interval": "1h"})
    for name in ("fast", "slow"):
        History(state.history_store(name), 60_000).mark_completed("old", 0, False)
    # Times in ms.
    assert partition.sweep_is_due(0)  # the first call only schedules...
    assert partition.sweep_due(0) == 0
    assert not partition.sweep_is_due(59_999)  # ...the sweep of "fast" one minute later
    assert partition.sweep_due(59_999) == 0
    assert partition.sweep_is_due(60_000)
    # Due for "fast", but no partition has seen past 30 s: nothing older than that goes.
    assert partition.sweep_due(61_000, horizon=30_000) == 0
    assert "old" in state.history_store("fast")
    assert partition.sweep_due(200_000) == 1
    assert "old" not in state.history_store("fast") and "old" in state.history_store("slow")
    assert partition.sweep_due(201_000, force="slow") == 1
    assert "old" not in state.history_store("slow")


def test_the_sweep_horizon_is_the_oldest_time_of_the_records_not_committed_yet() -> None:
    horizon = SweepHorizon()
    assert horizon.oldest({}) is None
    for offset, ts in enumerate([5_000, 1_000, 9_000]):
        horizon.handed(("a", 0), offset, ts)
    horizon.handed(("b", 0), 7, 3_000)
    assert horizon.oldest({}) == 1_000  # nothing committed: any of them may come again
    assert horizon.oldest({("a", 0): 2}) == 3_000  # offsets 0 and 1 are never handed again
    assert horizon.oldest({("b", 0): 8}) == 9_000
    assert horizon.oldest({("a", 0): 3, ("b", 0): 8}) is None


# -- suspension ---------------------------------------------------------------------------

class Refusing:
    """A holding (the worker's keeps documents in its control table) that refuses one."""

    def __init__(self, triggers: list[str]) -> None:
        self.inner = HeldInMemory(triggers)
        self.marks: list[tuple[str, str | None]] = []

    def add(self, trigger: str, doc: Document) -> str | None:
        if doc.identity == "too-big":
            return "too large to hold"
        return self.inner.add(trigger, doc)

    def drain(self, trigger: str) -> list[Document]:
        return self.inner.drain(trigger)

    def mark(self, trigger: str, reason: str | None) -> None:
        self.marks.append((trigger, reason))

    def suspensions(self) -> dict[str, str]:
        latest = dict(self.marks)
        return {name: reason for name, reason in latest.items() if reason is not None}


def test_holding_refuses_what_it_cannot_keep_and_resume_returns_the_rest_in_order() -> None:
    partition, _ = partition_for({"name": "t", "service": "scripted", "types": ["a"]})
    holding = Refusing(["t"])
    partition.holding = holding
    processor = partition.processors["t"]
    assert partition.resume(processor, "nothing held") == (None, [])
    partition.suspend(processor, "by command")
    assert processor.suspended and processor.suspended_reason == "by command"
    refused = partition.hold(processor, [doc("u-1"), doc("too-big"), doc("u-2")])
    assert [(d.identity, why) for d, why in refused] == [("too-big", "too large to hold")]
    record, docs = partition.resume(processor, "go on")
    assert record is not None and (record.trigger, record.outcome, record.reason) == (
        "t", "resumed", "go on")
    assert [d.identity for d in docs] == ["u-1", "u-2"]
    assert not processor.suspended and holding.inner.documents["t"] == []
    assert holding.marks == [("t", "by command"), ("t", None)]


# -- seeds and forgetting -----------------------------------------------------------------

def test_seed_keys_join_triggers_by_activation_and_others_by_identity() -> None:
    partition, state = partition_for(
        {"name": "s", "service": "scripted", "types": ["a"]},
        {"name": "j", "service": "scripted", "types": ["a", "b"], "join": "all"})
    assert partition.seed("s", "u-1", "completed", 5, activation="act")
    assert partition.seed("j", "u-1", "processing", 5, activation="act")
    assert not partition.seed("unknown", "u-1", "completed", 5)
    assert list(state.history_store("s")) == ["u-1"]
    assert list(state.history_store("j")) == ["act\x1fu-1"]


@pytest.mark.parametrize(("seeded", "only", "forgotten"), [
    (("processing",), "processing", True),
    (("processing", "completed"), "processing", False),
    (("processing", "completed"), "failed", False),
    (("processing", "failed"), "failed", True),
    ((), "processing", False),
])
def test_forget_removes_only_the_entry_it_is_asked_for(seeded: tuple[str, ...], only: str,
                                                        forgotten: bool) -> None:
    partition, state = partition_for({"name": "t", "service": "scripted", "types": ["a"]})
    for status in seeded:
        partition.seed("t", "u-1", "completed" if status == "failed" else status, 0,
                       failed=status == "failed")
    assert partition.forget("t", "u-1", only) is forgotten
    assert ("u-1" in state.history_store("t")) is (bool(seeded) and not forgotten)
    assert not partition.forget("unknown", "u-1", only)


# -- routing ------------------------------------------------------------------------------

def test_the_routing_key_is_the_activation_for_joins_and_the_identity_otherwise() -> None:
    triggers = parse_triggers({"trigger": [{"name": "s", "service": "scripted", "types": ["a"]},
                                           {"name": "j", "service": "scripted",
                                            "types": ["a", "b"], "join": "all"}]})
    simple, join = triggers.triggers
    assert routing_key(simple, doc("u-1", activation="act")) == "u-1"
    assert routing_key(join, doc("u-1", activation="act")) == "act"
    assert routing_key(join, doc("u-1")) == "u-1"
    assert seed_route(simple, "u-1", "act") == "u-1"
    assert seed_route(join, "u-1", "act") == "act"
    assert seed_route(join, "u-1", None) is None  # every activation: every partition


def test_state_keys_are_one_rule_for_every_trigger_and_document() -> None:
    triggers = parse_triggers({"trigger": [{"name": "s", "service": "scripted", "types": ["a"]},
                                           {"name": "j", "service": "scripted",
                                            "types": ["a", "b"], "join": "all"}]})
    simple, join = triggers.triggers
    odd = "x\x1fy"  # holds the separator: keys tell (x, y) from it
    assert state_keys(simple, odd, "act") == (odd, None)
    assert state_keys(join, odd, "act") == (pair_key("act", odd), "act")
    # A join document without an activation keeps no join, and its history key is the
    # one a seed loaded for every activation has (never a pair's).
    assert state_keys(join, odd, None) == (key_part(odd), None)
    assert state_keys(join, odd, None)[0] != state_keys(join, "y", "x")[0]


# -- stored history values ----------------------------------------------------------------

def test_history_values_carry_their_version_and_versions_1_and_2_are_still_read() -> None:
    assert encode_entry(12_500, 3) == [12_500, 3, VERSION]  # start time in ms
    assert decode_entry([12_500, 3, VERSION]) == (12_500, 3)
    # Versions 1 (no version) and 2 kept the start time in seconds.
    assert decode_entry([12.5, 3]) == (12_500, 3)
    assert decode_entry([12.5, 3, 2]) == (12_500, 3)
    assert decode_entry([10.001, 3, 2]) == (10_001, 3)  # rounded, not truncated
    store: dict[str, Any] = {"old": [10, 3], "v2": [10.0, 3, 2], "new": encode_entry(10_000, 7)}
    history = History(store, ttl=100_000)
    old, v2, new = (history.lookup(key, 50_000) for key in ("old", "v2", "new"))
    assert old == HistoryEntry(10_000, 3) and old.completed and not old.failed
    assert v2 == HistoryEntry(10_000, 3)
    assert new is not None and new.failed
    # An entry written in seconds expires on the same millisecond as one written in ms.
    assert history.lookup("v2", 110_000) is not None and history.lookup("v2", 110_001) is None
    assert history.expired_keys(110_001) == ["old", "v2", "new"]


@pytest.mark.parametrize("value", [
    [1, 3, VERSION + 1], [1, 3, 99, 4], [1], "1,3", {"started": 1}, 7, [1, 0], [1, 8],
    ["1", 3], [1, True], [True, 3], [1, 3.0], [float("nan"), "x"], [1.5, 3, VERSION],
    [float("nan"), 3], [float("inf"), 3, 2],
])
def test_a_history_value_this_version_cannot_read_makes_history_unavailable(value: Any) -> None:
    with pytest.raises(HistoryUnavailable, match="cannot read"):
        decode_entry(value)
    history = History({"k": value}, ttl=100)
    with pytest.raises(HistoryUnavailable):
        history.lookup("k", 0)
    assert history.expired_keys(10_000) == []  # kept, not swept


def test_a_document_whose_history_value_is_unreadable_is_in_doubt_not_run_again() -> None:
    calls: list[str] = []
    engine = engine_for({"name": "t", "service": "scripted", "types": ["a"]},
                        services={"t": lambda document, context: calls.append(context.identity)})
    engine.state.history_store("t")["u-1"] = [0, 3, VERSION + 1]  # from a newer version
    feed = Feed(engine)
    assert feed.send("a", 1, uuid="u-1") == [("t", "in-doubt", "u-1")]
    assert feed.send("a", 2, uuid="u-2") == [("t", "processed", "u-2")]
    assert calls == ["u-2"]


@pytest.mark.parametrize(("only", "forgotten"), [("processing", True), ("failed", False)])
def test_resubmitting_in_doubt_documents_removes_an_unreadable_value(only: str,
                                                                     forgotten: bool) -> None:
    partition, state = partition_for({"name": "t", "service": "scripted", "types": ["a"]})
    state.history_store("t")["u-1"] = [0, 3, VERSION + 1]
    assert partition.forget("t", "u-1", only) is forgotten
    assert ("u-1" in state.history_store("t")) is not forgotten


def test_a_partition_suspends_again_what_its_holding_recorded_before_a_restart() -> None:
    tables = ({"name": "t", "service": "scripted", "types": ["a"]},
              {"name": "u", "service": "scripted", "types": ["a"]})
    before, _ = partition_for(*tables)
    holding = Refusing(["t", "u"])
    before.holding = holding
    before.suspend(before.processors["t"], "by command")
    before.suspend(before.processors["u"], "by a run")
    before.resume(before.processors["u"], "go on")
    fresh, _ = partition_for(*tables)  # a restart: new processors, the same control table
    after = Partition(fresh.processors, holding)
    assert after.processors["t"].suspended
    assert after.processors["t"].suspended_reason == "by command"
    assert not after.processors["u"].suspended
    assert holding.marks == [("t", "by command"), ("u", "by a run"), ("u", None)]  # no mark


@pytest.mark.parametrize("failing", ["get", "__setitem__", "__contains__"])
def test_a_store_failure_is_history_unavailable_caused_by_it(failing: str) -> None:
    # The cause is kept in the compiled core too (mypyc drops `raise ... from`).
    broken = OSError("no space left on device")

    def fail(*_: Any) -> Any:
        raise broken

    store = type("FailingStore", (dict,), {failing: fail})()
    history = History(store, ttl=100)
    with pytest.raises(HistoryUnavailable) as raised:
        if failing == "get":
            history.lookup("k", 5)
        elif failing == "__setitem__":
            history.mark_completed("k", 5, failed=False)
        else:
            history.remove("k")
    assert raised.value.__cause__ is broken
    assert "no space left on device" in str(raised.value)
