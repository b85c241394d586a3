"""Crash safety: two workers, 20,000 records, one worker killed with SIGKILL again and again.

The services write every document they run for into a SQLite ledger with a unique key;
the resolver consults that ledger.  At the end no document ran twice, every record sent
has a terminal journal record for its trigger, no record's terminal journal records
contradict each other, and every document ran once (nothing was lost).

The last restart is with a wiped data directory (its tables rebuilt from the changelogs).
The test prints how long processing stalled and how long each restart took; it asserts no
timing, only what /ready says while it says it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names, route_partition
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer, TopicFollower
from onceflow.app.process import WorkerProcess, http_json
from onceflow.errors import OnceflowError
from onceflow.journal import DUPLICATE, TERMINAL

pytestmark = pytest.mark.integration

CRASH = Path(__file__).parent / "crash"
ORDERS = 14_000
PAIRS = 2_000
RESENDS = 2_000  # 10% of the 20,000 records
RATE = 1_000  # records per second
KILLS = (3.0, 9.0, 15.0)  # seconds into the feed
# A kill waits for the previous restart's first service, up to this long after that
# restart, so that each restart is measured (a restart killed before it ran cannot be).
RESTART_WAIT = 15.0
WIPED = 2  # the restart after this kill (0-based) starts with an empty data directory
PARTITIONS = 4


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


def contradictions(journal: list[dict[str, Any]]) -> list[tuple[Any, list[str]]]:
    """Records whose terminal journal records disagree.

    A record delivered again after a crash is decided again; its later terminal records
    may only say `duplicate` (it ran, or was settled, before), or repeat the first.
    """
    terminals: dict[tuple[Any, ...], list[str]] = {}
    for line in journal:
        if line["outcome"] in TERMINAL:
            key = (line["topic"], line["partition"], line["offset"], line["trigger"])
            terminals.setdefault(key, []).append(line["outcome"])
    return [(key, found) for key, found in terminals.items()
            if any(later not in (found[0], DUPLICATE) for later in found[1:])]


def journal_of(lines: list[dict[str, Any]], key: str) -> list[tuple[Any, ...]]:
    """(identity, outcome, topic, partition, offset, ts, reason) of the journal records of a
    ledger key's document (and of its join partner)."""
    trigger, identity = key.split(":", 1)
    activation = f"a-{identity[2:]}" if trigger == "pairs" else None
    return [(line["identity"], line["outcome"], line["topic"], line["partition"],
             line["offset"], line["ts"], line.get("reason")) for line in lines
            if line["trigger"] in (trigger, None) and (
                line["identity"] == identity
                or activation is not None and line["activation"] == activation)]


def what_became_of(record: tuple[str, int, int, str], identity: str,
                   journal: list[dict[str, Any]]) -> str:
    """A record without a terminal journal record, with what the journal says of its
    identity (outcome, coordinates, reason)."""
    topic, partition, offset, trigger = record
    found = [(line["outcome"], f"{line['topic']}/{line['partition']}@{line['offset']}",
              line.get("reason")) for line in journal
             if line["trigger"] in (trigger, None) and line["identity"] == identity]
    return f"{topic}/{partition}@{offset} ({trigger}, {identity}): {found}"


class ReadyWatch(threading.Thread):
    """Polls a worker's /ready and /readyz from its start; keeps what they said when."""

    def __init__(self, worker: WorkerProcess) -> None:
        super().__init__(daemon=True)
        self.worker = worker
        self.ready_at: float | None = None  # wall clock of the first 200 of /ready
        self.answers: list[tuple[float, int, Any]] = []  # (time, status, body) of /readyz
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and (self.worker.alive or self.worker.process is None):
            try:  # a worker on a loaded machine may take seconds to answer
                status, _ = http_json(self.worker.web_url + "/ready", timeout=10.0)
                if status == 200 and self.ready_at is None:
                    self.ready_at = time.time()
                status, body = http_json(self.worker.web_url + "/readyz", timeout=10.0)
                self.answers.append((time.time(), status, body))
            except (OSError, OnceflowError) as exc:
                self.answers.append((time.time(), 0, str(exc)))
            self.stop.wait(0.1)


def run_partition(key: str) -> int:
    """The partition a ledger key's document was decided on."""
    trigger, identity = key.split(":", 1)
    routing = f"a-{identity[2:]}" if trigger == "pairs" else identity
    return route_partition(routing, PARTITIONS)


def figures(runs: list[tuple[str, int, float]], started: float, kills: list[float],
            restarts: list[tuple[WorkerProcess, ReadyWatch, bool]]) -> list[str]:
    """What to print: the longest stall, and for each kill and restart how long it took."""
    times = sorted(at for _, _, at in runs)
    out = []
    gaps = [(b - a, a) for a, b in zip([started, *times], times, strict=False)]
    longest, at = max(gaps)
    out.append(f"longest stall (no service ran anywhere): {longest:.1f} s, "
               f"from {at - started:.1f} s into the feed")
    by_partition: dict[int, list[float]] = {}
    for key, _, when in runs:
        by_partition.setdefault(run_partition(key), []).append(when)
    for number, (kill, (worker, watch, wiped)) in enumerate(zip(kills, restarts, strict=True), 1):
        resumed = []
        for when in by_partition.values():
            after = [t for t in when if t >= kill]
            resumed.append(min(after) - kill if after else float("inf"))
        pid = worker.process.pid if worker.process else -1
        first = min((at for _, p, at in runs if p == pid), default=None)
        until = kills[number] if number < len(kills) else times[-1]
        window = [t for t in times if kill <= t <= until]
        stall = max((b - a for a, b in zip([kill, *window], window, strict=False)), default=0.0)
        ready = watch.ready_at
        last = f" (last /readyz: {watch.answers[-1][1:]})" if ready is None and watch.answers \
            else ""
        out.append(
            f"kill {number} at {kill - started:.1f} s: every partition ran a service again "
            f"after {max(resumed):.1f} s (longest stall after it {stall:.1f} s); restart"
            f"{' with a wiped data dir' if wiped else ''}: /ready after "
            f"{'never' if ready is None else f'{ready - worker.started_at:.1f} s'}, first "
            f"service after {'never' if first is None else f'{first - worker.started_at:.1f} s'}"
            f"{last}")
    return out


