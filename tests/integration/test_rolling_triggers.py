"""A routed document for a trigger the receiving worker does not have (a rolling change).

While workers run with different trigger files, one worker can route a document to a
partition owned by a worker that lacks the trigger.  It must not vanish: the receiving
worker journals `error` with the reason and puts the document on the dead-letter topic;
once every worker has the new file, `onceflow resubmit TRIGGER --outcome error` runs it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_runner import onceflow
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer
from onceflow.envelope import Document, record_time

from .support import outcomes, publish, records, wait_journal

pytestmark = pytest.mark.integration

OLD = """
[[trigger]]
name = "orders"
types = ["order"]
service = "scripted"
"""
NEW = OLD + """
[[trigger]]
name = "audit"
types = ["order"]
service = "scripted"
"""


def test_a_document_routed_for_an_unknown_trigger_is_journaled_and_kept(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text(OLD)
    new.write_text(NEW)
    prefix = new_prefix()
    names = wire.Names(prefix)
    worker = start_worker(old, prefix, partitions=2)
    envelope = {"uuid": "o-1", "body": {"n": 1}}
    ((topic, partition, offset),) = publish(broker.bootstrap, names, [
        ("order", orjson.dumps(envelope), "o-1", {}, 0)])
    wait_journal(broker.bootstrap, names, lambda ls: outcomes(ls, "o-1") == ["processed"],
                 worker)

    # What a worker running the new file sends for the new trigger.
    doc = Document("order", "o-1", None, envelope, record_time(time.time()), topic, partition,
                   offset, f"{topic}/{partition}@{offset}", 1, "o-1", {})

    async def route() -> None:
        async with Producer(broker.bootstrap) as producer:
            await producer.send_and_wait(names.route, wire.doc_message(["audit"], doc),
                                         key=b"o-1",
                                         partition=wire.route_partition("o-1", 2))

    asyncio.run(route())
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "o-1", "audit") == ["error"], worker)
    (line,) = [x for x in lines if x["trigger"] == "audit"]
    assert "trigger 'audit' is not defined on this worker" in line["reason"]
    assert (line["topic"], line["partition"], line["offset"]) == (topic, partition, offset)
    (dead,) = records(broker.bootstrap, names.dead_letter)
    letter = orjson.loads(dead.value)
    assert letter["triggers"] == ["audit"] and letter["value"] == envelope
    assert (letter["topic"], letter["partition"], letter["offset"]) == (topic, partition, offset)
    assert b"not defined on this worker" in dict(dead.headers)["reason"]
    assert worker.alive

    # After the change, the document is resubmitted and runs.
    worker.stop()
    worker = start_worker(new, prefix, name="w2", partitions=2)
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_PARTITIONS": "2", "ONCEFLOW_ADMIN_TOKEN": "resubmit-signs"}
    done = onceflow("resubmit", "audit", "--triggers", str(new), "--outcome", "error", env=env)
    assert done.returncode == 0, done.stderr
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: "processed" in outcomes(ls, "o-1", "audit"), worker)
    assert outcomes(lines, "o-1", "orders")[0] == "processed"
