"""What the worker writes when a reply-to topic fails or a record would be too large.

The integration tests show the common cases on a real broker; these show, in process,
the ones the embedded broker cannot produce: a reply-to topic the broker refuses or never
answers for, the memory of a broken topic, results and journal records over the limit.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from memory_broker import MemoryBroker
from onceflow.agents import outputs, wire
from onceflow.agents.topics import KafkaTopicMaker, illegal_topic_name
from onceflow.tables.outbox import Outbox, record_size
from onceflow.triggers import parse_triggers

from .cluster import LocalCluster


def cluster(*triggers: dict[str, Any], **options: Any) -> LocalCluster:
    return LocalCluster(parse_triggers({"trigger": list(triggers)}), partitions=1, **options)


def failing(uuid: str, reply_to: str) -> wire.Delivery:
    value = orjson.dumps({"uuid": uuid, "body": {"raise": "fatal"}})
    return wire.Delivery("order", 0, 0, 1, uuid.encode(), value,
                         [("reply-to", reply_to.encode())])


def values(c: LocalCluster, topic: str) -> list[Any]:
    return [orjson.loads(r.value) for r in c.broker.records(c.names.topic(topic))]


class Refusing(MemoryBroker):
    """A broker that refuses one topic (or never answers for it)."""

    def __init__(self, base: MemoryBroker, topic: str, *, hang: bool = False) -> None:
        super().__init__(base.default_partitions)
        self.topics = base.topics
        self.refused = topic
        self.hang = hang

    async def send(self, outbox: Outbox) -> dict[tuple[str, int], int]:
        if any(topic == self.refused for topic, _ in outbox.records):
            if self.hang:
                await asyncio.sleep(3600)
            raise RuntimeError("TopicAuthorizationFailedError")
        return await super().send(outbox)


@pytest.mark.parametrize("hang", [False, True])
async def test_a_reply_to_topic_that_cannot_be_written_gets_a_dead_letter_copy(
        hang: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outputs, "REPLY_WAIT", 0.05)
    c = cluster({"name": "orders", "service": "scripted", "types": ["order"]})
    c.runtime.sender = Refusing(c.broker, "replies", hang=hang)
    await c.runtime.handle([failing("o-1", "replies")])
    ((line),) = [orjson.loads(r.value) for r in c.broker.records(c.names.journal)]
    assert line["outcome"] == "error"
    assert "reply-to 'replies' could not be written" in line["reason"]
    assert ("no answer in 0.05 s" if hang else "TopicAuthorizationFailedError") in line["reason"]
    (error,) = values(c, "orders.error")
    assert error["reply_to"][0]["sent"] is False
    (letter,) = values(c, "onceflow.dead-letter")
    assert letter["reply_to"] == "replies" and letter["value"]["identity"] == "o-1"
    assert values(c, "replies") == []


async def test_a_broken_reply_topic_is_not_tried_again_for_a_while() -> None:
    now = [0.0]
    maker = KafkaTopicMaker("unused:9092", 4, clock=lambda: now[0])

    class Admin:
        calls = 0

        async def create_topics(self, topics: list[Any]) -> Any:
            Admin.calls += 1
            return type("Answer", (), {"topic_errors": [(topics[0].name, 36, None)]})()

    maker._admin = Admin()
    assert await maker.ensure("replies") is None and Admin.calls == 1
    assert await maker.ensure("replies") is None and Admin.calls == 1  # known
    maker.broken("replies", "'replies' could not be written (refused)")
    assert await maker.ensure("replies") == "'replies' could not be written (refused)"
    now[0] += 61
    assert await maker.ensure("replies") is None and Admin.calls == 2


def test_kafka_topic_names() -> None:
    assert illegal_topic_name("orders.replies_1-a") is None
    assert illegal_topic_name("r" * 249) is None
    for name in ("", ".", "..", "bad topic!", "r" * 250, "ümlaut", "a/b"):
        assert illegal_topic_name(name), name


async def test_a_service_result_over_the_limit_is_an_error_with_an_error_document() -> None:
    # The result cannot go by reference (it exists nowhere else): the run is an error.
    c = cluster({"name": "copy", "types": ["doc"], "service": "echo"}, max_record_bytes=20_000)
    value = orjson.dumps({"uuid": "d-1", "body": "x" * 19_950})
    await c.runtime.handle([wire.Delivery("doc", 0, 0, 1, b"d-1", value, [])])
    ((line),) = [orjson.loads(r.value) for r in c.broker.records(c.names.journal)]
    assert line["outcome"] == "error"
    assert line["reason"].startswith("ResultTooLarge: the service result is ")
    assert "bytes over ONCEFLOW_MAX_RECORD_BYTES (20000): it was not published on copy.out" \
        in line["reason"]
    assert values(c, "copy.out") == []
    (error,) = values(c, "copy.error")
    assert error["identity"] == "d-1" and error["error"]["type"] == "ResultTooLarge"
    size = int(error["error"]["message"].split(" is ")[1].split(" bytes")[0])
    assert size > 20_000 and f"{size - 20_000} bytes over" in error["error"]["message"]
    assert error["documents"][0]["offset"] == 0  # by reference: the input is large too
    # A copy of the document is `rejected` (the earlier run failed), not `duplicate`.
    await c.runtime.handle([wire.Delivery("doc", 0, 1, 2, b"d-1", value, [])])
    assert [orjson.loads(r.value)["outcome"] for r in c.broker.records(c.names.journal)] \
        == ["error", "rejected"]


async def test_a_huge_identity_is_clipped_in_the_journal_and_outputs() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]}, max_record_bytes=50_000)
    uuid = "u" * 30_000  # longer than 96: in doubt, with the identity in every record
    await c.runtime.handle([wire.Delivery("inv", 0, 0, 1, None,
                                          orjson.dumps({"uuid": uuid}), [])])
    for record in c.broker.records(c.names.journal) + c.broker.records(
            c.names.topic("bill.in-doubt")):
        assert record_size(record.key, record.value, record.headers) <= 50_000
    (line,) = [orjson.loads(r.value) for r in c.broker.records(c.names.journal)]
    assert line["outcome"] == "in-doubt" and line["identity"].endswith("(30000 characters)")
    (doubt,) = values(c, "bill.in-doubt")
    assert doubt["documents"][0]["offset"] == 0
