"""Bad records get clear bad-input (or in-doubt) records, and the worker keeps going."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer, TopicFollower, read_topic

from .support import orders_and_pairs

pytestmark = pytest.mark.integration

TRIGGERS = orders_and_pairs(join_timeout=None)

ONE_MB = 1024 * 1024


def bad_records() -> list[tuple[str, str, bytes | None]]:
    """(name, topic, value) of every kind of bad record, with good ones between."""
    big = orjson.dumps({"uuid": "big-1", "body": {"blob": "x" * ONE_MB}})
    return [
        ("good-1", "order", orjson.dumps({"uuid": "good-1"})),
        ("not-json", "order", b"{this is not json"),
        ("empty", "order", None),
        ("array", "order", orjson.dumps([1, 2, 3])),
        ("uuid-number", "order", orjson.dumps({"uuid": 5})),
        ("type-null", "order", orjson.dumps({"type": None, "uuid": "t-1"})),
        ("activation-object", "left", orjson.dumps({"uuid": "a-1", "activation": {}})),
        ("one-megabyte", "order", big),
        ("no-activation", "left", orjson.dumps({"uuid": "lonely-1", "body": {}})),
        ("unknown-type", "order", orjson.dumps({"type": "mystery", "uuid": "m-1"})),
        ("identity-too-long", "order", orjson.dumps({"uuid": "u" * 200})),
        ("good-2", "order", orjson.dumps({"uuid": "good-2"})),
    ]


def test_bad_records_are_reported_and_the_worker_goes_on(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = Names(prefix)
    worker = start_worker(triggers, prefix, partitions=2)
    sent: dict[tuple[str, int, int], str] = {}

    async def run() -> list[dict[str, Any]]:
        journal = await TopicFollower(broker.bootstrap, names.journal).start()
        try:
            async with Producer(broker.bootstrap) as producer:
                for name, topic, value in bad_records():
                    metadata = await producer.send_and_wait(names.topic(topic), value,
                                                            key=name.encode())
                    sent[(topic, metadata.partition, metadata.offset)] = name
            # Every record gets a journal record, each on its own partition's time: the
            # good one sent last is not always journaled last.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                lines = [orjson.loads(r.value) for r in journal.records]
                journaled = {(line["topic"], line["partition"], line["offset"])
                             for line in lines}
                if journaled >= set(sent):
                    return lines
                await journal.wait(0.5)
            raise AssertionError("some records have no journal record: "
                                 f"{[sent[k] for k in set(sent) - journaled]}")
        finally:
            await journal.stop()

    lines = asyncio.run(run())
    by_name: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        name = sent.get((line["topic"], line["partition"], line["offset"]))
        if name is not None:
            by_name.setdefault(name, []).append(line)

    def only(name: str) -> dict[str, Any]:
        (line,) = by_name[name]
        return line

    for name in ("not-json", "empty", "array", "uuid-number", "type-null",
                 "activation-object", "one-megabyte", "unknown-type"):
        line = only(name)
        assert (line["trigger"], line["outcome"]) == (None, "bad-input"), line
        assert line["reason"], line
    assert "not JSON" in only("not-json")["reason"]
    assert "'uuid' must be a string" in only("uuid-number")["reason"]
    assert "max_document_bytes" in only("one-megabyte")["reason"]
    assert only("one-megabyte")["identity"] == "big-1"
    assert "mystery" in only("unknown-type")["reason"]
    lonely = only("no-activation")
    assert (lonely["trigger"], lonely["outcome"]) == ("pairs", "bad-input")
    assert "activation" in lonely["reason"]
    too_long = only("identity-too-long")
    assert (too_long["trigger"], too_long["outcome"]) == ("orders", "in-doubt")
    assert "longer than 96" in too_long["reason"]
    assert only("good-1")["outcome"] == only("good-2")["outcome"] == "processed"

    # Nothing is lost: the rejected records are in the dead-letter topic (the big one by
    # reference only), the document without activation is on the trigger's error topic.
    dead = asyncio.run(read_topic(broker.bootstrap, names.dead_letter))
    assert len(dead) == 8
    big = next(orjson.loads(r.value) for r in dead if b"max_document_bytes" in r.value)
    assert "value" not in big and big["topic"] == "order"
    errors = asyncio.run(read_topic(broker.bootstrap, names.topic("pairs.error")))
    (error,) = [orjson.loads(r.value) for r in errors]
    assert error["identity"] == "lonely-1" and error["error"]["type"] == "BadInput"
    assert worker.alive
