"""No record is skipped when partitions change owner before their first offset commit.

Workers join a group while records arrive on partitions that have no committed offset yet:
first two workers start together on a topic that holds a backlog, then a worker joins
each time a topic starts receiving records.  The group rebalances while workers recover
and while they fetch; a fetch that comes back while a worker's flow is stopped is dropped,
and its records were skipped by the partition's next owner when the partition had no
committed offset (issue 28 §1: never run, no journal record).  Every record sent must be
run exactly once: its first terminal journal record is `processed`, any other `duplicate`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names
from onceflow.app.kafka import Producer
from onceflow.journal import TERMINAL

from .support import journal, trigger_file

pytestmark = pytest.mark.integration

PARTITIONS = 4
TOPICS = ("t0", "t1", "t2")  # one more worker joins as each starts receiving records
BACKLOG = 200  # records on t0 before the first workers start
RATE = 200  # records a second on each topic being fed
TRIGGERS = (f'[[trigger]]\nname = "any"\ntypes = {list(TOPICS)!r}\ncondition = "any"\n'
            'service = "scripted"\n')


def feed(bootstrap: str, names: Names, topic: str, stop: threading.Event,
         sent: list[tuple[str, int, int]], count: int | None = None) -> None:
    """Send records round robin over the partitions of `topic` until `stop` or `count`."""
    async def run() -> None:
        async with Producer(bootstrap) as producer:
            n = 0
            while not stop.is_set() and (count is None or n < count):
                futures = []
                for _ in range(RATE // 10):
                    envelope = {"uuid": f"{topic}-{len(sent) + len(futures)}-{n}", "body": {}}
                    futures.append(await producer.send(
                        names.topic(topic), orjson.dumps(envelope), key=str(n).encode(),
                        partition=n % PARTITIONS))
                    n += 1
                for future in futures:
                    metadata = await future
                    sent.append((topic, metadata.partition, metadata.offset))
                if count is None:
                    await asyncio.sleep(0.1)

    asyncio.run(run())


def test_records_of_partitions_without_a_commit_survive_rebalances(
        broker: Any, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = trigger_file(tmp_path, TRIGGERS)
    prefix = new_prefix()
    names = Names(prefix)
    stop = threading.Event()
    sent: dict[str, list[tuple[str, int, int]]] = {topic: [] for topic in TOPICS}
    feeders = []

    def start_feeding(topic: str) -> None:
        feeder = threading.Thread(target=feed, args=(broker.bootstrap, names, topic, stop,
                                                     sent[topic]))
        feeder.start()
        feeders.append(feeder)

    workers = []
    try:
        workers.append(start_worker(triggers, prefix, name="w1", wait=False))
        time.sleep(1.0)  # the worker creates the topics
        feed(broker.bootstrap, names, "t0", stop, sent["t0"], count=BACKLOG)
        start_feeding("t0")
        workers.append(start_worker(triggers, prefix, name="w2", wait=False))
        for worker in workers:
            worker.wait_ready()
        for n, topic in enumerate(TOPICS[1:], start=3):
            start_feeding(topic)
            workers.append(start_worker(triggers, prefix, name=f"w{n}"))
            time.sleep(1.0)
    finally:
        stop.set()
        for feeder in feeders:
            feeder.join()
    expected = {record for records in sent.values() for record in records}
    deadline = time.monotonic() + 60
    while True:
        terminal: dict[tuple[str, int, int], list[str]] = {}
        for line in journal(broker.bootstrap, names):
            if line["outcome"] in TERMINAL:
                terminal.setdefault((line["topic"], line["partition"], line["offset"]),
                                    []).append(line["outcome"])
        missing = expected - terminal.keys()
        if not missing or time.monotonic() > deadline:
            break
        assert all(worker.alive for worker in workers), "a worker died"
        time.sleep(0.5)
    assert not missing, (f"{len(missing)} of {len(expected)} records never journaled, "
                         f"e.g. {sorted(missing)[:10]}")
    # A record read again after a rebalance (its offset not committed by its owner before
    # the group moved it) is a Duplicate of its own run: the service ran once for each.
    ran = {coords: outcomes for coords, outcomes in terminal.items()
           if outcomes[0] != "processed" or set(outcomes[1:]) - {"duplicate"}}
    assert not ran, f"records not run exactly once: {ran}"
