"""Crash safety: two workers, 20,000 records, one worker killed with SIGKILL again and again.

The services write every document they run for into a SQLite ledger with a unique key;
the resolver consults that ledger.  At the end no document ran twice, every record sent
has a terminal journal record for its trigger, and every document ran once (nothing was
lost).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer, TopicFollower
from onceflow.journal import TERMINAL

pytestmark = pytest.mark.integration

CRASH = Path(__file__).parent / "crash"
ORDERS = 14_000
PAIRS = 2_000
RESENDS = 2_000  # 10% of the 20,000 records
RATE = 1_000  # records per second
KILLS = (4.0, 9.0, 14.0)  # seconds into the feed


Item = tuple[str, dict[str, Any], str]


def documents(seed: int = 7) -> list[Item]:
    """(topic, envelope, trigger) of every record, resends included, in send order.

    The other half of each pair, and each resend, follows its original within half a
    second of sending: well inside join_timeout, and often inside the same batch.
    """
    rng = random.Random(seed)
    firsts: list[Item] = [("order", {"uuid": f"o-{i}", "body": {"n": i}}, "orders")
                          for i in range(ORDERS)]
    firsts += [("left", {"uuid": f"l-{j}", "activation": f"a-{j}", "body": {}}, "pairs")
               for j in range(PAIRS)]
    rng.shuffle(firsts)
    uuids = [f"o-{i}" for i in range(ORDERS)] + [f"{side}-{j}" for j in range(PAIRS)
                                                  for side in "lr"]
    resent = set(rng.sample(uuids, RESENDS))
    due: list[tuple[int, int, Item, bool]] = []
    tie = itertools.count()
    out: list[Item] = []

    def put(item: Item, original: bool) -> None:
        out.append(item)
        if not original:
            return
        topic, envelope, _ = item
        if envelope["uuid"] in resent:
            heapq.heappush(due, (len(out) + rng.randrange(RATE // 2), next(tie), item, False))
        if topic == "left":
            j = envelope["uuid"][2:]
            right = ("right", {"uuid": f"r-{j}", "activation": f"a-{j}", "body": {}}, "pairs")
            heapq.heappush(due, (len(out) + rng.randrange(RATE // 2), next(tie), right, True))

    for item in firsts:
        while due and due[0][0] <= len(out):
            _, _, queued, original = heapq.heappop(due)
            put(queued, original)
        put(item, True)
    while due:
        _, _, queued, original = heapq.heappop(due)
        put(queued, original)
    return out


async def feed(bootstrap: str, names: Names, records: list[Item],
               sent: list[tuple[str, int, int, str]], on_time: Any) -> None:
    """Send at RATE records a second; call on_time(seconds since start) between chunks."""
    started = time.monotonic()
    chunk = RATE // 10
    async with Producer(bootstrap) as producer:
        for first in range(0, len(records), chunk):
            futures = []
            for topic, envelope, trigger in records[first:first + chunk]:
                futures.append((topic, trigger, await producer.send(
                    names.topic(topic), orjson.dumps(envelope),
                    key=envelope["uuid"].encode())))
            for topic, trigger, future in futures:
                metadata = await future
                sent.append((topic, metadata.partition, metadata.offset, trigger))
            await on_time(time.monotonic() - started)
            pause = started + (first + chunk) / RATE - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)


def missing_terminals(sent: list[tuple[str, int, int, str]],
                      journal: list[dict[str, Any]]) -> list[tuple[str, int, int, str]]:
    done = {(line["topic"], line["partition"], line["offset"], line["trigger"])
            for line in journal if line["outcome"] in TERMINAL}
    return [record for record in sent if record not in done]


def test_no_document_runs_twice_or_is_lost_across_kills(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    prefix = new_prefix()
    names = Names(prefix)
    ledger = tmp_path / "ledger.sqlite"
    settings = {"test_ledger": ledger, "idle_after": 1}
    triggers = CRASH / "triggers.toml"
    victim = start_worker(triggers, prefix, name="w1", **settings)
    start_worker(triggers, prefix, name="w2", **settings)
    records = documents()
    sent: list[tuple[str, int, int, str]] = []
    kills: list[float] = []

    async def run() -> list[dict[str, Any]]:
        nonlocal victim

        async def on_time(elapsed: float) -> None:
            nonlocal victim
            if len(kills) < len(KILLS) and elapsed >= KILLS[len(kills)]:
                victim.kill()
                kills.append(elapsed)
                victim = start_worker(triggers, prefix, name="w1", wait=False, **settings)

        journal = await TopicFollower(broker.bootstrap, names.journal).start()
        try:
            await feed(broker.bootstrap, names, records, sent, on_time)
            # The restarted worker recovers its tables and takes partitions back.
            await asyncio.to_thread(victim.wait_ready)
            deadline = time.monotonic() + 180
            lines: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                lines = [orjson.loads(r.value) for r in journal.records]
                if not missing_terminals(sent, lines):
                    break
                await journal.wait(2.0)
            return lines
        finally:
            await journal.stop()

    lines = asyncio.run(run())
    assert len(kills) == len(KILLS), kills
    assert len(sent) == ORDERS + 2 * PAIRS + RESENDS == 20_000

    db = sqlite3.connect(ledger)
    doubles = db.execute("SELECT key, pid FROM doubles").fetchall()
    assert doubles == [], f"documents that ran twice: {doubles[:20]}"
    missing = missing_terminals(sent, lines)
    assert not missing, f"{len(missing)} records without a terminal journal record: " \
                        f"{missing[:10]}"
    ran = {key for (key,) in db.execute("SELECT key FROM runs")}
    expected = {f"orders:o-{i}" for i in range(ORDERS)}
    expected |= {f"pairs:{side}-{j}" for j in range(PAIRS) for side in "lr"}
    assert not expected - ran, f"documents that never ran: {sorted(expected - ran)[:20]}"
    assert ran == expected
