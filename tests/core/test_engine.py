"""The engine and a trigger's processor: outputs, suspension and resumption, history that
cannot be read or written, history sweeps, and the edges found while testing the core.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from engine_feed import Feed, engine_for
from onceflow.app.replay import replay_scenario
from onceflow.calls import CallContext, Callee
from onceflow.engine import Engine
from onceflow.errors import TransientError
from onceflow.scenario import load_scenario
from onceflow.store import MemoryState
from onceflow.triggers import parse_triggers

# -- outputs -----------------------------------------------------------------------------------

def test_result_goes_to_the_output_topic_with_a_deterministic_dup_id() -> None:
    feed = Feed(engine_for({"name": "bill", "service": "scripted", "types": ["inv"]}))
    feed.send("inv", 0, uuid="i-1")
    (out,) = feed.outputs
    assert out.topic == "bill.out"
    assert out.value == {"ok": True}
    assert out.headers["dup-id"] == "bill:i-1"  # section 2: trigger + identity
    # The same document processed by a fresh engine (a re-run) carries the same dup-id,
    # so a downstream onceflow drops the re-produced output.
    again = Feed(engine_for({"name": "bill", "service": "scripted", "types": ["inv"]}))
    again.send("inv", 50, uuid="i-1")
    assert again.outputs[0].headers["dup-id"] == "bill:i-1"


def test_in_doubt_document_is_published_to_the_in_doubt_topic() -> None:
    feed = Feed(engine_for({"name": "bill", "service": "scripted",
                            "types": ["inv"], "use_history": False,
                            "in_doubt": "ops.check"}))
    assert feed.send("inv", 0, {"delivery-count": "3"}, uuid="i-1", body={"n": 1}) == [
        ("bill", "in-doubt", "i-1")]
    (out,) = feed.outputs
    assert out.topic == "ops.check"
    assert out.value == {"uuid": "i-1", "body": {"n": 1}}  # the document, to resubmit
    assert "delivery count 3" in out.headers["reason"]


def test_service_error_goes_to_the_error_topic_and_to_reply_to() -> None:
    feed = Feed(engine_for({"name": "bill", "service": "scripted",
                            "types": ["inv"], "error": "bill.failures"}))
    feed.send("inv", 0, {"reply-to": "publisher.errors"}, uuid="i-1",
              body={"raise": "fatal"})
    topics = sorted(o.topic for o in feed.outputs)
    assert topics == ["bill.failures", "publisher.errors"]
    for out in feed.outputs:
        assert out.value["trigger"] == "bill"
        assert out.value["identity"] == "i-1"
        assert out.value["attempts"] == 1
        assert out.value["error"]["type"] == "ScriptedFailure"
        assert out.value["documents"] == [{"uuid": "i-1", "body": {"raise": "fatal"}}]


def test_exhausted_retries_report_the_attempts_made() -> None:
    feed = Feed(engine_for({"name": "t", "service": "scripted",
                            "types": ["a"], "max_retry_attempts": 2}))
    assert feed.send("a", 0, uuid="u", body={"raise": "transient"}) == [
        ("t", "retry", "u"), ("t", "retry", "u"), ("t", "error", "u")]
    (error,) = feed.outputs
    assert error.value["attempts"] == 3
    assert error.value["error"]["type"] == "TransientError"


# -- suspension --------------------------------------------------------------------------------

def test_suspension_removes_the_processing_entry_so_the_resumed_document_is_new() -> None:
    down = {"flag": True}

    def service(document: Any, context: CallContext) -> Any:
        if down["flag"]:
            raise TransientError("database down")
        return {"ok": True}

    engine = engine_for({"name": "t", "service": "scripted",
                         "types": ["a"], "max_retry_attempts": 1,
                         "on_retry_failure": "suspend"}, services={"t": service})
    feed = Feed(engine)
    assert feed.send("a", 0, uuid="u-1") == [("t", "retry", "u-1"), ("t", "suspended", "u-1")]
    assert dict(engine.state.history_store("t")) == {}  # seed 000 note 1
    assert feed.send("a", 1, uuid="u-2") == []  # held: no record, not acknowledged
    assert feed.send("a", 2, uuid="u-1") == []
    assert [d.identity for d in engine.held["t"]] == ["u-1", "u-2", "u-1"]
    down["flag"] = False
    out = engine.resume("t")
    assert [(r.outcome, r.identity) for r in out.journal] == [
        ("resumed", None), ("processed", "u-1"), ("processed", "u-2"), ("duplicate", "u-1")]
    assert engine.held["t"] == []
    assert feed.send("a", 3, uuid="u-3") == [("t", "processed", "u-3")]


def test_resume_while_still_failing_suspends_again_and_keeps_the_rest_held() -> None:
    def service(document: Any, context: CallContext) -> Any:
        raise TransientError("still down")

    engine = engine_for({"name": "t", "service": "scripted",
                         "types": ["a"], "on_retry_failure": "suspend"},
                        services={"t": service})
    feed = Feed(engine)
    feed.send("a", 0, uuid="u-1")
    feed.send("a", 1, uuid="u-2")
    out = engine.resume("t")
    assert [(r.outcome, r.identity) for r in out.journal] == [("resumed", None),
                                                               ("suspended", "u-1")]
    assert [d.identity for d in engine.held["t"]] == ["u-1", "u-2"]


def test_a_suspended_trigger_does_not_stop_the_others() -> None:
    engine = engine_for({"name": "t", "service": "scripted",
                         "types": ["a"], "on_retry_failure": "suspend"},
                        {"name": "u", "service": "scripted", "types": ["a"]})
    feed = Feed(engine)
    assert feed.send("a", 0, uuid="x", body={"raise": "transient"}) == [
        ("t", "suspended", "x"), ("u", "error", "x")]
    assert feed.send("a", 1, uuid="y") == [("u", "processed", "y")]


# -- history that cannot be read or written ----------------------------------------------------

class Unwritable(dict):
    """Reads work, writes fail: the changelog cannot be reached."""

    def __setitem__(self, key: Any, value: Any) -> None:
        raise ConnectionError("changelog unavailable")


class Unreadable(Unwritable):
    def get(self, key: Any, default: Any = None) -> Any:
        raise ConnectionError("store unavailable")


def broken_history_state(store_type: type, *triggers: str) -> MemoryState:
    """Memory state whose history stores for `triggers` fail."""
    state = MemoryState()
    for trigger in triggers:
        state.history[trigger] = store_type()
    return state


@pytest.mark.parametrize("store_type", [Unwritable, Unreadable])
def test_history_unavailable_suspends_a_suspend_trigger(store_type: type) -> None:
    calls: list[str] = []

    def service(document: Any, context: CallContext) -> Any:
        calls.append(context.identity)

    engine = engine_for({"name": "t", "service": "scripted",
                         "types": ["a"], "on_retry_failure": "suspend"},
                        state=broken_history_state(store_type, "t"), services={"t": service})
    feed = Feed(engine)
    assert feed.send("a", 0, uuid="u-1") == [("t", "suspended", "u-1")]
    assert calls == []  # the service never runs without its processing entry
    assert [d.identity for d in engine.held["t"]] == ["u-1"]


@pytest.mark.parametrize("store_type", [Unwritable, Unreadable])
def test_history_unavailable_without_resolver_is_in_doubt(store_type: type) -> None:
    engine = engine_for({"name": "t", "service": "scripted",
                         "types": ["a"]}, state=broken_history_state(store_type, "t"))
    feed = Feed(engine)
    assert feed.send("a", 0, uuid="u-1") == [("t", "in-doubt", "u-1")]
    assert [o.topic for o in feed.outputs] == ["t.in-doubt"]


@pytest.mark.parametrize("store_type", [Unwritable, Unreadable])
def test_history_unavailable_lets_the_resolver_decide(store_type: type) -> None:
    engine = Engine(parse_triggers({"trigger": [{"name": "t", "service": "scripted", "types": ["a"],
                                                 "resolver": "scripted"}]}),
                    state=broken_history_state(store_type, "t"))
    feed = Feed(engine)
    assert feed.send("a", 0, uuid="u-1", body={"resolve": "NEW"}) == [
        ("t", "processed", "u-1")]
    assert feed.send("a", 1, uuid="u-2", body={"resolve": "DUPLICATE"}) == [
        ("t", "duplicate", "u-2")]
    assert feed.send("a", 2, uuid="u-3", body={"resolve": "IN_DOUBT"}) == [
        ("t", "in-doubt", "u-3")]


def test_history_write_failure_in_a_join_keeps_the_join_consistent() -> None:
    engine = engine_for({"name": "j", "service": "scripted", "types": ["a", "b"]},
                        state=broken_history_state(Unwritable, "j"))
    feed = Feed(engine)
    assert feed.send("a", 0, uuid="a-1", activation="x") == [("j", "join-pending", "a-1")]
    # Completing the join needs the processing entries: in doubt, and a-1 waits on.
    assert feed.send("b", 1, uuid="b-1", activation="x") == [("j", "in-doubt", "b-1")]
    assert list(engine.processors["j"].joins.get("x")["members"]) == ["a"]


# -- sweeps ------------------------------------------------------------------------------------

def test_periodic_sweep_removes_expired_history_on_partition_time() -> None:
    """The replay never sweeps; the worker sweeps on partition time (Partition.sweep_due)."""
    engine = engine_for({"name": "t", "service": "scripted", "types": ["a"], "history_ttl": "1h",
                         "history_sweep_interval": "10m"})
    feed = Feed(engine)

    def send_and_sweep(ts: float, uuid: str) -> list[tuple[str, str, str]]:
        made = feed.send("a", ts, uuid=uuid)
        assert engine.partition.now is not None
        engine.partition.sweep_due(engine.partition.now)  # as the worker calls it after each batch
        return made

    send_and_sweep(0, "u-1")
    send_and_sweep(3000, "u-2")
    assert len(engine.state.history_store("t")) == 2
    send_and_sweep(4000, "u-3")  # sweep due; u-1 started more than 1h ago
    assert set(engine.state.history_store("t")) == {"u-2", "u-3"}
    # Swept or not, a lookup on record time gives the same answer for in-order records.
    assert send_and_sweep(4001, "u-1") == [("t", "processed", "u-1")]
    assert send_and_sweep(4002, "u-2") == [("t", "duplicate", "u-2")]


def test_replay_keeps_history_past_its_ttl_behind_partition_time_for_a_late_record() -> None:
    feed = Feed(engine_for({"name": "t", "service": "scripted",
                            "types": ["a"], "history_ttl": "1h"}))
    feed.send("a", 0, uuid="u-1")
    feed.send("a", 3000, uuid="u-2")
    feed.send("a", 4000, uuid="u-3")  # replay does not sweep: u-1 (started at 0) stays
    # A re-sent copy of u-1 still carrying its original timestamp: 100 - 0 <= 1h, so by
    # spec section 3 ("a lookup ignores an entry older than history_ttl, measured on
    # record time") it is a Duplicate.
    assert feed.send("a", 100, uuid="u-1") == [("t", "duplicate", "u-1")]


def test_a_redelivery_with_its_original_timestamp_after_the_ttl_is_a_duplicate() -> None:
    engine = engine_for({"name": "t", "service": "scripted", "types": ["a"], "history_ttl": "30s"})
    feed = Feed(engine)
    assert feed.send("a", 0, uuid="u-1") == [("t", "processed", "u-1")]
    feed.send("a", 5000, uuid="u-2")  # partition time 5000; replay keeps u-1's entry
    # The broker delivers offset 0 again (delivery count 2), with its own ts 0.
    assert feed.send("a", 0, offset=0, uuid="u-1") == [("t", "duplicate", "u-1")]


def test_a_late_record_without_a_sweep_is_a_duplicate() -> None:
    feed = Feed(engine_for({"name": "t", "service": "scripted", "types": ["a"], "history_ttl": "1h",
                            "history_sweep_interval": "1d"}))
    feed.send("a", 0, uuid="u-1")
    feed.send("a", 4000, uuid="u-3")
    assert feed.send("a", 100, uuid="u-1") == [("t", "duplicate", "u-1")]


# -- end of input and suspended joins ----------------------------------------------------------

def test_open_joins_of_a_suspended_trigger_still_expire(tmp_path: Path) -> None:
    (tmp_path / "triggers.toml").write_text(
        '[[trigger]]\nname = "j"\ntypes = ["a", "b"]\nservice = "scripted"\njoin_timeout = "10s"\n'
        'on_retry_failure = "suspend"\n\n'
        '[[trigger]]\nname = "s"\ntypes = ["c"]\nservice = "scripted"\n')
    (tmp_path / "input.jsonl").write_text(
        '{"ts": 0, "topic": "a", "value": {"uuid": "a1", "activation": "x"}}\n'
        '{"ts": 1, "topic": "a", "value": {"uuid": "a2", "activation": "y"}}\n'
        '{"ts": 2, "topic": "b", "value": {"uuid": "b2", "activation": "y", '
        '"body": {"raise": "transient"}}}\n'
        '{"ts": 100, "topic": "c", "value": {"uuid": "c1"}}\n')
    journal, _, _ = replay_scenario(load_scenario(tmp_path))
    outcomes = [(r.trigger, r.outcome, r.identity) for r in journal]
    assert ("j", "suspended", "b2") in outcomes
    assert ("s", "processed", "c1") in outcomes
    # By 100 both joins are long past their deadlines (10 and 11): x's a1, and y's a2
    # (restored to its join when b2's run was suspended).
    assert ("j", "join-expired", "a1") in outcomes


# -- history.jsonl seeds -----------------------------------------------------------------------

def test_a_seed_without_activation_applies_to_a_simple_trigger() -> None:
    engine = engine_for({"name": "t", "service": "scripted", "types": ["a"]})
    engine.seed_history("t", "u-1", "completed", 0)
    assert Feed(engine).send("a", 1, uuid="u-1", activation="x") == [
        ("t", "duplicate", "u-1")]


def test_a_seed_with_activation_applies_to_a_simple_trigger_too() -> None:
    # history.jsonl may carry an activation (an added key); a simple trigger keeps its
    # history by identity, so the seed must land where its lookups go.
    engine = engine_for({"name": "t", "service": "scripted", "types": ["a"]})
    engine.seed_history("t", "u-1", "completed", 0, activation="x")
    assert Feed(engine).send("a", 1, uuid="u-1", activation="x") == [
        ("t", "duplicate", "u-1")]


def test_a_seed_with_activation_binds_a_join_trigger_to_that_activation() -> None:
    engine = engine_for({"name": "j", "service": "scripted", "types": ["a", "b"]})
    engine.seed_history("j", "u-1", "processing", 0, activation="x")
    feed = Feed(engine)
    assert feed.send("a", 1, uuid="u-1", activation="x") == [("j", "in-doubt", "u-1")]
    assert feed.send("a", 2, uuid="u-1", activation="y") == [("j", "join-pending", "u-1")]


def test_seeds_for_a_trigger_without_history_are_ignored() -> None:
    engine = engine_for({"name": "t", "service": "scripted", "types": ["a"], "use_history": False})
    engine.seed_history("t", "u-1", "completed", 0)
    assert Feed(engine).send("a", 1, uuid="u-1") == [("t", "processed", "u-1")]


# -- async services and freeing the engine -----------------------------------------------------

def test_an_async_service_runs_in_the_engine_loop_until_closed() -> None:
    calls: list[Any] = []

    async def echo(document: Any) -> Any:
        calls.append(document)
        return {"echo": document["uuid"]}

    triggers = parse_triggers({"trigger": [{"name": "bill", "service": "scripted",
                                            "types": ["inv"]}]})
    engine = Engine(triggers, callees={"bill": (Callee("test", echo, False, True), None)})
    feed = Feed(engine)
    assert feed.send("inv", 0, uuid="i-1") == [("bill", "processed", "i-1")]
    assert feed.send("inv", 1, uuid="i-2") == [("bill", "processed", "i-2")]
    assert [out.value for out in feed.outputs] == [{"echo": "i-1"}, {"echo": "i-2"}]
    engine.close()
    engine.close()  # closing twice is harmless


def test_a_dropped_engine_is_freed_without_the_cycle_collector() -> None:
    # A reference cycle through the engine would keep every history entry and open join
    # until a full collection (Spark's reused Python workers run one after each task).
    feed = Feed(engine_for({"name": "bill", "service": "scripted", "types": ["inv"]},
                           {"name": "pair", "service": "scripted",
                            "types": ["inv", "pay"], "condition": "all",
                            "join_timeout": "1m"}))
    gc.collect()  # what reading the triggers and loading the services left
    gc.disable()
    try:
        for n in range(50):
            feed.send("inv", n, uuid=f"i-{n}", activation=f"a-{n}")
            feed.send("pay", n, uuid=f"p-{n}", activation=f"a-{n}")
        assert len(feed.outputs) == 100  # bill for each inv, pair for each inv + pay
        del feed
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_resubmitted_documents_terminal_record_names_who_resubmitted_it() -> None:
    from onceflow.envelope import Document
    from onceflow.processor import resubmission

    doc = Document("a", "u-1", None, {"uuid": "u-1"}, 0, "a", 0, 0, None, 2,
                   resubmitted=True, resubmitted_by="ops-team")
    assert resubmission(doc, None) == "resubmitted by ops-team"
    assert resubmission(doc, "Boom: no") == "Boom: no; resubmitted by ops-team"
    doc.resubmitted_by = None
    assert resubmission(doc, None) == "resubmitted by an operator"
    doc.resubmitted = False
    assert resubmission(doc, "why") == "why"
    assert Document.from_json(Document("a", "u", None, {}, 0, "a", 0, 0, None, 1,
                                       resubmitted=True, resubmitted_by="x").to_json()
                              ).resubmitted_by == "x"
