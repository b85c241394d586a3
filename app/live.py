"""`onceflow replay --live`: a scenario through a real worker on a real broker.

The run starts a fresh embedded broker (unless given one) and a worker on topics under a
fresh prefix, loads the scenario's history seeds into the worker's tables, and sends the
records in file order, each once the previous one has its journal record.  Record
timestamps are a base time plus the scenario's `ts`; before a record moves time forward,
every partition is ticked to it, so each partition's time follows the newest `ts` as
replay's single clock does (the worker's own wall-clock ticks are off).  At the end every
partition is ticked to the last `ts` and a barrier confirms that all of them are done;
then the journal is printed in replay's format, in the scenario's terms.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from onceflow.agents import wire
from onceflow.agents.signing import RouteSigner
from onceflow.envelope import Record
from onceflow.errors import OnceflowError
from onceflow.journal import JOIN_PENDING, SUSPENDED, TERMINAL
from onceflow.scenario import SUSPEND as SUSPEND_ACTION
from onceflow.scenario import Control, Scenario, load_scenario

from .broker import EmbeddedBroker, free_port
from .feed import FeedRecord, JournalMapper, StandIns, feed, seed_message, seed_partitions
from .kafka import Producer, TopicFollower, read_topic
from .process import WorkerProcess, stopped_on_term
from .security import Cluster, as_cluster, security_from_env

ANSWERS = TERMINAL | {JOIN_PENDING, SUSPENDED}
BASE_TIME = 1_700_000_000  # seconds; record timestamps are BASE_TIME + ts


def live_env(bootstrap: str, prefix: str, partitions: int, data_dir: Path,
             extra_topics: Iterable[str] = (), *, embedded: bool = True) -> dict[str, str]:
    """Worker settings for a run driven from outside: the product's defaults, but no idle ticks.

    A scenario's time is its records' time (BASE_TIME + ts, in the past): a worker whose
    idle partitions moved to the wall clock would expire every open join that replay keeps
    open at the end of the input.  Every other setting is the worker's default (retries
    wait out their retry_interval; the group session is the default one), or what the run
    itself needs: where the broker is, the prefix, partitions, data dir and web port, the
    topics the scenario writes that no trigger reads, and plaintext on the embedded broker
    (`embedded`), which is open.
    """
    env = {
        "ONCEFLOW_BROKER_URL": f"kafka://{bootstrap}",
        "ONCEFLOW_TOPIC_PREFIX": prefix,
        "ONCEFLOW_PARTITIONS": str(partitions),
        "ONCEFLOW_DATA_DIR": str(data_dir),
        "ONCEFLOW_WEB_PORT": str(free_port()),
        "ONCEFLOW_IDLE_TICKS": "false",
        "ONCEFLOW_EXTRA_TOPICS": ",".join(sorted(set(extra_topics))),
    }
    if embedded:
        env["ONCEFLOW_SECURITY_PROTOCOL"] = "PLAINTEXT"  # the embedded broker is open
    return env


class LiveRun:
    """One scenario through one worker, driven record by record."""

    def __init__(self, scenario: Scenario, where: Cluster | str, workdir: Path, *,
                 partitions: int | None = None, record_timeout: float = 60.0,
                 embedded: bool = True) -> None:
        """`embedded`: the broker is the embedded one (see live_env)."""
        self.scenario = scenario
        self.cluster = as_cluster(where)
        bootstrap = self.bootstrap = self.cluster.bootstrap
        self.workdir = workdir
        self.prefix = f"live-{uuid.uuid4().hex[:10]}."
        self.names = wire.Names(self.prefix)
        records = [r for r in scenario.iter_records() if isinstance(r, Record)]
        self.topics = sorted({r.topic for r in records})
        self.partitions = partitions or max(2, 1 + max((r.partition for r in records),
                                                        default=0))
        self.record_timeout = record_timeout
        env = live_env(bootstrap, self.prefix, self.partitions, workdir / "data", self.topics,
                       embedded=embedded)
        # The run's own admin token: its seeds, ticks and barriers are signed as a
        # deployment's are, and the worker checks them.
        token = secrets.token_urlsafe(24)
        env["ONCEFLOW_ADMIN_TOKEN"] = token
        self.signer = RouteSigner.from_tokens(token)
        self.worker = WorkerProcess(scenario.path / "triggers.toml", env,
                                    workdir / "worker.log")
        self.mapper = JournalMapper(BASE_TIME * 1000)
        self.suspended: set[str] = set()
        self._answers: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
        self._seen = 0
        self.stand_ins = StandIns(self.signer)

    async def run(self) -> list[dict[str, Any]]:
        """Start the worker, send everything, and return the journal in scenario terms."""
        await asyncio.to_thread(self.worker.start().wait_ready)
        journal = TopicFollower(self.cluster, self.names.journal)
        acks = TopicFollower(self.cluster, self.names.acks)
        await journal.start()
        await acks.start()
        try:
            async with Producer(self.cluster) as producer:
                await self._seed(producer, acks)
                now: int | None = None
                for item in feed(self.scenario):
                    ts = item.ts if isinstance(item, Control) else item.record.ts
                    ts_ms = BASE_TIME * 1000 + ts
                    if now is None or ts > now:
                        # Documents whose routing key stays on their input partition are
                        # decided at ingress, apart from the repartition topic's stream:
                        # the barrier makes sure the tick is applied before this record.
                        now = ts
                        await self._tick(producer, ts_ms)
                        await self._barrier(producer, acks)
                    if isinstance(item, Control):
                        await self._command(producer, acks, journal, item)
                        continue
                    suspended = len(self.suspended)
                    offset = await self._send(producer, item, ts_ms)
                    await self._wait_answers(journal, item, offset)
                    if len(self.suspended) > suspended:
                        # A suspension reaches the other partitions through the
                        # repartition topic; wait until every one of them has it.
                        await self._barrier(producer, acks)
                await self._barrier(producer, acks)
        finally:
            await journal.stop()
            await acks.stop()
        lines = [orjson.loads(r.value) for r in
                 await read_topic(self.cluster, self.names.journal)]
        return [self.mapper.map(line) for line in lines]

    def stop(self) -> None:
        """Stop the worker."""
        self.worker.stop()

    async def _seed(self, producer: Any, acks: TopicFollower) -> None:
        if not self.scenario.history:
            return
        for seed in self.scenario.history:
            for partition in seed_partitions(self.scenario.triggers, seed, self.partitions):
                await self._route(producer, partition, b"seed", wire.control_message(
                    wire.SEED, **seed_message(seed, BASE_TIME)))
        await self._barrier(producer, acks)

    async def _command(self, producer: Any, acks: TopicFollower, journal: TopicFollower,
                       control: Control) -> None:
        """The operator's suspend or resume, sent as `onceflow suspend|resume` sends it.

        Every partition gets the signed command (partition 0 journals it); the barrier
        waits until each has applied it and decided again what it held.  A document
        decided again may suspend its trigger again: a second barrier makes sure every
        partition has that suspension before the next record.
        """
        kind = wire.SUSPEND if control.action == SUSPEND_ACTION else wire.RESUME
        reason = "suspended by command" if kind == wire.SUSPEND else "resumed by command"
        for partition in range(self.partitions):
            await self._route(producer, partition, control.trigger.encode(),
                              wire.control_message(kind, trigger=control.trigger,
                                                   reason=reason, journal=partition == 0))
        await self._barrier(producer, acks)
        if kind == wire.SUSPEND:
            self.suspended.add(control.trigger)
        else:
            self.suspended.discard(control.trigger)
            await self._barrier(producer, acks)
            self._index(journal)

    async def _tick(self, producer: Any, ts_ms: int) -> None:
        for partition in range(self.partitions):
            await self._route(producer, partition, b"tick",
                              wire.control_message(wire.TICK, ts=ts_ms / 1000))

    async def _route(self, producer: Any, partition: int, key: bytes, value: bytes) -> None:
        """Send a signed control message to one partition of the route topic."""
        topic = self.names.route
        await producer.send(topic, value, key=key, partition=partition,
                            headers=self.signer.headers(topic, partition, value))

    async def _send(self, producer: Any, item: FeedRecord, ts_ms: int) -> int:
        record = item.record
        topic = self.names.topic(record.topic)
        headers = [(k, v.encode()) for k, v in self.stand_ins.headers(item, topic).items()]
        metadata = await producer.send_and_wait(
            topic, item.value, key=item.key,
            partition=record.partition, timestamp_ms=ts_ms, headers=headers)
        self.mapper.sent(record, record.topic, record.partition, metadata.offset)
        self.stand_ins.sent(item, int(metadata.offset))
        return int(metadata.offset)

    async def _wait_answers(self, journal: TopicFollower, item: FeedRecord,
                            offset: int) -> None:
        record = item.record
        where = (record.topic, record.partition, offset)
        deadline = time.monotonic() + self.record_timeout
        while True:
            self._index(journal)
            answers = self._answers.get(where, [])
            if not item.answered_by:
                if any(a.get("trigger") is None for a in answers):
                    return
            else:
                pending = [name for name in item.answered_by if name not in self.suspended
                           and not any(a.get("trigger") == name and a["outcome"] in ANSWERS
                                       for a in answers)]
                if not pending:
                    return
            await self._wait_until(journal, deadline, (
                f"no journal record for input line {item.index + 1} ({record.topic}/"
                f"{record.partition}@{record.offset}) after {self.record_timeout} s"))

    async def _wait_until(self, follower: TopicFollower, deadline: float,
                          failure: str) -> None:
        """Wait a little for new records, or fail (naming the worker's log) past deadline.

        The wait ends at the deadline, never after it: a run that allows a record 1 ms
        gets 1 ms.
        """
        left = deadline - time.monotonic()
        if left <= 0:
            raise OnceflowError(f"{failure}; see {self.worker.log_path}")
        await follower.wait(min(0.2, left))

    def _index(self, journal: TopicFollower) -> None:
        records = journal.records
        while self._seen < len(records):
            line = orjson.loads(records[self._seen].value)
            self._seen += 1
            if line["outcome"] == SUSPENDED and line.get("trigger") and \
                    line.get("identity") is not None:  # a run suspended its trigger
                self.suspended.add(line["trigger"])
            key = (line.get("topic"), line.get("partition"), line.get("offset"))
            self._answers.setdefault(key, []).append(line)  # type: ignore[arg-type]

    async def _barrier(self, producer: Any, acks: TopicFollower) -> None:
        """Wait until every partition has made everything before this point durable."""
        barrier = uuid.uuid4().hex
        for partition in range(self.partitions):
            await self._route(producer, partition, b"barrier",
                              wire.control_message(wire.BARRIER, id=barrier))
        await producer.flush()
        deadline = time.monotonic() + self.record_timeout
        while True:
            done = {orjson.loads(r.value)["partition"] for r in acks.records
                    if r.key == barrier.encode()}
            if len(done) == self.partitions:
                return
            await self._wait_until(acks, deadline, f"the worker did not reach a barrier "
                                   f"in {self.record_timeout} s")


def run_live(path: str, *, bootstrap: str | None = None,
             keep: bool = False) -> list[dict[str, Any]]:
    """Run a scenario live; with no `bootstrap`, on a fresh embedded broker.

    The run's files (worker and broker logs, data) are removed after a run that
    succeeds, and kept (and named on stderr) after one that fails or with `keep`.
    """
    scenario = load_scenario(path)
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-live-"))
    broker = None
    where: Cluster | str
    if bootstrap is None:
        broker = EmbeddedBroker(log_path=workdir / "broker.log").start()
        where = broker.bootstrap
    else:  # the worker, a child process, reads the same ONCEFLOW_* security settings
        where = Cluster(bootstrap, security_from_env())
    run = LiveRun(scenario, where, workdir, embedded=broker is not None)
    failed = True
    try:
        lines = asyncio.run(run.run())
        failed = False
        return lines
    except Exception as exc:
        # A failed run's error names the worker's log: it stays where it points, and the
        # one error line says where the run's files are.
        exc.args = (f"{exc} (the live run's files are kept in {workdir})",)
        raise
    finally:
        run.stop()
        if broker is not None:
            broker.stop()
        if keep:
            print(f"onceflow: live run files kept in {workdir}", file=sys.stderr)
        elif not failed:
            shutil.rmtree(workdir, ignore_errors=True)


def print_live(path: str, *, summary: bool = False, bootstrap: str | None = None) -> int:
    """The `onceflow replay --live` command."""
    from onceflow.journal import summary_table

    with stopped_on_term():  # SIGTERM stops the run's broker and worker too
        lines = run_live(path, bootstrap=bootstrap, keep=bool(os.environ.get("ONCEFLOW_KEEP")))
    if summary:
        sys.stdout.write(summary_table(lines))
    else:
        out = sys.stdout.buffer
        for line in lines:
            out.write(orjson.dumps(line))
            out.write(b"\n")
    sys.stdout.flush()
    return 0
