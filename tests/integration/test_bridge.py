"""The cluster bridge: 20,000 records forwarded from one cluster to another by `onceflow
bridge`, the bridge killed with SIGKILL again and again, a onceflow worker reading the
target.  Records the restarted bridge sends again are dropped by the worker's dup-id cache
(journal `duplicate-id`); no service runs twice and nothing is lost.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from onceflow.agents import record_batches
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.kafka import Producer, TopicFollower, read_topic

from .secure import Front
from .support import outcomes, wait_journal

pytestmark = pytest.mark.integration

CRASH = Path(__file__).parent / "crash"
RECORDS = 20_000
OWN_DUP_IDS = 100  # records that carry a dup-id of their own: the bridge keeps it
KILLS = 4
KILL_AFTER = 2_500  # the bridge in place is killed each time it has committed this many more
BASE_MS = int(time.time() * 1000) - 3_600_000  # record timestamps: an hour ago, 1 ms apart


class BridgeProcess:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args = args
        self.env = env
        self.log_path = log
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> BridgeProcess:
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "onceflow.app.cli", "bridge", *self.args],
            env={**os.environ, **self.env}, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)
        return self

    async def pause(self, target: TopicFollower, committed: Committed) -> int:
        """Stop the bridge (SIGSTOP), let the follower catch up with what it sent, and
        return how many records its group has committed on the source.

        The follower's "caught up" compares with the end offset of its own last fetch,
        which lags on a loaded machine: it must also hold at least the committed records
        (they are all on the target) and have stopped counting up.
        """
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)
        progress = sum(await committed.offsets())
        deadline = time.monotonic() + 30
        seen = -1
        while True:
            await asyncio.sleep(0.05)  # what it sent before it stopped reaches the target
            await target.caught_up()
            count = len(target.records)
            if count >= progress and count == seen:
                return progress
            assert time.monotonic() < deadline, f"the follower holds {count} of {progress}"
            seen = count

    def go_on(self) -> None:
        """Let a paused bridge go on (SIGCONT)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    async def uncommitted(self, target: TopicFollower, committed: Committed
                          ) -> set[bytes] | None:
        """For a paused bridge: the dup-ids of the source records on the target past its
        group's committed offsets; when there are none, let it go on and return None,
        unless the target holds every source record already (no moment to catch is left:
        it stays stopped, and the list is empty).

        (The records that carry a dup-id of their own are left out: their source offset is
        not in it.)
        """
        offsets = await committed.offsets()
        behind = set()
        forwarded = set()
        for record in target.records:
            dup_id = dict(record.headers)["dup-id"]
            forwarded.add(dup_id)
            if dup_id.startswith(b"bridge:"):
                partition, offset = dup_id.rsplit(b"/", 1)[1].split(b"@")
                if int(offset) >= offsets[int(partition)]:
                    behind.add(dup_id)
        if not behind and len(forwarded) < RECORDS:
            self.go_on()
            await asyncio.sleep(0.01 * (1 + len(target.records) % 3))
            return None
        return behind

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._close()

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        self._close()
        return self.process.returncode

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Committed:
    """The offsets a consumer group has committed on a 4-partition topic (without joining
    the group)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                         enable_auto_commit=False)
        self.topic = topic

    async def start(self) -> Committed:
        await self.consumer.start()
        return self

    async def offsets(self) -> list[int]:
        """The committed offset of each partition (0 where none)."""
        return [await self.consumer.committed(TopicPartition(self.topic, p)) or 0
                for p in range(4)]

    async def stop(self) -> None:
        await self.consumer.stop()


def banners(log: Path) -> int:
    """How many bridges have printed the line they print once they are up."""
    return sum(1 for line in log.read_text(errors="replace").splitlines()
               if line.startswith("onceflow: bridge ") and " (group " in line)


def wait_banners(log: Path, count: int, timeout: float = 60.0) -> None:
    """Wait until `count` bridges have printed the line they print once they are up."""
    deadline = time.monotonic() + timeout
    while banners(log) < count:
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
        time.sleep(0.1)


async def create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 4, 1)])
    finally:
        await admin.close()


async def fill_source(bootstrap: str, topic: str) -> None:
    await create_topic(bootstrap, topic)
    async with Producer(bootstrap) as producer:
        pending = []
        for i in range(RECORDS):
            headers = [("origin", f"src-{i}".encode())]
            if i < OWN_DUP_IDS:
                headers.append(("dup-id", f"own-{i}".encode()))
            pending.append(await producer.send(
                topic, orjson.dumps({"type": "order", "uuid": f"d-{i}", "body": {"n": i}}),
                key=f"d-{i}".encode(), headers=headers, timestamp_ms=BASE_MS + i))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)


def test_a_bridge_killed_again_and_again_forwards_everything_once(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    prefix = new_prefix()
    names = Names(prefix)
    target_topic = names.topic("order")
    # The bridge reaches the source cluster through a relay in this process (the source
    # broker names the relay's port in its metadata), so its fetches and commits move only
    # while this process runs: a bridge cannot forward and commit every record while the
    # test, starved on a loaded machine, is not looking.  (In a full suite run at load 10,
    # all four kills found every record forwarded and committed, and none to send again.)
    relay_port = free_port()
    source = EmbeddedBroker(log_path=tmp_path / "source-tansu.log",
                            advertised_port=relay_port).start()
    relay = Front(source.port, relay_port, None, None).start()
    try:
        source_topic = "shop.orders"
        asyncio.run(fill_source(source.bootstrap, source_topic))
        # The bridge starts while the worker does (it only needs the target topic).
        asyncio.run(create_topic(broker.bootstrap, target_topic))
        args = ["--from", source_topic, "--to", target_topic, "--from-broker", f"kafka://127.0.0.1:{relay_port}",
                "--batch-size", "500"]
        # Info: the log shows each bridge's group joins and assignments, should one stall.
        # The bridge is killed again and again: a 1 s session lets the group drop each dead
        # bridge in a second instead of the default ten (each kill would wait that long
        # before the next bridge gets the partitions); what is checked is what was
        # forwarded, not how fast.
        env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_SESSION_TIMEOUT": "1",
               "ONCEFLOW_HEARTBEAT_INTERVAL": "0.2", "ONCEFLOW_LOG_LEVEL": "info"}
        ledger = tmp_path / "ledger.sqlite"
        worker = start_worker(CRASH / "bridged.toml", prefix, test_ledger=ledger,
                              wait=False)
        kills = 0
        left_over: set[bytes] = set()  # dup-ids forwarded and not committed at a kill
        bridge = BridgeProcess(args, env, tmp_path / "bridge.log")

        async def run() -> tuple[list[Any], list[dict[str, Any]]]:
            nonlocal bridge, kills, left_over
            target = await TopicFollower(broker.bootstrap, target_topic).start()
            journal = await TopicFollower(broker.bootstrap, names.journal).start()
            committed = await Committed(source.bootstrap,
                                        f"onceflow-bridge.{source_topic}.{target_topic}",
                                        source_topic).start()
            bridge.start()
            try:
                deadline = time.monotonic() + 240
                while kills < KILLS:
                    assert time.monotonic() < deadline, (
                        f"the bridge stopped forwarding: {len(target.records)} records on "
                        f"the target after {kills} kill(s); the bridge's log ends:\n"
                        + (tmp_path / "bridge.log").read_text(errors="replace")[-6000:])
                    await target.wait(0.05)
                    # Only a bridge that is up is killed: the follower of the target can
                    # lag, and catching up on what the killed bridge forwarded once made
                    # the count jump past the mark before the next bridge had started.
                    # The marks are fixed (every KILL_AFTER records committed): a mark
                    # counted from the last kill's count could lie past the last record
                    # when the follower lagged, and the last kill never came.
                    if banners(tmp_path / "bridge.log") <= kills:
                        continue
                    # The bridge moves on in slices, stopped at each check, and its
                    # progress is what its group has committed on the source (records it
                    # committed are on the target): the count of a follower of the target
                    # lags on a loaded machine (its "caught up" compares with the end
                    # offset of its last fetch), and twice it saw the first mark only when
                    # the bridge had forwarded and committed every record, so that no kill
                    # found one to send again.
                    if await bridge.pause(target, committed) < (kills + 1) * KILL_AFTER:
                        bridge.go_on()
                    else:
                        # Killed while it holds forwarded records it has not committed:
                        # stopped (SIGSTOP), it is killed when the target holds source
                        # records past the group's committed offsets, else let go on and
                        # caught again later.  A kill at any other moment leaves nothing
                        # to send again: kills that came as they fell once left no record
                        # to send again in a whole run.  (On a loaded machine a bridge
                        # once forwarded all that was left before it was caught: it is
                        # killed then all the same.)
                        uncommitted = await bridge.uncommitted(target, committed)
                        if uncommitted is not None:
                            bridge.kill()
                            kills += 1
                            left_over |= uncommitted
                            bridge = BridgeProcess(args, env, tmp_path / "bridge.log").start()
                while True:
                    processed = {line["identity"] for line in (
                        orjson.loads(r.value) for r in journal.records)
                        if line["outcome"] == "processed"}
                    if len(processed) >= RECORDS:
                        break
                    assert time.monotonic() < deadline, \
                        f"{len(processed)} documents processed; see {worker.log_path}"
                    assert worker.alive, worker.log_path.read_text()[-3000:]
                    await journal.wait(1.0)
                await target.caught_up()
                await journal.caught_up()
                return list(target.records), [orjson.loads(r.value) for r in journal.records]
            finally:
                await target.stop()
                await journal.stop()
                await committed.stop()

        forwarded, lines = asyncio.run(run())
        # The last bridge may have nothing left to forward: it is stopped once it is up (a
        # SIGTERM while the interpreter still starts ends it before it can stop cleanly).
        wait_banners(tmp_path / "bridge.log", KILLS + 1)
        assert bridge.stop() == 0, (tmp_path / "bridge.log").read_text()[-2000:]
        sources = asyncio.run(read_topic(source.bootstrap, source_topic))
    finally:
        relay.stop()
        source.stop()

    assert kills == KILLS
    # Nothing lost, no service ran twice.
    db = sqlite3.connect(ledger)
    assert db.execute("SELECT key FROM doubles").fetchall() == []
    ran = {key for (key,) in db.execute("SELECT key FROM runs")}
    assert ran == {f"orders:d-{i}" for i in range(RECORDS)}
    # Every forwarded record is its source record, with a dup-id from its coordinates
    # (or its own); the restarted bridges sent some again.
    by_dup_id = {}
    for record in sources:
        headers = dict(record.headers)
        dup_id = headers.get("dup-id", f"bridge:{source_topic}/{record.partition}@"
                                       f"{record.offset}".encode())
        by_dup_id[dup_id] = record
    copies = Counter(dict(r.headers)["dup-id"] for r in forwarded)
    assert set(copies) == set(by_dup_id)
    resent = sum(copies.values()) - RECORDS
    # Each kill came while the target held records past the committed offsets: a later
    # bridge sent each of them again (and more, when sends were still on their way).
    assert left_over and all(copies[dup_id] >= 2 for dup_id in left_over)
    for record in forwarded:
        original = by_dup_id[dict(record.headers)["dup-id"]]
        assert (record.key, record.value, record.timestamp) == (
            original.key, original.value, original.timestamp)
        assert dict(record.headers)["origin"] == dict(original.headers)["origin"]
        assert record.partition == original.partition % 4
    assert sum(1 for r in forwarded if dict(r.headers)["dup-id"].startswith(b"own-")) >= \
        OWN_DUP_IDS
    # The worker dropped every resend at ingress, as duplicate-id.
    outcomes = Counter(line["outcome"] for line in lines)
    assert outcomes["processed"] == RECORDS
    assert outcomes["duplicate-id"] == resent
    assert outcomes["duplicate"] == 0


def test_a_bridge_forwards_odd_records_as_they_are_and_refuses_a_missing_topic(
        broker: EmbeddedBroker, new_prefix: Any, tmp_path: Path) -> None:
    prefix = new_prefix()
    source_topic, target_topic = prefix + "in", prefix + "out"
    asyncio.run(create_topic(broker.bootstrap, source_topic))
    asyncio.run(create_topic(broker.bootstrap, target_topic))
    odd: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
        (None, b"no key", []),
        (b"tombstone", None, []),
        (b"binary", b"\xff\xfe\x00", [("x-bin", b"\xff\x00\xfe"), ("dup-id", b"\xc3\x28")]),
        (b"empty", b"", [("dup-id", b"")]),
    ]

    async def send() -> None:
        async with Producer(broker.bootstrap) as producer:
            for key, value, headers in odd:
                await producer.send_and_wait(source_topic, value, key=key, headers=headers,
                                             partition=1)

    asyncio.run(send())
    env = {"ONCEFLOW_BROKER_URL": broker.url}
    bridge = BridgeProcess(["--from", source_topic, "--to", target_topic], env,
                           tmp_path / "bridge.log").start()
    deadline = time.monotonic() + 60
    forwarded: list[Any] = []
    while len(forwarded) < len(odd) and time.monotonic() < deadline:
        time.sleep(0.3)
        forwarded = asyncio.run(read_topic(broker.bootstrap, target_topic))
    assert bridge.stop() == 0, (tmp_path / "bridge.log").read_text()[-2000:]
    assert [(r.key, r.value, r.partition) for r in forwarded] == [
        (key, value, 1) for key, value, _ in odd]
    assert dict(forwarded[0].headers)["dup-id"] == f"bridge:{source_topic}/1@0".encode()
    assert dict(forwarded[1].headers)["dup-id"] == f"bridge:{source_topic}/1@1".encode()
    assert list(forwarded[2].headers) == [("x-bin", b"\xff\x00\xfe"), ("dup-id", b"\xc3\x28")]
    assert list(forwarded[3].headers) == [("dup-id", b"")]

    missing = subprocess.run(
        [sys.executable, "-m", "onceflow.app.cli", "bridge", "--from", source_topic, "--to",
         prefix + "nowhere"], env={**os.environ, **env}, capture_output=True, text=True,
        timeout=60)
    assert missing.returncode == 2
    assert "Traceback" not in missing.stderr
    assert f"--to topic '{prefix}nowhere' does not exist" in missing.stderr.splitlines()[-1]


def test_a_record_whose_header_name_is_not_utf8_does_not_stop_the_bridge(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    prefix = new_prefix()
    names = Names(prefix)
    triggers = tmp_path / "triggers.toml"
    triggers.write_text('[[trigger]]\nname = "orders"\ntypes = ["order"]\nservice = "scripted"\n')
    worker = start_worker(triggers, prefix, partitions=2)
    source_topic = prefix + "shop.orders"
    asyncio.run(create_topic(broker.bootstrap, source_topic))
    doc = lambda uuid: orjson.dumps({"uuid": uuid})  # noqa: E731

    async def send() -> None:
        async with Producer(broker.bootstrap) as producer:
            await producer.send_and_wait(source_topic, doc("good-1"), key=b"k", partition=0)
            # The name's bytes \xff\xfe are not UTF-8 (a plain producer cannot send it).
            batch = record_batches.raw_name_batch(
                producer, b"k", doc("bad-name"), None,
                [("trace", b"t"), (b"\xff\xfe".decode("utf-8", "surrogateescape"), b"\x01")])
            await (await producer.send_batch(batch, source_topic, partition=0))
            await producer.send_and_wait(source_topic, doc("good-2"), key=b"k", partition=0)

    asyncio.run(send())
    env = {"ONCEFLOW_BROKER_URL": broker.url}
    bridge = BridgeProcess(["--from", source_topic, "--to", names.topic("order")], env,
                           tmp_path / "bridge.log").start()
    lines = wait_journal(broker.bootstrap, names, lambda ls: all(
        outcomes(ls, uuid) for uuid in ("good-1", "bad-name", "good-2")), worker)
    assert bridge.process is not None and bridge.process.poll() is None, \
        (tmp_path / "bridge.log").read_text()[-2000:]
    assert outcomes(lines, "good-1") == outcomes(lines, "good-2") == ["processed"]
    (bad,) = [line for line in lines if line["identity"] == "bad-name"]
    assert bad["outcome"] == "bad-input"
    assert "a header name is not UTF-8 (b'\\xff\\xfe')" in bad["reason"]
    # Forwarded in order, the name's bytes kept; its dead-letter copy holds them.
    record_batches.install()  # this process reads the forwarded record too
    forwarded = asyncio.run(read_topic(broker.bootstrap, names.topic("order")))
    assert [orjson.loads(r.value)["uuid"] for r in forwarded] == ["good-1", "bad-name", "good-2"]
    letter = next(orjson.loads(r.value) for r in asyncio.run(
        read_topic(broker.bootstrap, names.dead_letter)))
    assert letter["headers_base64"] == [{"name": base64.b64encode(b"\xff\xfe").decode(),
                                         "value": base64.b64encode(b"\x01").decode()}]
    assert bridge.stop() == 0, (tmp_path / "bridge.log").read_text()[-2000:]
    assert "Traceback" not in (tmp_path / "bridge.log").read_text()
    assert worker.alive
