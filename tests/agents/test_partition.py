"""The partition logic of the worker on batches: what a record-by-record replay cannot show.

A real worker decides many documents per batch; these tests hand whole batches to the
partitions (in process, memory broker, dict tables) and check that the outcome is the one
record-by-record processing gives, that durability comes in the right order, and that a
suspension rolls back what the batch decided after it.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from memory_broker import MemoryBroker
from onceflow.agents import wire
from onceflow.agents.wire import Delivery
from onceflow.calls import Callee
from onceflow.errors import TransientError
from onceflow.tables.outbox import Outbox
from onceflow.triggers import parse_triggers

from .cluster import LocalCluster


def cluster(*triggers: dict[str, Any], partitions: int = 1, **options: Any) -> LocalCluster:
    return LocalCluster(parse_triggers({"trigger": list(triggers)}), partitions=partitions,
                        **options)


def doc(topic: str, offset: int, ts: float, partition: int = 0, **value: Any) -> Delivery:
    return Delivery(topic, partition, offset, ts, None, orjson.dumps(value), [])


def journal(c: LocalCluster) -> list[tuple[Any, ...]]:
    return [(line["trigger"], line["outcome"], line["identity"]) for line in c.journal()]


async def test_a_copy_in_the_same_batch_waits_for_the_first_run() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1"), doc("inv", 1, 2, uuid="i-1"),
                            doc("inv", 2, 3, uuid="i-2")])
    assert journal(c) == [("bill", "processed", "i-1"), ("bill", "duplicate", "i-1"),
                          ("bill", "processed", "i-2")]


def count_sends(c: LocalCluster) -> list[int]:
    """How many times the partitions wrote to the broker (one element a write)."""
    sends: list[int] = []
    real = c.runtime.sender.send

    async def send(outbox: Outbox) -> Any:
        sends.append(outbox.count)
        return await real(outbox)

    c.runtime.sender.send = send  # type: ignore[method-assign]
    return sends


async def test_a_copy_waits_in_its_place_without_splitting_the_batch() -> None:
    calls: list[str] = []
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]},
                callees={"bill": (Callee("x:y", lambda d: calls.append(d["uuid"]), False,
                                         False), None)})
    sends = count_sends(c)
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1"), doc("inv", 1, 2, uuid="i-1"),
                            doc("inv", 2, 3, uuid="i-2"), doc("inv", 3, 4, uuid="i-1")])
    assert journal(c) == [("bill", "processed", "i-1"), ("bill", "duplicate", "i-1"),
                          ("bill", "processed", "i-2"), ("bill", "duplicate", "i-1")]
    assert calls == ["i-1", "i-2"]
    # One group, three writes: the processing entries of i-1 and i-2 together, then the
    # journal and outputs, then the completed entries (settling for the copy took six).
    assert len(sends) == 3


async def test_waiting_copies_that_run_again_run_one_after_another_in_order() -> None:
    # No duplicate detection: every copy runs, each after the run before it of the same
    # identity, as a record-by-record replay runs them.
    calls: list[str] = []

    def service(document: Any) -> dict[str, Any]:
        calls.append(f"{document['uuid']}#{document['n']}")
        return {"n": document["n"]}

    c = cluster({"name": "bill", "service": "scripted",
                 "types": ["inv"], "detect_duplicates": False},
                callees={"bill": (Callee("x:y", service, False, False), None)})
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1", n=0), doc("inv", 1, 2, uuid="i-1", n=1),
                            doc("inv", 2, 3, uuid="i-2", n=2), doc("inv", 3, 4, uuid="i-1", n=3)])
    assert journal(c) == [("bill", "processed", "i-1"), ("bill", "processed", "i-1"),
                          ("bill", "processed", "i-2"), ("bill", "processed", "i-1")]
    assert calls == ["i-1#0", "i-2#2", "i-1#1", "i-1#3"]
    outputs = [orjson.loads(r.value)["n"] for r in c.broker.records(c.names.topic("bill.out"))]
    assert outputs == [0, 1, 2, 3]  # published in record order


async def test_a_copy_for_a_join_trigger_still_settles_first() -> None:
    c = cluster({"name": "pair", "service": "scripted", "types": ["a", "b"], "condition": "all"})
    sends = count_sends(c)
    await c.runtime.handle([
        doc("a", 0, 1, uuid="a-1", activation="x"), doc("b", 0, 2, uuid="b-1", activation="x"),
        doc("a", 1, 3, uuid="a-1", activation="x")])
    assert journal(c) == [("pair", "join-pending", "a-1"), ("pair", "processed", "a-1"),
                          ("pair", "processed", "b-1"), ("pair", "duplicate", "a-1")]
    assert len(sends) == 4  # the run settled (three writes), then the copy's journal


async def test_join_members_in_one_batch_join_as_replay_does() -> None:
    c = cluster({"name": "pair", "service": "scripted", "types": ["a", "b"], "condition": "all"})
    await c.runtime.handle([
        doc("a", 0, 1, uuid="a-1", activation="x"), doc("b", 0, 2, uuid="b-1", activation="x"),
        doc("a", 1, 3, uuid="a-2", activation="x"), doc("a", 2, 4, uuid="a-1", activation="x"),
    ])
    assert journal(c) == [
        ("pair", "join-pending", "a-1"), ("pair", "processed", "a-1"),
        ("pair", "processed", "b-1"), ("pair", "join-pending", "a-2"),
        ("pair", "duplicate", "a-1"),
    ]


async def test_a_suspension_rolls_back_and_holds_what_the_batch_decided_after_it() -> None:
    broken = [True]

    def fragile_service(document: Any) -> dict[str, bool]:
        if broken[0]:
            raise TransientError("the database is down")
        return {"ok": True}

    triggers = parse_triggers({"trigger": [
        {"name": "fragile", "service": "scripted", "types": ["a"], "max_retry_attempts": 1,
         "on_retry_failure": "suspend"},
        {"name": "steady", "service": "scripted", "types": ["b"]}]})
    services = {"fragile": (Callee("fragile", fragile_service, False, False), None),
                "steady": (Callee("steady", lambda document: None, False, False), None)}
    c = LocalCluster(triggers, partitions=2, callees=services)
    # Three documents decided on one partition in one batch, so the later two are taken
    # (processing entries written) before the first one's run suspends.
    home = wire.route_partition("a-0", 2)
    first, second, third = [u for u in (f"a-{i}" for i in range(50))
                            if wire.route_partition(u, 2) == home][:3]
    await c.runtime.handle([
        doc("a", 0, 1, partition=home, uuid=first), doc("a", 1, 2, partition=home, uuid=second),
        doc("a", 2, 3, partition=home, uuid=third), doc("b", 0, 4, partition=home, uuid="b-1")])
    await c.pump()
    assert journal(c) == [("fragile", "retry", first), ("fragile", "suspended", first),
                          ("steady", "processed", "b-1")]
    worker = c.runtime.worker(home)
    assert [worker.control[k]["identity"] for k in worker.held["fragile"]] == [
        first, second, third]
    for partition in range(2):
        fragile = c.runtime.worker(partition).processors["fragile"]
        # Suspended everywhere (the other partition heard through the repartition topic),
        # and every processing entry the batch had written is undone.
        assert fragile.suspended and fragile.history is not None
        assert len(fragile.history) == 0

    broken[0] = False
    for partition in range(2):
        c.broker.append(c.names.route, partition, _control(
            wire.RESUME, trigger="fragile", reason="resumed by test", journal=partition == 0))
    await c.pump()
    assert journal(c)[3] == ("fragile", "resumed", None)
    assert journal(c)[4:] == [("fragile", "processed", first),
                              ("fragile", "processed", second),
                              ("fragile", "processed", third)]
    assert not any(c.runtime.worker(p).held["fragile"] for p in range(2))


async def test_documents_go_to_the_partition_of_their_routing_key() -> None:
    c = cluster({"name": "pair", "service": "scripted",
                 "types": ["a", "b"], "condition": "all"}, partitions=4)
    target = wire.route_partition("x", 4)
    source = (target + 1) % 4
    await c.runtime.handle([doc("a", 0, 1, partition=source, uuid="a-1", activation="x")])
    routed = c.broker.log(c.names.route, target)
    assert len(routed) == 1 and orjson.loads(routed[0].value)["t"] == ["pair"]
    assert journal(c) == []  # decided where the activation's join lives
    await c.pump()
    assert journal(c) == [("pair", "join-pending", "a-1")]
    assert c.runtime.worker(target).joins["pair"].get("x") is not None


async def test_a_redelivered_routed_document_counts_as_delivered_twice() -> None:
    c = cluster({"name": "plain", "service": "scripted", "types": ["a"], "use_history": False})
    routed = orjson.loads(wire.doc_message(["plain"], _document("a-1")))
    value = orjson.dumps(routed)
    delivery = Delivery(c.names.route, 0, 0, 1, b"a-1", value, [])
    await c.runtime.handle([delivery])
    await c.runtime.handle([delivery])  # the broker hands it over again
    assert journal(c) == [("plain", "processed", "a-1"), ("plain", "in-doubt", "a-1")]


async def test_journal_and_outputs_are_durable_before_completed_entries() -> None:
    order: list[set[str]] = []

    class Recording(MemoryBroker):
        async def send(self, outbox: Outbox) -> dict[tuple[str, int], int]:
            order.append({topic for topic, _ in outbox.records})
            return await super().send(outbox)

    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    broker = Recording(1)
    broker.topics = c.broker.topics
    c.runtime.sender = broker
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1")])
    history, journal_topic = "onceflow-history-changelog", c.names.journal
    assert history in order[0] and journal_topic not in order[0]  # processing entry first
    assert journal_topic in order[1] and "bill.out" in order[1] and history not in order[1]
    assert history in order[2]  # then the completed entry


async def test_controls_seed_forget_and_barrier() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    route = c.names.route
    c.broker.append(route, 0, _control(wire.SEED, trigger="bill", identity="i-1",
                                        status="processing", ts=0))
    c.broker.append(route, 0, _control(wire.BARRIER, id="b1"))
    await c.pump()
    assert [orjson.loads(r.value) for r in c.broker.records(c.names.acks)] == [
        {"id": "b1", "partition": 0}]
    await _in_doubt_then_resubmitted(c)


async def test_a_value_over_the_size_limit_is_bad_input_by_reference() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]}, max_document_bytes=100)
    await c.runtime.handle([doc("inv", 0, 1, uuid="big", body="x" * 200)])
    assert journal(c) == [(None, "bad-input", "big")]
    (letter,) = c.broker.records(c.names.dead_letter)
    body = orjson.loads(letter.value)
    assert "value" not in body and body["size"] > 100


@pytest.mark.parametrize("partitions", [1, 3])
async def test_time_ticks_expire_joins(partitions: int) -> None:
    c = cluster({"name": "pair", "service": "scripted", "types": ["a", "b"], "condition": "all",
                 "join_timeout": "10s"}, partitions=partitions)
    target = wire.route_partition("x", partitions)
    await c.runtime.handle([doc("a", 0, 100, partition=target, uuid="a-1", activation="x")])
    c.broker.append(c.names.route, target, _control(wire.TICK, ts=111))
    await c.pump()
    assert journal(c) == [("pair", "join-pending", "a-1"), ("pair", "join-expired", "a-1")]


async def _in_doubt_then_resubmitted(c: LocalCluster) -> None:
    """i-1 comes out In Doubt; after `resubmit`'s forget it is decided again and runs."""
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1")])
    c.broker.append(c.names.route, 0, _control(wire.FORGET, trigger="bill", key="i-1",
                                                only="processing"))
    await c.pump()
    await c.runtime.handle([doc("inv", 1, 2, uuid="i-1")])
    assert journal(c) == [("bill", "in-doubt", "i-1"), ("bill", "processed", "i-1")]


