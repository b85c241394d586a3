"""Records the worker writes stay within the broker's record limit (ONCEFLOW_MAX_RECORD_BYTES).

What the worker derives from a document can be larger than the document: an error document
wraps it, a routed document carries it with its routing data, an open join holds several
members, and the dead-letter copy of a value that is not UTF-8 turns each bad byte into
three.  None of them may stop the worker (on Kafka, a record over `message.max.bytes` fails
its whole batch, after every restart): what does not fit goes out by reference to the input
records, which stay on their topics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names, route_partition
from onceflow.app.broker import EmbeddedBroker

from .support import Outgoing, outcomes, publish, records, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = """
[[trigger]]
name = "orders"
types = ["order"]
service = "scripted"

[[trigger]]
name = "triple"
types = ["a", "b", "c"]
service = "scripted"
condition = "all"
"""
LIMIT = 500_000


def uuid_routed_to(partition: int, stem: str) -> str:
    """A uuid whose routing key belongs to `partition` (of 2)."""
    return next(f"{stem}-{i}" for i in range(100) if route_partition(f"{stem}-{i}", 2)
                == partition)


def sized(size: int, **fields: Any) -> bytes:
    """An envelope of exactly `size` bytes."""
    body = dict(fields.pop("body", {}))
    body["blob"] = ""
    bare = len(orjson.dumps({**fields, "body": body}))
    body["blob"] = "x" * (size - bare)
    value = orjson.dumps({**fields, "body": body})
    assert len(value) == size
    return value


def test_outputs_over_the_record_limit_go_by_reference_and_the_worker_goes_on(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = Names(prefix)
    worker = start_worker(triggers, prefix, partitions=2, max_record_bytes=LIMIT,
                          max_document_bytes=LIMIT)
    local = uuid_routed_to(0, "big-local")     # decided on its input partition (0)
    remote = uuid_routed_to(1, "big-remote")   # must be routed to partition 1
    near = LIMIT - 200
    sent: list[Outgoing] = [
        ("order", sized(near, uuid=local, body={"raise": "fatal"}), local, {}, 0),
        ("order", sized(near, uuid=remote), remote, {}, 0),
        ("order", b"\xff" * 200_000, "not-utf8", {}, 0),
        ("a", sized(300_000, uuid="a-1", activation="x"), "a-1", {}, 0),
    ]
    coordinates = publish(broker.bootstrap, names, sent)
    # The worker takes each topic's records in order, not the topics' records in the order
    # they were sent: the join's members go one after another.
    wait_journal(broker.bootstrap, names, lambda ls: outcomes(ls, "a-1") == ["join-pending"],
                 worker)
    coordinates.update(publish(broker.bootstrap, names, [
        ("b", sized(300_000, uuid="b-big", activation="x"), "b-big", {}, 0)]))
    wait_journal(broker.bootstrap, names, lambda ls: bool(outcomes(ls, "b-big")), worker)
    coordinates.update(publish(broker.bootstrap, names, [
        ("b", orjson.dumps({"uuid": "b-1", "activation": "x"}), "b-1", {}, 0),
        ("c", orjson.dumps({"uuid": "c-1", "activation": "x"}), "c-1", {}, 0),
        ("order", orjson.dumps({"uuid": "good-1"}), "good-1", {}, 0),
    ]))
    where = {key: place for place, key in coordinates.items()}
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "good-1") == ["processed"]
                         and "processed" in outcomes(ls, "c-1"), worker)
    by_identity = {line["identity"]: line for line in lines}

    # The service failed on a document near the limit: its error document would not fit.
    assert outcomes(lines, local) == ["error"]
    assert "ONCEFLOW_MAX_RECORD_BYTES" in by_identity[local]["reason"]
    errors = records(broker.bootstrap, names.topic("orders.error"))
    error_docs = {orjson.loads(r.value)["identity"]: orjson.loads(r.value) for r in errors}
    error = error_docs[local]
    assert error["error"]["type"] == "ScriptedFailure"
    assert error["oversized"]["limit"] == LIMIT and error["oversized"]["size"] > LIMIT
    (reference,) = error["documents"]
    assert (reference["topic"], reference["partition"], reference["offset"]) == where[local]
    assert reference["identity"] == local

    # A document that cannot be routed to the partition that owns it with its routing data.
    assert outcomes(lines, remote, "orders") == ["bad-input"]
    assert "ONCEFLOW_MAX_RECORD_BYTES" in by_identity[remote]["reason"]
    bad = error_docs[remote]
    assert bad["error"]["type"] == "BadInput"
    (reference,) = bad["documents"]
    assert (reference["topic"], reference["partition"], reference["offset"]) == where[remote]

    # A value that is not UTF-8: its dead-letter copy (3 bytes a bad byte) by reference.
    (not_utf8,) = [line for line in lines if (line["topic"], line["partition"], line["offset"])
                   == where["not-utf8"]]
    assert (not_utf8["trigger"], not_utf8["outcome"]) == (None, "bad-input")
    (letter,) = [orjson.loads(r.value) for r in records(broker.bootstrap, names.dead_letter)]
    assert "raw" not in letter and letter["size"] == 200_000
    assert "ONCEFLOW_MAX_RECORD_BYTES" in letter["reason"]

    # A join member that would make the open join's state too large is not joined; the
    # join goes on with the members that fit.
    assert outcomes(lines, "b-big") == ["bad-input"]
    assert "open join" in by_identity["b-big"]["reason"]
    assert outcomes(lines, "a-1") == ["join-pending", "processed"]
    assert outcomes(lines, "b-1")[-1] == outcomes(lines, "c-1")[-1] == "processed"
    (triple_error,) = [orjson.loads(r.value)
                       for r in records(broker.bootstrap, names.topic("triple.error"))]
    assert triple_error["identity"] == "b-big"
    assert triple_error["documents"][0]["offset"] == where["b-big"][2]

    # Nothing the worker wrote is over the limit.
    for topic in ("orders.error", "triple.error", "onceflow.dead-letter", "onceflow.journal",
                  "onceflow.route", "orders.out", "triple.out"):
        for record in records(broker.bootstrap, names.topic(topic)):
            assert len(record.value or b"") + len(record.key or b"") < LIMIT, topic
    assert worker.alive


def test_a_result_over_the_record_limit_is_an_error_on_the_error_topic(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    """A service result cannot go by reference (it exists nowhere else): the run is an
    `error`, and the error document on the trigger's error topic says by how much the
    result was over the limit (ONCEFLOW_MAX_RECORD_BYTES lowered so that a record can be
    over it without being over the embedded broker's own limit)."""
    triggers = tmp_path / "triggers.toml"
    triggers.write_text('[[trigger]]\nname = "copy"\ntypes = ["copy"]\nservice = "echo"\n')
    prefix = new_prefix()
    names = Names(prefix)
    worker = start_worker(triggers, prefix, partitions=1, max_record_bytes=LIMIT,
                          max_document_bytes=LIMIT)
    publish(broker.bootstrap, names, [
        ("copy", sized(LIMIT - 40, uuid="big"), "big", {}, 0),
        ("copy", orjson.dumps({"uuid": "small"}), "small", {}, 0)])
    lines = wait_journal(broker.bootstrap, names, lambda ls: bool(outcomes(ls, "small")),
                         worker)
    assert outcomes(lines, "big") == ["error"] and outcomes(lines, "small") == ["processed"]
    (line,) = [x for x in lines if x["identity"] == "big"]
    assert line["reason"].startswith("ResultTooLarge: the service result is ")
    out = [orjson.loads(r.value) for r in records(broker.bootstrap, names.topic("copy.out"))]
    assert out == [{"uuid": "small"}]
    (error,) = [orjson.loads(r.value) for r in records(broker.bootstrap,
                                                        names.topic("copy.error"))]
    assert error["identity"] == "big" and error["error"]["type"] == "ResultTooLarge"
    message = error["error"]["message"]
    size = int(message.split(" is ")[1].split(" bytes")[0])
    assert size > LIMIT and message == (
        f"the service result is {size} bytes, {size - LIMIT} bytes over "
        f"ONCEFLOW_MAX_RECORD_BYTES ({LIMIT}): it was not published on copy.out")
    assert worker.alive
