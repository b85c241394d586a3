"""A record the worker fails on does not stop it; state it cannot read does, saying where.

Whatever goes wrong while a partition handles one record (a bug, or an input nobody
foresaw) fails the group in hand; the records not yet durable are then handled again one
at a time on the durable state, and one that fails alone is journaled `bad-input` with the
failure and kept on the dead-letter topic.  The partition goes on, and no record's service
runs twice.  A failure that is not a record's (the broker, the local store, a stored value
that is not JSON) stops the worker, and the log names the record at hand.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from onceflow.agents import partition_worker as partition_module
from onceflow.agents import wire
from onceflow.agents.wire import Delivery
from onceflow.calls import Callee
from onceflow.tables.state import StateCorrupt

from .test_partition import cluster, doc, journal


def fail_on(monkeypatch: pytest.MonkeyPatch, identity: str) -> list[str]:
    """Make handling one identity's record fail, as a bug would; the identities read.

    The fault is raised where the worker reads a document's value (`orjson.loads`, which
    the compiled core looks up on its module at every call).  The worker and the core are
    compiled, so their calls to each other (routing_key was the place once) cannot be
    replaced from a test.  The list holds the uuid of every document value read, one a
    handling of an input record.
    """
    read: list[str] = []
    original = orjson.loads
    failing = orjson.dumps({"uuid": identity})

    def loads(data: Any) -> Any:
        value = original(data)
        if isinstance(value, dict) and list(value) == ["uuid"]:  # a document of doc()
            read.append(value["uuid"])
            if data == failing:
                raise RuntimeError(f"a bug reading {identity}")
        return value

    monkeypatch.setattr(orjson, "loads", loads)
    return read


async def test_a_record_the_worker_fails_on_is_bad_input_and_the_partition_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def service(document: Any) -> None:
        calls.append(document["uuid"])

    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]},
                callees={"bill": (Callee("x:y", service, False, False), None)})
    fail_on(monkeypatch, "i-2")
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1"), doc("inv", 1, 2, uuid="i-2"),
                            doc("inv", 2, 3, uuid="i-3")])
    # The last resort reads nothing again: its identity is the record's coordinates, and
    # the dead letter holds the record's bytes.
    assert journal(c) == [("bill", "processed", "i-1"), (None, "bad-input", "inv/0@1"),
                          ("bill", "processed", "i-3")]
    (bad,) = [line for line in c.journal() if line["identity"] == "inv/0@1"]
    assert bad["reason"].startswith("the worker failed on record inv/0@1 (RuntimeError: a "
                                    "bug reading i-2)")
    letters = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert [(x["offset"], x["raw"]) for x in letters] == [(1, '{"uuid":"i-2"}')]
    assert calls == ["i-1", "i-3"]  # each service once

    # The partition goes on with later records.
    await c.runtime.handle([doc("inv", 3, 4, uuid="i-4")])
    assert journal(c)[-1] == ("bill", "processed", "i-4")


async def test_records_made_durable_before_the_failure_are_not_decided_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A trigger that may suspend: its copy of i-1 cannot wait in its place for the first
    # run (batch.py), so it settles (and makes durable) the group so far before i-3 fails.
    c = cluster({"name": "bill", "service": "scripted",
                 "types": ["inv"], "on_retry_failure": "suspend"})
    routed = fail_on(monkeypatch, "i-3")
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1"), doc("inv", 1, 2, uuid="i-1"),
                            doc("inv", 2, 3, uuid="i-3"), doc("inv", 3, 4, uuid="i-4")])
    assert journal(c) == [("bill", "processed", "i-1"), ("bill", "duplicate", "i-1"),
                          (None, "bad-input", "inv/0@2"), ("bill", "processed", "i-4")]
    # The first record was durable when i-3 failed and is not decided again; the copy was
    # not (its decision waited in the group) and is decided once more, alone.
    assert routed == ["i-1", "i-1", "i-3", "i-1", "i-3", "i-4"]


async def test_a_failure_before_the_waiting_copies_are_decided_runs_no_service_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]},
                callees={"bill": (Callee("x:y", lambda d: calls.append(d["uuid"]), False,
                                         False), None)})
    # The fault comes in the last step before the copies that waited for the runs are
    # decided (deliver_replies, which stays interpreted: the worker's call to the compiled
    # decide_waiting cannot be replaced from a test); the state is the same at both.
    original = partition_module.deliver_replies
    failed: list[bool] = []

    async def deliver_replies(rt: Any, takes: Any) -> None:
        if not failed and any(take.waiting for take in takes):
            failed.append(True)
            raise RuntimeError("a bug before deciding the copies")
        await original(rt, takes)

    monkeypatch.setattr(partition_module, "deliver_replies", deliver_replies)
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1"), doc("inv", 1, 2, uuid="i-1"),
                            doc("inv", 2, 3, uuid="i-2")])
    # The services of i-1 and i-2 ran before the failure, on durable processing entries;
    # their completed entries were not written.  Handled again one at a time, every record
    # meets a processing entry alone: in-doubt, as after a crash at that point.
    assert failed and calls == ["i-1", "i-2"]
    assert journal(c) == [("bill", "in-doubt", "i-1"), ("bill", "in-doubt", "i-1"),
                          ("bill", "in-doubt", "i-2")]


async def test_a_stored_value_that_is_not_json_stops_the_worker_naming_the_record(
        caplog: pytest.LogCaptureFixture) -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1")])
    # (History that cannot be read is the spec's "history unavailable": In Doubt, or the
    # resolver.  The duplicate-ID caches and delivery progress have no such fallback.)
    for key in list(c.state["ingress"][0].data):
        c.state["ingress"][0].data[key] = b"{not json"
    with caplog.at_level(logging.CRITICAL, "onceflow.worker"), \
            pytest.raises(StateCorrupt, match="is not JSON"):
        await c.runtime.handle([doc("inv", 1, 2, uuid="i-1")])
    assert "partition 0 stops at record inv/0@1" in caplog.text
    assert not any(line["offset"] == 1 for line in c.journal())  # not dead-lettered


async def test_a_service_result_json_cannot_hold_is_processed_and_not_published() -> None:
    def service(document: Any) -> Any:
        return {"big": 2**70} if document["uuid"] == "i-1" else {"ok": True}

    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]},
                callees={"bill": (Callee("x:y", service, False, False), None)})
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1"), doc("inv", 1, 2, uuid="i-2")])
    assert journal(c) == [("bill", "processed", "i-1"), ("bill", "processed", "i-2")]
    first = c.journal()[0]
    assert "the service result cannot be written as JSON (TypeError: Integer exceeds 64-bit " \
           "range): it was not published" in first["reason"]
    outputs = [orjson.loads(r.value) for r in c.broker.records(c.names.topic("bill.out"))]
    assert outputs[0]["unwritable"]["reason"] == first["reason"]
    assert outputs[0]["documents"][0]["offset"] == 0
    assert outputs[1] == {"ok": True}


async def test_header_names_and_values_that_are_not_utf8_are_bad_input_naming_them() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    value = orjson.dumps({"uuid": "i-1"})
    await c.runtime.handle([
        Delivery("inv", 0, 0, 1, None, value, [("dup-id", b"\xff\xfe")]),
        Delivery("inv", 0, 1, 2, None, orjson.dumps({"uuid": "i-2"}),
                 [("dup-id", b"\xfe\xff")]),
        Delivery("inv", 0, 2, 3, None, orjson.dumps({}), [("\udcff", b"v")]),
        Delivery("inv", 0, 3, 4, None, orjson.dumps({"uuid": "i-4"}),
                 [("dup-id", "\ufffd".encode())]),
        Delivery("inv", 0, 4, 5, None, orjson.dumps({"uuid": "i-5"}),
                 [("reply-to", b"\xe9t\xe9")]),
    ])
    lines = sorted(c.journal(), key=lambda line: line["offset"])
    assert [(x["trigger"], x["outcome"], x["identity"]) for x in lines] == [
        (None, "bad-input", "i-1"), (None, "bad-input", "i-2"), (None, "bad-input", "inv/0@2"),
        ("bill", "processed", "i-4"), (None, "bad-input", "i-5")]
    reasons = [line.get("reason", "") for line in lines]
    assert reasons[0].startswith("header 'dup-id' is not UTF-8 (b'\\xff\\xfe')")
    assert reasons[2].startswith("a header name is not UTF-8 (b'\\xff')")
    assert reasons[4].startswith("header 'reply-to' is not UTF-8 (b'\\xe9t\\xe9')")


async def test_state_a_partition_cannot_be_built_from_stops_the_worker_naming_the_record(
        caplog: pytest.LogCaptureFixture) -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1")])
    c.runtime.forget_partitions([0])  # (as after a restart or a rebalance)
    c.state["control"][0].data[b"time"] = b"{not json"
    with caplog.at_level(logging.CRITICAL, "onceflow.worker"), \
            pytest.raises(StateCorrupt, match="onceflow-control-changelog partition 0"):
        await c.runtime.handle([doc("inv", 1, 2, uuid="i-2")])
    assert "partition 0 stops at record inv/0@1: its state cannot be read" in caplog.text


async def test_a_dead_letter_copy_keeps_a_key_that_is_not_utf8() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    await c.runtime.handle([
        Delivery("inv", 0, 0, 1, b"\xff\x00", b"not json", []),
        Delivery("inv", 0, 1, 2, b"\xfe", orjson.dumps({"uuid": "i-2"}), []),  # a document
        Delivery("inv", 0, 2, 3, b"k", b"not json either", []),
    ])
    assert sorted(journal(c), key=lambda line: line[2]) == [
        ("bill", "processed", "i-2"), (None, "bad-input", "inv/0@0"),
        (None, "bad-input", "inv/0@2")]
    letters = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert [x.get("key_base64") for x in letters] == ["/wA=", None]


async def test_a_null_header_value_reads_as_absent_and_stays_null_in_a_dead_letter() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    await c.runtime.handle([
        Delivery("inv", 0, 0, 1, None, orjson.dumps({"uuid": "i-1"}),
                 [("message-id", None), ("dup-id", None), ("x", b"y")]),
        Delivery("inv", 0, 1, 2, None, b"not json", [("trace", None), ("x", b"y")]),
    ])
    assert sorted(journal(c), key=lambda line: line[2]) == [("bill", "processed", "i-1"),
                                                           (None, "bad-input", "inv/0@1")]
    (letter,) = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert letter["headers"] == {"x": "y", "trace": None}


async def test_the_last_resort_keeps_the_bytes_of_what_it_cannot_read() -> None:
    # A header whose name is bytes, not text (no transport hands one over): reading the
    # record fails (wire.record_of, a TypeError), on the normal path and wherever it is
    # read again, so the dead letter is made from the record's bytes alone.
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    unreadable: Any = (b"b", b"\xfe")
    record = Delivery("inv", 0, 0, 1, b"\xff", orjson.dumps({"uuid": "i-1"}),
                      [("n", None), ("t", b"text"), unreadable])
    with pytest.raises(TypeError):
        wire.record_of(record, "inv")
    await c.runtime.handle([record])
    assert journal(c) == [(None, "bad-input", "inv/0@0")]
    (letter,) = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert letter["raw"] == '{"uuid":"i-1"}'
    assert letter["headers"] == {"n": None, "t": "text"}
    assert letter["headers_base64"] == [{"name": "Yg==", "value": "/g=="}]
    assert letter["key_base64"] == "/w=="


async def test_a_store_that_cannot_write_stops_the_worker_and_journals_no_record(
        caplog: pytest.LogCaptureFixture) -> None:
    from onceflow.tables.raw_partition import StorageError

    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1")])
    store = c.state["ingress"][0]

    def apply(writes: Any, offset: Any) -> None:
        raise StorageError("/data/v1/tables/ingress-0.db",
                           Exception("IO error: No space left on device"))

    store.apply = apply  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, "onceflow.worker"), \
            pytest.raises(StorageError, match="No space left on device"):
        await c.runtime.handle([doc("inv", 1, 2, uuid="i-2")])
    assert not any(line["outcome"] == "bad-input" for line in c.journal())
    assert c.broker.records(c.names.dead_letter) == []
    assert "one at a time" not in caplog.text  # not taken for a record's fault


async def test_a_delivery_without_a_record_time_is_bad_input_and_the_partition_goes_on(
) -> None:
    # The transport gives a record without a timestamp Kafka's -1 ms; a delivery made
    # without one anyway is a record the worker cannot decide, not a stop.
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    await c.runtime.handle([
        Delivery("inv", 0, 0, None, None, orjson.dumps({"uuid": "i-1"}), []),
        Delivery("inv", 0, 1, 2, None, orjson.dumps({"uuid": "i-2"}), []),
    ])
    assert journal(c) == [(None, "bad-input", "inv/0@0"), ("bill", "processed", "i-2")]
    (bad,) = [line for line in c.journal() if line["identity"] == "inv/0@0"]
    assert "record inv/0@0 has no time" in bad["reason"]