def assert_ready_means_processing(body: Any, worker: WorkerProcess) -> None:
    """A 200 of /readyz: partitions assigned, recovered and taken; nothing pending."""
    assert body["ready"] is True and body["reasons"] == [], (body, worker.log_path)
    # Two workers and four partitions: a ready worker owns some.
    assert body["partitions"] and set(body["partitions"]) <= set(range(PARTITIONS)), body


def test_no_document_runs_twice_or_is_lost_across_kills(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    prefix = new_prefix()
    names = Names(prefix)
    ledger = tmp_path / "ledger.sqlite"
    # A worker is killed again and again, and each failover waits for the group to drop
    # the dead member: the session is 6 s (Apache Kafka's smallest by default, what an
    # operator who wants fast failover sets) with a heartbeat of a third of it, instead of
    # the default 10 s.  Every other setting is the default.
    # Info: each worker's log names the offsets of every batch it handled and what a
    # rebalance gave back, so a failure below can be followed record by record.
    settings = {"test_ledger": ledger, "session_timeout": 6, "heartbeat_interval": 2,
                "log_level": "info"}
    triggers = CRASH / "triggers.toml"
    victim = start_worker(triggers, prefix, name="w1", **settings)
    start_worker(triggers, prefix, name="w2", **settings)
    records = documents()
    sent: list[tuple[str, int, int, str]] = []
    kills: list[float] = []
    restarts: list[tuple[WorkerProcess, ReadyWatch, bool]] = []
    started = time.time()

    async def run() -> list[dict[str, Any]]:
        nonlocal victim, started

        def served(worker: WorkerProcess) -> bool:
            pid = worker.process.pid if worker.process else -1
            with sqlite3.connect(ledger, timeout=60) as db:
                return db.execute("SELECT 1 FROM runs WHERE pid = ? LIMIT 1",
                                  (pid,)).fetchone() is not None

        async def on_time(elapsed: float) -> None:
            nonlocal victim
            n = len(kills)
            if n < len(KILLS) and elapsed >= KILLS[n] and (
                    not restarts or time.time() - victim.started_at >= RESTART_WAIT
                    or await asyncio.to_thread(served, victim)):
                victim.kill()
                kills.append(time.time())
                wiped = len(restarts) == WIPED
                if wiped:
                    shutil.rmtree(tmp_path / "w1" / "data")
                victim = start_worker(triggers, prefix, name="w1", wait=False, **settings)
                watch = ReadyWatch(victim)
                watch.start()
                restarts.append((victim, watch, wiped))

        journal = await TopicFollower(broker.bootstrap, names.journal).start()
        try:
            started = time.time()
            await feed(broker.bootstrap, names, records, sent, on_time)
            while len(kills) < len(KILLS):  # the feed ended first
                await on_time(float("inf"))
                await asyncio.sleep(0.2)
            # The restarted worker recovers its tables and takes partitions back.
            await asyncio.to_thread(victim.wait_ready, 180)
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
            for _, watch, _ in restarts:
                watch.stop.set()

    lines = asyncio.run(run())
    assert len(kills) == len(KILLS), kills
    assert len(sent) == ORDERS + 2 * PAIRS + RESENDS == 20_000

    db = sqlite3.connect(ledger)
    runs = db.execute("SELECT key, pid, at FROM runs").fetchall()
    with capsys.disabled():
        print("\n" + "\n".join(f"crash test: {line}"
                                for line in figures(runs, started, kills, restarts)))
    doubles = db.execute("SELECT key, pid FROM doubles").fetchall()
    assert doubles == [], f"documents that ran twice: {doubles[:20]}"
    missing = missing_terminals(sent, lines)
    assert not missing, f"{len(missing)} records without a terminal journal record: " + \
        "; ".join(what_became_of(record, records[sent.index(record)][1]["uuid"], lines)
                  for record in missing[:10]) + f"; the workers' logs: {tmp_path}/w*/worker.log"
    ran = {key for key, _, _ in runs}
    expected = {f"orders:o-{i}" for i in range(ORDERS)}
    expected |= {f"pairs:{side}-{j}" for j in range(PAIRS) for side in "lr"}
    never = sorted(expected - ran)
    assert not never, f"{len(never)} documents that never ran: " + "; ".join(
        f"{key}: {journal_of(lines, key)}" for key in never[:8])
    assert ran == expected
    for worker, watch, _ in restarts:
        for _, status, body in watch.answers:
            if status == 200:  # 0: no answer (not listening yet, or killed)
                assert_ready_means_processing(body, worker)
    contradicting = contradictions(lines)
    assert not contradicting, (f"{len(contradicting)} records whose terminal journal records "
                               f"contradict each other: {contradicting[:10]}")
