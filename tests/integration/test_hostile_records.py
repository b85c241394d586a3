"""Hostile records through a real worker: each is journaled, none stops the worker.

Each of these used to stop the worker, again after every restart (the record was fetched
again): a header name that is not UTF-8 (aiokafka's decoder raised inside the consumer),
a `delivery-count` above 2^64 on a document passed on to another partition (orjson
cannot write the integer), and a document nested 1,000 levels deep passed on to another
partition (orjson writes at most 254 levels).  Header values that are not UTF-8 were
decoded with replacement characters, so two different `dup-id`s were one and the second
document was dropped as `duplicate-id`.  Now each is journaled (bad-input with a reason,
or processed), the partition goes on past it, and a restart does not meet it again.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.producer import message_accumulator
from aiokafka.producer import producer as producer_module
from aiokafka.record import default_records
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer
from onceflow.values import deep_json

from .support import outcomes, records, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = """
[[trigger]]
name = "orders"
types = ["order"]
service = "scripted"

[[trigger]]
name = "plain"
types = ["plain"]
service = "scripted"
use_history = false
"""
PARTITIONS = 2


class RawName(str):
    """A header name whose bytes are not UTF-8: aiokafka's pure-Python batch builder
    writes whatever `encode` returns (its compiled builder only takes real strings)."""

    def __new__(cls, data: bytes) -> RawName:
        name = super().__new__(cls, data.decode("latin-1"))
        name.data = data  # type: ignore[attr-defined]
        return name

    def encode(self, *_: Any, **__: Any) -> bytes:  # type: ignore[override]
        return self.data  # type: ignore[attr-defined,no-any-return]


def send_batch(bootstrap: str, topic: str, partition: int,
               rows: list[tuple[bytes, list[tuple[str, bytes]]]]) -> list[int]:
    """Send (value, headers) rows as one record batch; their offsets."""
    async def run() -> list[int]:
        async with Producer(bootstrap) as producer:
            batch = producer.create_batch()
            for value, headers in rows:
                assert batch.append(key=b"k", value=value, timestamp=None,
                                    headers=headers) is not None
            batch.close()
            metadata = await (await producer.send_batch(batch, topic, partition=partition))
            return [metadata.offset + i for i in range(len(rows))]
    return asyncio.run(run())


def elsewhere(uuid_prefix: str, partition: int) -> str:
    """A uuid whose documents are routed away from `partition` (to be passed on)."""
    for n in range(100):
        uuid = f"{uuid_prefix}-{n}"
        if wire.route_partition(uuid, PARTITIONS) != partition:
            return uuid
    raise AssertionError("no uuid routes elsewhere")


def letters(bootstrap: str, names: wire.Names) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in records(bootstrap, names.dead_letter)]


def test_a_header_name_that_is_not_utf8_is_bad_input_and_the_partition_goes_on(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (message_accumulator, producer_module):
        monkeypatch.setattr(module, "DefaultRecordBatchBuilder",
                            default_records._DefaultRecordBatchBuilderPy)
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = wire.Names(prefix)
    worker = start_worker(triggers, prefix, partitions=PARTITIONS)
    doc = lambda uuid: orjson.dumps({"uuid": uuid})  # noqa: E731
    # One batch: the bad record between two good ones, so the fetch that meets it holds
    # records on both sides.
    offsets = send_batch(broker.bootstrap, names.topic("order"), 0, [
        (doc("before-1"), [("trace", b"t-1")]),
        (doc("bad-name-1"), [("trace", b"t-2"), (RawName(b"\xff\xfe"), b"\x01\x02")]),
        (doc("after-1"), []),
    ])
    lines = wait_journal(broker.bootstrap, names, lambda ls: all(
        outcomes(ls, name) for name in ("before-1", "bad-name-1", "after-1")), worker)
    assert outcomes(lines, "before-1") == ["processed"]
    assert outcomes(lines, "after-1") == ["processed"]
    (bad,) = [line for line in lines if line["identity"] == "bad-name-1"]
    assert (bad["trigger"], bad["outcome"], bad["offset"]) == (None, "bad-input", offsets[1])
    assert "a header name is not UTF-8 (b'\\xff\\xfe')" in bad["reason"]
    # The dead-letter copy keeps the record: its value, the UTF-8 headers as text and the
    # others' bytes.
    (letter,) = [x for x in letters(broker.bootstrap, names) if x["offset"] == offsets[1]]
    assert letter["value"] == {"uuid": "bad-name-1"}
    assert letter["headers"] == {"trace": "t-2"}
    assert letter["headers_base64"] == [{"name": base64.b64encode(b"\xff\xfe").decode(),
                                         "value": base64.b64encode(b"\x01\x02").decode()}]
    assert worker.alive

    # Its offset was committed: a restart goes on from after it.
    worker.stop()
    worker = start_worker(triggers, prefix, partitions=PARTITIONS)
    send_batch(broker.bootstrap, names.topic("order"), 0, [(doc("after-restart-1"), [])])
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "after-restart-1") == ["processed"], worker)
    assert outcomes(lines, "bad-name-1") == ["bad-input"]
    assert outcomes(lines, "before-1") == outcomes(lines, "after-1") == ["processed"]
    assert worker.alive


def test_header_values_counts_and_depths_that_stopped_the_worker_or_merged_documents(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = wire.Names(prefix)
    worker = start_worker(triggers, prefix, partitions=PARTITIONS)
    deep: Any = []
    for _ in range(997):
        deep = [deep]  # 998 levels of arrays; with the envelope and "body": 1,000
    huge_count = elsewhere("count", 0)
    deep_uuid = elsewhere("deep", 0)
    topic = names.topic("order")
    rows: list[tuple[bytes, list[tuple[str, bytes]]]] = [
        # Two dup-ids that "replace" decoding made one (U+FFFD): neither is dropped as a
        # duplicate of the other, nor of a dup-id that is U+FFFD itself.
        (orjson.dumps({"uuid": "fffd-1"}), [("dup-id", "\ufffd".encode())]),
        (orjson.dumps({"uuid": "dup-1"}), [("dup-id", b"\xff\xfe")]),
        (orjson.dumps({"uuid": "dup-2"}), [("dup-id", b"\xfe\xff")]),
        # Two message ids likewise, on documents without uuid.
        (orjson.dumps({"body": 1}), [("message-id", b"\xff")]),
        (orjson.dumps({"body": 2}), [("message-id", b"\xfe")]),
        # A delivery count above 2^64 on a document passed on to the other partition: an
        # undefined count (New, with history).
        (orjson.dumps({"uuid": huge_count}), [("delivery-count", b"18446744073709551616")]),
        # A document 1,000 levels deep, also one to be passed on.
        (deep_json({"uuid": deep_uuid, "body": {"deep": deep}}).encode(), []),
        (orjson.dumps({"uuid": "last-1"}), []),
    ]
    offsets = send_batch(broker.bootstrap, topic, 0, rows)
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: bool(outcomes(ls, "last-1")) and len(
                             [x for x in ls if x["topic"] == "order"]) >= len(rows), worker)
    by_offset = {line["offset"]: line for line in lines if line["topic"] == "order"}
    assert outcomes(lines, "fffd-1") == ["processed"]
    for offset, header in zip(offsets[1:5], ["dup-id", "dup-id", "message-id", "message-id"],
                              strict=True):
        line = by_offset[offset]
        assert (line["trigger"], line["outcome"]) == (None, "bad-input"), line
        assert f"header {header!r} is not UTF-8" in line["reason"]
    assert by_offset[offsets[1]]["identity"] == "dup-1"
    assert by_offset[offsets[2]]["identity"] == "dup-2"
    # Without a uuid the identity is the record's coordinates, never the bad message id.
    assert by_offset[offsets[3]]["identity"] == f"order/0@{offsets[3]}"
    assert outcomes(lines, huge_count) == ["processed"]
    (deep_line,) = [x for x in lines if x["identity"] == deep_uuid]
    assert deep_line["outcome"] == "bad-input"
    assert "more than 128 levels deep" in deep_line["reason"]
    assert outcomes(lines, "last-1") == ["processed"]
    kept = {x["offset"]: x for x in letters(broker.bootstrap, names) if x["topic"] == "order"}
    assert kept[offsets[1]]["headers_base64"] == [
        {"name": base64.b64encode(b"dup-id").decode(),
         "value": base64.b64encode(b"\xff\xfe").decode()}]
    assert kept[offsets[6]]["raw"].encode() == rows[6][0]
    assert worker.alive

    # Nothing of it is met again after a restart, and the partition goes on.
    worker.stop()
    worker = start_worker(triggers, prefix, partitions=PARTITIONS)
    send_batch(broker.bootstrap, topic, 0, [(orjson.dumps({"uuid": "last-2"}), [])])
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "last-2") == ["processed"], worker)
    assert len([x for x in lines if x["topic"] == "order"]) == len(rows) + 1
    assert worker.alive
