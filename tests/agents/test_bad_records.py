"""Records the worker cannot use never stop it: it journals them, keeps a copy, goes on.

- a record of the repartition topic that is not a message the worker can apply (not JSON,
  not an object, an unknown kind, a field missing or of the wrong type);
- a control message for a trigger this worker does not have;
- an input record whose dup-id, message id (with a dup-id) or activation is too long to be
  stored in the worker's state.

Each is handed to a partition in one batch with good records around it: before these
checks the batch raised, and a real worker stopped on it after every restart.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from onceflow.agents import limits, wire
from onceflow.agents.wire import Delivery

from .cluster import LocalCluster
from .test_partition import cluster, doc

ROUTE_DOC = {"type": "inv", "identity": "r-1", "activation": None, "envelope": {"uuid": "r-1"},
             "ts": 5, "topic": "inv", "partition": 0, "offset": 0, "message_id": "inv/0@0",
             "delivery_count": 1, "key": None, "headers": {}, "position": 0}


def without(data: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != name}


BAD_ROUTE_RECORDS: list[tuple[str, bytes | None, str]] = [
    # (name, value, what the reason says)
    ("not-json", b"{not json", "not JSON"),
    ("empty", None, "empty"),
    ("array", b"[1, 2]", "not an object"),
    ("no-kind", orjson.dumps({"t": ["bill"]}), "'k'"),
    ("unknown-kind", orjson.dumps({"k": "explode"}), "unknown message kind 'explode'"),
    ("doc-without-d", orjson.dumps({"k": "doc", "t": ["bill"]}), "field 'd' is missing"),
    ("doc-without-t", orjson.dumps({"k": "doc", "d": ROUTE_DOC}), "field 't' is missing"),
    ("doc-t-not-names", orjson.dumps({"k": "doc", "t": [1], "d": ROUTE_DOC}), "'t'"),
    ("doc-d-not-object", orjson.dumps({"k": "doc", "t": ["bill"], "d": "x"}),
     "'d' must be an object"),
    ("doc-without-identity", orjson.dumps({"k": "doc", "t": ["bill"],
                                           "d": without(ROUTE_DOC, "identity")}),
     "'identity' is missing"),
    ("doc-ts-string", orjson.dumps({"k": "doc", "t": ["bill"], "d": {**ROUTE_DOC, "ts": "5"}}),
     "'ts' must be a number"),
    ("doc-headers-numbers", orjson.dumps({"k": "doc", "t": ["bill"],
                                          "d": {**ROUTE_DOC, "headers": {"a": 1}}}),
     "'headers'"),
    ("tick-without-ts", orjson.dumps({"k": "tick"}), "'ts' is missing"),
    ("tick-ts-string", orjson.dumps({"k": "tick", "ts": "soon"}), "'ts' must be a number"),
    ("barrier-without-id", orjson.dumps({"k": "barrier"}), "'id' is missing"),
    ("seed-without-status", orjson.dumps({"k": "seed", "trigger": "bill", "identity": "i",
                                          "ts": 1}), "'status'"),
    ("forget-without-key", orjson.dumps({"k": "forget", "trigger": "bill"}), "'key'"),
    ("suspend-without-trigger", orjson.dumps({"k": "suspend"}), "'trigger' is missing"),
    ("resume-trigger-number", orjson.dumps({"k": "resume", "trigger": 7}),
     "'trigger' must be a string"),
]


def route_record(c: LocalCluster, offset: int, value: bytes | None) -> Delivery:
    return Delivery(c.names.route, 0, offset, 3, b"k", value, [("h", b"v")])


@pytest.mark.parametrize(("name", "value", "says"), BAD_ROUTE_RECORDS,
                         ids=[r[0] for r in BAD_ROUTE_RECORDS])
async def test_a_bad_repartition_record_is_journaled_dead_lettered_and_skipped(
        name: str, value: bytes | None, says: str) -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    good = wire.doc_message(["bill"], _routed("r-2"))
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1"), route_record(c, 0, value),
                            route_record(c, 1, good), doc("inv", 1, 2, uuid="i-2")])
    lines = c.journal()
    bad = [line for line in lines if line["outcome"] == "bad-input"]
    assert len(bad) == 1, lines
    (line,) = bad
    assert line["trigger"] is None
    assert (line["topic"], line["partition"], line["offset"]) == ("onceflow.route", 0, 0)
    assert line["identity"] == "onceflow.route/0@0"
    assert "record onceflow.route/0@0 of the repartition topic" in line["reason"]
    assert says in line["reason"], line["reason"]
    # The records around it are decided as usual.
    assert [(x["outcome"], x["identity"]) for x in lines if x["outcome"] != "bad-input"] == [
        ("processed", "i-1"), ("processed", "r-2"), ("processed", "i-2")]
    # Nothing is lost: the record is on the dead-letter topic as it was.
    (letter,) = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert (letter["topic"], letter["partition"], letter["offset"]) == ("onceflow.route", 0, 0)
    assert letter["reason"] == line["reason"]
    assert letter["headers"] == {"h": "v"}
    if value is not None and name != "not-json":
        assert letter["value"] == orjson.loads(value)
    elif value is not None:
        assert letter["raw"] == value.decode()


async def test_a_bad_repartition_record_over_the_record_limit_is_copied_by_reference() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]}, max_record_bytes=20_000)
    await c.runtime.handle([route_record(c, 0, b"\xff" * 10_000)])  # 3 bytes a byte as text
    (letter,) = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert "raw" not in letter and letter["size"] == 10_000
    assert [x["outcome"] for x in c.journal()] == ["bad-input"]


async def test_a_good_control_still_applies_after_the_checks() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    await c.runtime.handle([
        route_record(c, 0, wire.control_message(wire.SUSPEND, trigger="bill", reason="ops",
                                                journal=True)),
        doc("inv", 0, 1, uuid="i-1"),
        route_record(c, 1, wire.control_message(wire.RESUME, trigger="bill", journal=True)),
        route_record(c, 2, wire.control_message(wire.TICK, ts=10)),
        route_record(c, 3, wire.control_message(wire.SWEEP))])
    assert [(x["outcome"], x["identity"]) for x in c.journal()] == [
        ("suspended", None), ("resumed", None), ("processed", "i-1")]
    assert c.broker.records(c.names.dead_letter) == []


# -- control messages for a trigger this worker does not have ---------------------------

UNKNOWN_CONTROLS = [
    (wire.SUSPEND, {"reason": "suspended by command", "journal": True}),
    (wire.RESUME, {"reason": "resumed by command", "journal": True}),
    (wire.FORGET, {"key": "i-1", "only": "failed"}),
    (wire.SEED, {"identity": "i-1", "status": "completed", "ts": 1}),
    (wire.SWEEP, {}),
]


@pytest.mark.parametrize(("kind", "fields"), UNKNOWN_CONTROLS,
                         ids=[k for k, _ in UNKNOWN_CONTROLS])
async def test_a_control_for_an_unknown_trigger_is_journaled_and_counted(
        kind: str, fields: dict[str, Any]) -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    value = wire.control_message(kind, trigger="audit", **fields)
    await c.runtime.handle([route_record(c, 0, value), doc("inv", 0, 1, uuid="i-1")])
    (line, processed) = c.journal()
    assert (line["trigger"], line["outcome"], line["identity"]) == ("audit", "bad-input", None)
    assert line["reason"].startswith("trigger 'audit' is not defined on this worker")
    assert f"the {kind} message onceflow.route/0@0 was not applied" in line["reason"]
    assert (line["topic"], line["partition"], line["offset"]) == ("onceflow.route", 0, 0)
    assert processed["outcome"] == "processed"
    assert c.runtime.metrics.outcomes[("audit", "bad-input")] == 1
    (letter,) = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert letter["value"] == orjson.loads(value)
    # A sweep naming an unknown trigger sweeps nothing (it swept every trigger before).
    assert not c.runtime.worker(0).processors["bill"].suspended


# -- keys too long for the worker's state -----------------------------------------------

LONG = limits.MAX_KEY_LENGTH + 1


async def test_a_dup_id_too_long_to_store_is_bad_input_before_any_state() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    ok = "d" * limits.MAX_KEY_LENGTH
    await c.runtime.handle([
        Delivery("inv", 0, 0, 1, None, orjson.dumps({"uuid": "i-1"}), [("dup-id", b"x" * LONG)]),
        Delivery("inv", 0, 1, 2, None, orjson.dumps({"uuid": "i-2"}),
                 [("dup-id", b"y"), ("message-id", b"m" * LONG)]),
        Delivery("inv", 0, 2, 3, None, orjson.dumps({"uuid": "i-3"}), [("dup-id", ok.encode())]),
        Delivery("inv", 0, 3, 4, None, orjson.dumps({"uuid": "i-4"}),
                 [("message-id", b"m" * LONG)]),  # no dup-id: the message id is not stored
    ])
    lines = c.journal()
    assert [(x["trigger"], x["outcome"], x["identity"]) for x in lines] == [
        (None, "bad-input", "i-1"), (None, "bad-input", "i-2"),
        ("bill", "processed", "i-3"), ("bill", "processed", "i-4")]
    assert f"the dup-id is longer than {limits.MAX_KEY_LENGTH} characters ({LONG})" in \
        lines[0]["reason"]
    assert "the message-id of a record with a dup-id is longer than" in lines[1]["reason"]
    # Nothing of the rejected records is in the duplicate-ID cache (only the good one).
    ingress = c.state["ingress"][0].data
    assert not any(b"x" * 100 in key or b"x" * 100 in value for key, value in ingress.items())
    assert not any(b"m" * 100 in value for value in ingress.values())
    assert any(ok.encode() in key for key in ingress)
    letters = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert [x["offset"] for x in letters] == [0, 1]
    assert letters[0]["value"] == {"uuid": "i-1"}


async def test_the_dead_letter_copy_of_a_huge_dup_id_keeps_the_value_headers_clipped(
        ) -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]}, max_record_bytes=16_384)
    await c.runtime.handle([Delivery("inv", 0, 0, 1, b"k", orjson.dumps({"uuid": "i-1"}),
                                     [("dup-id", b"x" * 20_000), ("other", b"y")])])
    (record,) = c.broker.records(c.names.dead_letter)
    assert len(record.value) < 16_384
    letter = orjson.loads(record.value)
    assert letter["value"] == {"uuid": "i-1"}
    assert letter["headers"]["dup-id"].endswith("... (20000 characters)")
    assert letter["headers"]["other"] == "y"
    assert "headers clipped" in letter["clipped"]


async def test_an_activation_too_long_for_history_keys_is_bad_input_at_ingress() -> None:
    c = cluster({"name": "pair", "service": "scripted", "types": ["a", "b"], "condition": "all"},
                {"name": "plain", "service": "scripted", "types": ["c"]})
    await c.runtime.handle([
        doc("a", 0, 1, uuid="a-1", activation="x" * LONG),
        doc("c", 0, 2, uuid="c-1", activation="x" * LONG),
        doc("a", 1, 3, uuid="a-2", activation="x" * limits.MAX_KEY_LENGTH),
    ])
    lines = c.journal()
    assert [(x["trigger"], x["outcome"], x["identity"]) for x in lines] == [
        (None, "bad-input", "a-1"), (None, "bad-input", "c-1"), ("pair", "join-pending", "a-2")]
    assert f"the activation is longer than {limits.MAX_KEY_LENGTH} characters" in \
        lines[0]["reason"]
    assert lines[0]["activation"] is None  # spec section 2: trigger and activation null
    assert c.runtime.worker(0).joins["pair"].get("x" * LONG) is None
    assert len(c.broker.records(c.names.dead_letter)) == 2


async def test_a_routed_document_with_an_activation_too_long_is_bad_input_for_its_trigger(
        ) -> None:
    # What a worker without the ingress check (an older version) could still route here.
    c = cluster({"name": "pair", "service": "scripted", "types": ["a", "b"], "condition": "all"})
    routed = _routed("a-1", type="a", activation="x" * LONG)
    await c.runtime.handle([route_record(c, 0, wire.doc_message(["pair"], routed))])
    (line,) = c.journal()
    assert (line["trigger"], line["outcome"], line["identity"]) == ("pair", "bad-input", "a-1")
    assert "activation is longer than" in line["reason"]
    (error,) = [orjson.loads(r.value) for r in c.broker.records("pair.error")]
    assert error["error"]["type"] == "BadInput"


def _routed(identity: str, type: str = "inv", activation: str | None = None) -> Any:
    from onceflow.envelope import Document
    return Document(type, identity, activation, {"uuid": identity}, 4, type, 0, 9,
                    f"{type}/0@9", 1)


# -- copies of an admin's controls ------------------------------------------------------

async def test_a_control_is_applied_once_per_partition_even_after_a_restart() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    suspend = wire.control_message(wire.SUSPEND, trigger="bill", reason="ops", journal=True)
    resume = wire.control_message(wire.RESUME, trigger="bill", journal=True)
    await c.runtime.handle([route_record(c, 0, suspend), route_record(c, 1, resume)])
    c.runtime.forget_partitions([0])  # the ids applied are durable (the control table)
    await c.runtime.handle([route_record(c, 2, suspend), doc("inv", 0, 1, uuid="i-1")])
    assert [(x["outcome"], x["identity"]) for x in c.journal()] == [
        ("suspended", None), ("resumed", None), ("bad-input", "onceflow.route/0@2"),
        ("processed", "i-1")]
    reason = c.journal()[2]["reason"]
    assert reason.startswith("the suspend message onceflow.route/0@2 was not applied to "
                             f"partition 0: control '{orjson.loads(suspend)['id']}' was "
                             "applied here before (at offset 0)")
    (letter,) = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert letter["value"] == orjson.loads(suspend)


@pytest.mark.parametrize(("fields", "why"), [
    ({"at": 1.0}, "s ago, more than 300 s"),
    ({"id": None}, "it has no id and time"),
    ({"at": None}, "it has no id and time"),
    ({"id": "x" * 101}, "its id is longer than 100 characters"),
], ids=["old", "no-id", "no-time", "long-id"])
async def test_a_control_too_old_or_without_id_and_time_is_refused(
        fields: dict[str, Any], why: str) -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    message = orjson.loads(wire.control_message(wire.SUSPEND, trigger="bill", journal=True))
    message.update(fields)
    message = {k: v for k, v in message.items() if v is not None}
    await c.runtime.handle([route_record(c, 0, orjson.dumps(message))])
    (line,) = c.journal()
    assert line["outcome"] == "bad-input" and why in line["reason"]
    assert not c.runtime.worker(0).processors["bill"].suspended


async def test_a_control_delivered_again_after_a_crash_is_not_a_copy() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    suspend = wire.control_message(wire.SUSPEND, trigger="bill", reason="ops", journal=True)
    await c.runtime.handle([route_record(c, 0, suspend)])
    c.runtime.forget_partitions([0])
    await c.runtime.handle([route_record(c, 0, suspend)])  # the same offset: a redelivery
    assert [x["outcome"] for x in c.journal()] == ["suspended"]
    assert c.broker.records(c.names.dead_letter) == []
    assert c.runtime.worker(0).processors["bill"].suspended


async def test_the_ids_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow.agents import controls

    monkeypatch.setattr(controls, "MAX_APPLIED", 2)
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    values = [wire.control_message(wire.SWEEP) for _ in range(4)]
    await c.runtime.handle([route_record(c, n, v) for n, v in enumerate(values)])
    assert sorted(c.runtime.worker(0).applied.keys()) == sorted(
        orjson.loads(v)["id"] for v in values[2:])