def _control(kind: str, **fields: Any) -> Any:
    from onceflow.tables.outbox import OutRecord
    return OutRecord(kind.encode(), wire.control_message(kind, **fields))


def _document(identity: str) -> Any:
    from onceflow.envelope import Document
    return Document("a", identity, None, {"uuid": identity}, 1, "a", 0, 0, "a/0@0", 1)


class _Crash(BaseException):
    """The worker is killed here."""


async def test_a_join_that_ran_before_a_crash_does_not_expire_its_members_later() -> None:
    """Killed after the run's journal went out and before its join was removed.

    The waiting member stays in the durable join, and the completed entries did not
    become durable either (they go with the join change).  When the completing document
    is delivered again its history (a processing entry only) decides for the whole run,
    as one unit (spec section 4): no resolver, so both members are in-doubt, with one
    in-doubt copy of the join document; no `join-expired` later.
    """
    pair = {"name": "pair", "service": "scripted",
            "types": ["l", "r"], "condition": "all", "join_timeout": "10s"}
    joins_changelog = "onceflow-joins-changelog"

    class Killed(MemoryBroker):
        armed = False

        async def send(self, outbox: Outbox) -> dict[tuple[str, int], int]:
            if self.armed and any(topic == joins_changelog for topic, _ in outbox.records):
                raise _Crash
            return await super().send(outbox)

    first = cluster(pair)
    broker = Killed(1)
    broker.topics = first.broker.topics
    first.runtime.sender = broker
    first.send("l", 0, orjson.dumps({"uuid": "l-1", "activation": "x"}), ts=100)
    await first.pump()
    committed = dict(first.read)  # l's records are done with
    broker.armed = True
    first.send("r", 0, orjson.dumps({"uuid": "r-1", "activation": "x"}), ts=101)
    with pytest.raises(_Crash):
        await first.pump()
    assert journal(first)[-2:] == [("pair", "processed", "l-1"), ("pair", "processed", "r-1")]

    # The restart: the same durable state; r's records are delivered again.
    second = cluster(pair)
    second.broker.topics = first.broker.topics
    second.state = first.state
    second.read = committed
    await second.pump()
    second.broker.append(second.names.route, 0, _control(wire.TICK, ts=200))
    await second.pump()
    outcomes: dict[str, list[str]] = {}
    for trigger, outcome, identity in journal(second):
        if trigger == "pair":
            outcomes.setdefault(identity, []).append(outcome)
    assert outcomes["l-1"] == ["join-pending", "processed", "in-doubt"]
    assert outcomes["r-1"] == ["processed", "in-doubt"]
    reason = next(line["reason"] for line in second.journal()
                  if line["identity"] == "l-1" and line["outcome"] == "in-doubt")
    assert "r-1" in reason and "interrupted" in reason
    (copy,) = second.broker.records("pair.in-doubt")
    assert orjson.loads(copy.value)["documents"] == {
        "l": {"uuid": "l-1", "activation": "x"}, "r": {"uuid": "r-1", "activation": "x"}}


async def test_an_unreadable_history_value_is_in_doubt_until_resubmitted() -> None:
    # A value written by a newer version (or damaged) is not guessed at: the document is In
    # Doubt, and resubmitting it (forget only="processing") lets it be decided again.
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]}, partitions=1)
    route = c.names.route
    c.broker.append(route, 0, _control(wire.SEED, trigger="bill", identity="i-1",
                                        status="completed", ts=0))
    await c.pump()
    (stored,) = [(p, key) for p, part in c.state["history"].items()
                 for key in part.data if key.endswith(b"i-1")]
    c.state["history"][stored[0]].data[stored[1]] = orjson.dumps([0, 3, 99])
    await _in_doubt_then_resubmitted(c)
