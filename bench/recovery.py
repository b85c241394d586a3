"""Benchmark: how long a worker started on an empty data dir takes to recover its tables.

A worker processes N documents (default 1,000,000 distinct uuids, history on, the no-op
service), so the history changelog holds N processing and N completed entries (plus the
duplicate-ID progress and control entries).  It is stopped, its data dir is deleted, and
a new worker is started on the same topics: the time from its start to /readyz 200 is
the recovery (every changelog read back into RocksDB), printed with the time the same
worker takes to start on a kept data dir (the baseline measured in the same run).

On Apache Kafka the changelogs are compacted, so a recovery reads about one record per
live key (N history entries); tansu does not compact, so it reads every record ever
written (about 2N for history here, more when entries are rewritten or swept).  The
bench prints how many changelog records the recovery read to show that cost.

    .venv/bin/python bench/recovery.py [--documents 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import worker as worker_bench  # bench/worker.py: fill()
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.kafka import TopicFollower
from onceflow.app.process import WorkerProcess, WorkerUnreachable, http_json, stopped_on_term

PREFIX = worker_bench.PREFIX
TRIGGERS = Path(__file__).resolve().parent / "worker" / "triggers.toml"


def start(broker: EmbeddedBroker, data: Path, log: Path) -> WorkerProcess:
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": PREFIX,
           "ONCEFLOW_PARTITIONS": "4", "ONCEFLOW_DATA_DIR": str(data),
           "ONCEFLOW_WEB_PORT": str(free_port()), "ONCEFLOW_SESSION_TIMEOUT": "6",
           "ONCEFLOW_HEARTBEAT_INTERVAL": "1", "ONCEFLOW_SECURITY_PROTOCOL": "PLAINTEXT"}
    return WorkerProcess(TRIGGERS, env, log).start()


def until_ready(worker: WorkerProcess, timeout: float = 1800.0) -> float:
    """Seconds from now until the worker's /readyz says 200."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not worker.alive:
            raise RuntimeError(f"the worker died; see {worker.log_path}")
        try:
            status, _ = http_json(worker.web_url + "/readyz", timeout=5)
            if status == 200:
                return time.monotonic() - started
        except WorkerUnreachable:
            pass
        time.sleep(0.1)
    raise RuntimeError("the worker was never ready")


def changelog_records(bootstrap: str) -> int:
    """Records on the history changelog (what a recovery reads on tansu)."""
    async def count() -> int:
        follower = await TopicFollower(bootstrap, PREFIX + "onceflow-history-changelog").start()
        try:
            await follower.caught_up(120)
            return len(follower.records)
        finally:
            await follower.stop()
    return asyncio.run(count())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=1_000_000)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-recovery-"))
    data = workdir / "data"
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        asyncio.run(worker_bench.fill(broker.bootstrap, args.documents))
        filled = time.monotonic()
        first = start(broker, data, workdir / "first.log")
        try:
            worker_bench_rate = args.documents / worker_bench.wait_journaled(
                broker, first, args.documents)
        finally:
            first.stop()
        print(f"processed {args.documents:,} documents in {time.monotonic() - filled:.0f} s "
              f"({worker_bench_rate:,.0f} docs/s)")
        kept = start(broker, data, workdir / "kept.log")
        try:
            kept_seconds = until_ready(kept)
        finally:
            kept.stop()
        shutil.rmtree(data)
        wiped = start(broker, data, workdir / "wiped.log")
        try:
            wiped_seconds = until_ready(wiped)
        finally:
            wiped.stop()
        read = changelog_records(broker.bootstrap)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"start on the kept data dir, to /readyz 200:      {kept_seconds:8.1f} s")
    print(f"start on an empty data dir (recovery), to 200:   {wiped_seconds:8.1f} s")
    print(f"history changelog records read by the recovery:  {read:>10,} "
          f"(compacted Kafka: about {args.documents:,}, one a live entry)")
    print(f"target: recovery of {args.documents:,} history entries within 30 s: "
          f"{'met' if wiped_seconds <= 30 else 'NOT met'}")


if __name__ == "__main__":
    with stopped_on_term():  # SIGTERM stops the broker and workers it started
        main()
