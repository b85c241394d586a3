"""Reply-to topics a publisher names: illegal names, missing topics, onceflow's own topics.

The error document always reaches the trigger's error topic; the reply-to copy goes to
the named topic when it can (the worker creates a missing one as it creates its other
output topics), else to the dead-letter topic with the reason; the worker goes on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker

from .support import (
    ORDERS_ONLY,
    Outgoing,
    outcomes,
    partition_count,
    publish,
    records,
    wait_journal,
)

pytestmark = pytest.mark.integration

TRIGGERS = ORDERS_ONLY


def failing(uuid: str, reply_to: str | None = None, *, in_envelope: bool = False
            ) -> Outgoing:
    value: dict[str, Any] = {"uuid": uuid, "body": {"raise": "fatal"}}
    headers = {}
    if reply_to is not None and in_envelope:
        value["reply-to"] = reply_to
    elif reply_to is not None:
        headers["reply-to"] = reply_to
    return ("order", orjson.dumps(value), uuid, headers, 0)


def test_reply_to_topics_that_cannot_be_written_do_not_stop_the_worker(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = Names(prefix)
    worker = start_worker(triggers, prefix, partitions=2)
    started = time.monotonic()
    publish(broker.bootstrap, names, [
        failing("r-illegal", "bad topic!"),
        failing("r-too-long", "r" * 250),
        failing("r-journal", "onceflow.journal", in_envelope=True),
        failing("r-new", "replies.new"),
        failing("r-none"),
        ("order", orjson.dumps({"uuid": "good-1"}), "good-1", {}, 0),
    ])
    uuids = ("r-illegal", "r-too-long", "r-journal", "r-new", "r-none", "good-1")
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: all(outcomes(ls, uuid) for uuid in uuids), worker)
    # No wait for a producer's metadata time-out (about 40 s) on the way.
    assert time.monotonic() - started < 25
    assert outcomes(lines, "good-1") == ["processed"]
    for uuid in uuids[:-1]:
        assert outcomes(lines, uuid) == ["error"], (uuid, lines)
    reasons = {line["identity"]: line.get("reason") for line in lines}
    assert "not a legal Kafka topic name" in reasons["r-illegal"]
    assert "onceflow.dead-letter" in reasons["r-illegal"]
    assert "not a legal Kafka topic name" in reasons["r-too-long"]
    assert "onceflow's own topics" in reasons["r-journal"]
    assert reasons["r-new"] == reasons["r-none"] == (
        "ScriptedFailure: scripted service: body.raise is 'fatal'")

    # Every error document reached the error topic, saying what became of its reply copy.
    errors = {doc["identity"]: doc for doc in
              (orjson.loads(r.value) for r in records(broker.bootstrap,
                                                       names.topic("orders.error")))}
    assert sorted(errors) == ["r-illegal", "r-journal", "r-new", "r-none", "r-too-long"]
    assert "reply_to" not in errors["r-none"]
    assert errors["r-new"]["reply_to"] == [{"topic": "replies.new", "sent": True}]
    (illegal,) = errors["r-illegal"]["reply_to"]
    assert illegal["topic"] == "bad topic!" and illegal["sent"] is False
    assert "not a legal Kafka topic name" in illegal["reason"]

    # The missing legal topic was created like the worker's other output topics (with
    # ONCEFLOW_PARTITIONS partitions; the embedded broker would have made 4).
    assert partition_count(broker.bootstrap, names.topic("replies.new")) == 2
    (reply,) = records(broker.bootstrap, names.topic("replies.new"))
    assert orjson.loads(reply.value)["identity"] == "r-new"

    # The copies that could not go where they were asked to are in the dead-letter topic.
    dead = records(broker.bootstrap, names.dead_letter)
    letters = {orjson.loads(r.value)["value"]["identity"]: (orjson.loads(r.value),
                                                             dict(r.headers)) for r in dead}
    assert sorted(letters) == ["r-illegal", "r-journal", "r-too-long"]
    letter, headers = letters["r-illegal"]
    assert letter["reply_to"] == "bad topic!"
    assert letter["value"]["error"]["type"] == "ScriptedFailure"
    assert (letter["topic"], letter["partition"]) == ("order", 0)
    assert b"not a legal Kafka topic name" in headers["reason"]
    # Nothing was written to the journal but journal records.
    assert all("outcome" in line for line in lines)
    assert worker.alive
