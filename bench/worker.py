"""Benchmark: documents per second through one onceflow worker against a naive Faust agent.

One run on one embedded broker: 100,000 documents are written to a 4-partition topic once,
then read by
  - one onceflow worker (a simple trigger, history on, the no-op service; every document
    gets its processing and completed history entries and a journal record), and
  - a naive Faust agent doing one RocksDB table get and put per document, with Faust's
    default producer settings and again with producer_max_batch_size=1 (the spike's
    setting for a Faust app on the embedded broker).
Each rate is taken from the moment the worker is ready (group joined, tables recovered)
to the moment its last document is done (onceflow: its journal record is on the broker).
The ratio is against the faster naive run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.kafka import Producer, TopicFollower
from onceflow.app.process import (
    WorkerProcess,
    WorkerUnreachable,
    dies_with_parent,
    http_json,
    stopped_on_term,
)
from onceflow.app.topics import TopicSpec, ensure_topics

HERE = Path(__file__).resolve().parent / "worker"
PREFIX = "bench."


async def fill(bootstrap: str, documents: int) -> None:
    """Write the documents once, keyed by uuid."""
    topic = PREFIX + "doc"
    await ensure_topics(bootstrap, [TopicSpec(topic, "input", 4, -1, ())])
    async with Producer(bootstrap) as producer:
        pending = []
        for i in range(documents):
            pending.append(await producer.send(
                topic, orjson.dumps({"uuid": f"doc-{i}", "body": {"n": i}}),
                key=f"doc-{i}".encode()))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)


def onceflow_rate(broker: EmbeddedBroker, documents: int, workdir: Path) -> float:
    """Documents per second through one onceflow worker."""
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": PREFIX,
           "ONCEFLOW_PARTITIONS": "4", "ONCEFLOW_DATA_DIR": str(workdir / "onceflow"),
           "ONCEFLOW_WEB_PORT": str(free_port()), "ONCEFLOW_SESSION_TIMEOUT": "2",
           "ONCEFLOW_HEARTBEAT_INTERVAL": "0.3",
           "ONCEFLOW_SECURITY_PROTOCOL": "PLAINTEXT"}  # the embedded broker is open
    worker = WorkerProcess(HERE / "triggers.toml", env, workdir / "onceflow.log").start()
    try:
        return documents / wait_journaled(broker, worker, documents)
    finally:
        worker.stop()


def wait_journaled(broker: EmbeddedBroker, worker: WorkerProcess, documents: int) -> float:
    """Seconds from the worker being ready until `documents` journal records are out."""
    worker.wait_ready()
    started = time.monotonic()

    async def done() -> None:
        journal = await TopicFollower(broker.bootstrap, PREFIX + "onceflow.journal").start()
        try:
            while len(journal.records) < documents:
                if not worker.alive:
                    raise RuntimeError(f"the worker died; see {worker.log_path}")
                await journal.wait(0.2)
        finally:
            await journal.stop()

    asyncio.run(done())
    return time.monotonic() - started


def naive_rate(broker: EmbeddedBroker, documents: int, workdir: Path, name: str,
               batch_size_1: bool) -> float:
    """Documents per second through the naive agent."""
    port = free_port()
    env = {**os.environ, "NAIVE_BROKER": broker.url, "NAIVE_TOPIC": PREFIX + "doc",
           "NAIVE_DATADIR": str(workdir / name), "NAIVE_WEB_PORT": str(port),
           "NAIVE_APP_ID": name, "NAIVE_BATCH_SIZE_1": "1" if batch_size_1 else "0"}
    log = (workdir / f"{name}.log").open("wb")
    process = subprocess.Popen([sys.executable, str(HERE / "naive_agent.py")], env=env,
                               stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=dies_with_parent())
    try:
        started = None
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the naive agent died; see {workdir / name}.log")
            try:
                _, body = http_json(f"http://127.0.0.1:{port}/progress", timeout=2)
            except WorkerUnreachable:
                time.sleep(0.05)
                continue
            if started is None:
                started = time.monotonic()  # the web server starts once recovery is done
            if body["processed"] >= documents:
                return documents / (time.monotonic() - started)
            time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=100_000)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-bench-"))
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        asyncio.run(fill(broker.bootstrap, args.documents))
        ours = onceflow_rate(broker, args.documents, workdir)
        naive = naive_rate(broker, args.documents, workdir, "naive", False)
        naive_1 = naive_rate(broker, args.documents, workdir, "naive-batch-1", True)
    print(f"documents: {args.documents:,} on 4 partitions, one worker each, "
          f"embedded broker on this machine ({os.cpu_count()} cores)")
    print(f"onceflow worker (history on, no-op service):            {ours:10,.0f} docs/s")
    print(f"naive Faust agent (table get + put, Faust defaults):     {naive:10,.0f} docs/s")
    print(f"naive Faust agent (same, producer_max_batch_size=1):     {naive_1:10,.0f} docs/s")
    print(f"ratio onceflow / naive: {ours / naive:.1f}x  "
          f"(/ naive with producer_max_batch_size=1: {ours / naive_1:.1f}x; target >= 5x)")


if __name__ == "__main__":
    with stopped_on_term():  # SIGTERM stops the broker and workers it started
        main()
