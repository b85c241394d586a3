"""Helpers of the integration tests: publish records, read topics, wait for the journal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiokafka.admin import AIOKafkaAdminClient
from onceflow.agents.wire import Names
from onceflow.app.kafka import Producer, read_topic
from onceflow.app.process import WorkerProcess
from onceflow.app.security import Cluster


def orders_and_pairs(join_timeout: str | None = "10m") -> str:
    """A trigger file: a simple trigger on "order" documents and an All join of "left" and
    "right" (with the default join timeout of a day when `join_timeout` is None)."""
    timeout = "" if join_timeout is None else f'join_timeout = "{join_timeout}"\n'
    return ('[[trigger]]\nname = "orders"\ntypes = ["order"]\nservice = "scripted"\n\n'
            '[[trigger]]\nname = "pairs"\ntypes = ["left", "right"]\nservice = "scripted"\n'
            'condition = "all"\n'
            + timeout)


ORDERS_AND_PAIRS = orders_and_pairs()
# The smallest trigger file: one simple trigger on "order" documents.
ORDERS_ONLY = """
[[trigger]]
name = "orders"
types = ["order"]
service = "scripted"
"""


def trigger_file(folder: Path, text: str = ORDERS_AND_PAIRS) -> Path:
    """A triggers.toml in `folder` holding `text`."""
    path = folder / "triggers.toml"
    path.write_text(text)
    return path


# (topic, value, key, headers, partition)
Outgoing = tuple[str, bytes | None, str, dict[str, str], int | None]


def publish(bootstrap: Cluster | str, names: Names, records: list[Outgoing]
            ) -> dict[tuple[str, int, int], str]:
    """Send records in order; {(logical topic, partition, offset): key}."""
    sent: dict[tuple[str, int, int], str] = {}

    async def run() -> None:
        async with Producer(bootstrap) as producer:
            for topic, value, key, headers, partition in records:
                metadata = await producer.send_and_wait(
                    names.topic(topic), value, key=key.encode(), partition=partition,
                    headers=[(k, v.encode()) for k, v in headers.items()])
                sent[(topic, metadata.partition, metadata.offset)] = key

    asyncio.run(run())
    return sent


def records(bootstrap: Cluster | str, topic: str) -> list[Any]:
    """Every record of a topic (real name)."""
    return asyncio.run(read_topic(bootstrap, topic))


def journal(bootstrap: Cluster | str, names: Names) -> list[dict[str, Any]]:
    """Every journal record so far."""
    return [orjson.loads(r.value) for r in records(bootstrap, names.journal)]


def wait_journal(bootstrap: Cluster | str, names: Names,
                 done: Callable[[list[dict[str, Any]]], bool],
                 worker: WorkerProcess, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Read the journal until `done` says so; fail early when the worker has died."""
    deadline = time.monotonic() + timeout
    while True:
        lines = journal(bootstrap, names)
        if done(lines):
            return lines
        if not worker.alive:
            raise AssertionError(f"the worker died; see {worker.log_path}: "
                                 f"{worker.log_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the journal never got there: {lines[-10:]}")
        time.sleep(0.3)


def outcomes(lines: list[dict[str, Any]], identity: str,
             trigger: str | None = None) -> list[str]:
    """The outcomes of one identity (of one trigger), in journal order."""
    return [line["outcome"] for line in lines if line["identity"] == identity
            and (trigger is None or line["trigger"] == trigger)]


def partition_count(bootstrap: str, topic: str) -> int:
    """How many partitions a topic has (0: it does not exist)."""
    async def run() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([topic])
        finally:
            await admin.close()
        return len(described.get("partitions") or ())

    return asyncio.run(run())
