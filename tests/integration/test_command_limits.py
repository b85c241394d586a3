"""`onceflow send` and `onceflow resubmit` check what they write before they write any of it.

A record larger than ONCEFLOW_MAX_RECORD_BYTES would be refused by the broker (Apache
Kafka; tansu takes it, so these tests would not see a failure, only a half-sent file):
both commands measure every record first and, when one is too large, stop with an error
naming its line or document, having sent nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from cli_runner import onceflow
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer

from .support import ORDERS_ONLY, records

pytestmark = pytest.mark.integration

TRIGGERS = ORDERS_ONLY
LIMIT = 16_384


def settings(broker: EmbeddedBroker, prefix: str) -> dict[str, str]:
    return {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
            "ONCEFLOW_PARTITIONS": "4", "ONCEFLOW_MAX_RECORD_BYTES": str(LIMIT)}


def test_send_refuses_a_file_with_a_record_over_the_limit_and_sends_nothing(
        broker: EmbeddedBroker, new_prefix: object, tmp_path: Path) -> None:
    prefix = new_prefix()  # type: ignore[operator]
    names = wire.Names(prefix)
    lines = [{"ts": 0, "topic": "order", "value": {"uuid": "small-1"}},
             {"ts": 1, "topic": "order", "value": {"uuid": "big-1", "body": "x" * 20_000}},
             {"ts": 2, "topic": "order", "headers": {"dup-id": "d" * 20_000},
              "value": {"uuid": "big-2"}},
             {"ts": 3, "topic": "order", "value": {"uuid": "small-2"}}]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    done = onceflow("send", str(path), env=settings(broker, prefix))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{path}:2: the record for 'order' is about" in done.stderr
    assert f"{path}:3: the record for 'order' is about" in done.stderr
    assert f"more than ONCEFLOW_MAX_RECORD_BYTES ({LIMIT})" in done.stderr
    assert "nothing was sent" in done.stderr
    assert records(broker.bootstrap, names.topic("order")) == []

    # Within the limit, the same command sends the file.
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in (lines[0], lines[3])))
    done = onceflow("send", str(path), env=settings(broker, prefix))
    assert done.returncode == 0, done.stderr
    assert len(records(broker.bootstrap, names.topic("order"))) == 2


def test_resubmit_refuses_a_document_too_large_to_route_and_resubmits_nothing(
        broker: EmbeddedBroker, new_prefix: object, tmp_path: Path) -> None:
    prefix = new_prefix()  # type: ignore[operator]
    names = wire.Names(prefix)
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    # What a worker leaves behind: two documents on their topic, journaled `error` (and a
    # journal record that is not JSON, which the command skips).
    near = orjson.dumps({"uuid": "big-1", "body": "x" * (LIMIT - 200)})

    async def setup() -> None:
        async with Producer(broker.bootstrap) as producer:
            for offset, (identity, value) in enumerate(
                    [("small-1", orjson.dumps({"uuid": "small-1"})), ("big-1", near)]):
                await producer.send_and_wait(names.topic("order"), value, partition=0)
                await producer.send_and_wait(names.journal, orjson.dumps({
                    "trigger": "orders", "outcome": "error", "identity": identity,
                    "activation": None, "ts": 1.0, "topic": "order", "partition": 0,
                    "offset": offset, "reason": "failed"}), key=identity.encode())
            await producer.send_and_wait(names.journal, b"{not json", partition=0)

    asyncio.run(setup())
    env = {**settings(broker, prefix), "ONCEFLOW_ADMIN_TOKEN": "resubmit-signs"}
    done = onceflow("resubmit", "orders", "--triggers", str(triggers), "--outcome", "error",
                    env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "document big-1 (order/0@1): with its routing data it is about" in done.stderr
    assert f"more than ONCEFLOW_MAX_RECORD_BYTES ({LIMIT})" in done.stderr
    assert "Nothing was resubmitted" in done.stderr
    assert "is not a JSON object; skipped" in done.stderr
    assert records(broker.bootstrap, names.route) == []

    done = onceflow("resubmit", "orders", "--triggers", str(triggers), "--outcome", "error",
                    "--identity", "small-1", env=env)
    assert done.returncode == 0, done.stderr
    assert "onceflow: resubmit orders small-1 (order/0@0)" in done.stdout
    routed = [orjson.loads(r.value) for r in records(broker.bootstrap, names.route)]
    assert [m["k"] for m in routed] == ["forget", "doc"]
    assert routed[1]["d"]["identity"] == "small-1"
