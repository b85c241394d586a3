"""Benchmark: onceflow against Quix Streams and a naive Faust agent, on one job, in one run.

The job: JSON documents on a 4-partition topic, keyed by uuid, about 10% of them sent
again later under the same key.  Drop a resent uuid using persistent RocksDB state, run a
service that echoes the document, publish the output.  Every contender reads the same
records from the same embedded broker in the same run:

- onceflow, one worker and then two (a simple trigger with the `echo` service: history,
  journal and duplicate-ID cache on, outputs to `echo.out`);
- Quix Streams, at-least-once, deduplicating on the Kafka key (state per key);
- Quix Streams after `group_by("uuid")` (a repartition hop, like onceflow's route topic);
- a naive Faust agent (one table get and put a document, no output);
- onceflow again with the no-op service (no output; its rate is taken on the journal), to
  show what publishing the outputs costs.

Then the end-to-end latency of one onceflow worker and of Quix keyed, each on an empty
input topic of its own, at half of Quix keyed's rate in this run (`--latency-rate` sets
another): p50, p90, p99 and the largest, from publishing a document to reading its output
back (bench/latency.py says how).  And onceflow's rate against its aiokafka floor.

Besides the rate, each onceflow and Quix row shows the CPU the contender and the broker
spent per document between the first output and the last (from /proc).

A rate is documents taken in (resends included) divided by the time from the first output
to the last one (the naive agent: from its web server starting, after recovery, to its
last document), so start-up is left out alike.  Each contender's outputs must be exactly
one per unique uuid; the bench fails otherwise.  Peak RSS is the contender process's.

Quix Streams and confluent-kafka are bench-only (`pip install -e '.[bench]'`).  On the
embedded broker (tansu) Quix needs two workarounds: the input topic is created with
`retention.ms` (Quix derives its changelog topics' config from the input topic's, and
tansu's DescribeConfigs returns only configs a topic was created with), and
`session.timeout.ms` of 6000.

    .venv/bin/python bench/peers.py [--documents 100000] [--skip quix-groupby,...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.kafka import Producer, TopicFollower
from onceflow.app.process import WorkerProcess, dies_with_parent, stopped_on_term
from onceflow.app.topics import TopicSpec, ensure_topics

sys.path.insert(0, str(Path(__file__).resolve().parent))
import latency  # noqa: E402
from procs import cpu_seconds, peak_rss_mib  # noqa: E402
from worker import naive_rate  # noqa: E402

PREFIX = "peers."
FLOOR = "aiokafka floor: onceflow's records, no work"
INPUT = PREFIX + "doc"
RETENTION = (("retention.ms", "604800000"),)
TRIGGERS = """
[[trigger]]
name = "echo"
types = ["doc"]
service = "echo"
"""
QUIX = r'''
import os, sys
from quixstreams import Application

mode = os.environ["PEERS_MODE"]
app = Application(
    broker_address=os.environ["PEERS_BROKER"], consumer_group=os.environ["PEERS_GROUP"],
    auto_offset_reset="earliest", state_dir=os.environ["PEERS_STATE"],
    processing_guarantee="at-least-once",
    consumer_extra_config={"session.timeout.ms": 6000},
    loglevel="WARNING")
source = app.topic(os.environ["PEERS_INPUT"], value_deserializer="json")
sink = app.topic(os.environ["PEERS_OUTPUT"], value_serializer="json")
frame = app.dataframe(source)
if mode == "groupby":
    frame = frame.group_by("uuid")

def first_time(value, state):
    if state.exists("seen"):
        return False
    state.set("seen", 1)
    return True

frame = frame.filter(first_time, stateful=True)
frame = frame.apply(lambda value: value)  # the echo service
frame.to_topic(sink)
app.run()
'''


def documents(count: int, seed: int = 7) -> list[tuple[str, bytes]]:
    """(uuid, value): about 10% are later copies of an earlier uuid."""
    rng = random.Random(seed)
    out: list[tuple[str, bytes]] = []
    uuids: list[str] = []
    for i in range(count):
        if uuids and rng.random() < 0.1:
            uuid = rng.choice(uuids)
        else:
            uuid = f"doc-{i:08d}"
            uuids.append(uuid)
        out.append((uuid, orjson.dumps({"uuid": uuid, "body": {"n": i, "pad": "x" * 64}})))
    return out


async def fill(bootstrap: str, items: list[tuple[str, bytes]]) -> None:
    """Write the documents once, keyed by uuid, to a topic with retention.ms set."""
    await ensure_topics(bootstrap, [TopicSpec(INPUT, "input", 4, -1, RETENTION)])
    async with Producer(bootstrap) as producer:
        pending = []
        for uuid, value in items:
            pending.append(await producer.send(INPUT, value, key=uuid.encode()))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)


def watch_outputs(bootstrap: str, topic: str, expected: int, alive: object,
                  cpu: Cpu | None = None, timeout: float = 900.0) -> tuple[float, list[bytes]]:
    """Follow an output topic until `expected` records: (seconds first to last, values)."""
    async def run() -> tuple[float, list[bytes]]:
        follower = await TopicFollower(bootstrap, topic).start()
        first = last = None
        deadline = time.monotonic() + timeout
        try:
            while True:
                count = len(follower.records)
                now = time.monotonic()
                if count and first is None:
                    first = now
                    if cpu is not None:
                        cpu.first()
                if count >= expected:
                    last = now
                    if cpu is not None:
                        cpu.last()
                    break
                if not alive() or now > deadline:  # type: ignore[operator]
                    raise RuntimeError(f"{topic}: {count} of {expected} outputs, then "
                                       "the contender stopped or the time ran out")
                await follower.wait(0.05)
            await asyncio.sleep(1.0)  # anything beyond `expected` is a duplicate output
            values = [r.value for r in follower.records]
        finally:
            await follower.stop()
        return last - first, values  # type: ignore[operator]

    return asyncio.run(run())


def check_outputs(name: str, values: list[bytes], unique: set[str], key: str) -> None:
    """Exactly one output per unique uuid."""
    seen = [orjson.loads(v)[key] if key else orjson.loads(v)["uuid"] for v in values]
    if len(seen) != len(unique) or set(seen) != unique:
        raise SystemExit(f"{name}: {len(seen)} outputs for {len(unique)} unique uuids "
                         f"({len(set(seen) - unique)} unknown, {len(unique - set(seen))} "
                         f"missing, {len(seen) - len(set(seen))} repeated)")


class Cpu:
    """CPU seconds each watched process spent between the first output and the last."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start: dict[str, float] = {}
        self.spent: dict[str, float] = {}

    def first(self) -> None:
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def last(self) -> None:
        self.spent = {name: cpu_seconds(pid) - self.start.get(name, 0.0)
                      for name, pid in self.pids.items()}


def worker_env(broker: EmbeddedBroker, prefix: str, data_dir: Path) -> dict[str, str]:
    """A bench worker's settings: the defaults but for a 6 s session (as Quix's, on tansu)."""
    return {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
            "ONCEFLOW_PARTITIONS": "4", "ONCEFLOW_DATA_DIR": str(data_dir),
            "ONCEFLOW_WEB_PORT": str(free_port()), "ONCEFLOW_SESSION_TIMEOUT": "6",
            "ONCEFLOW_HEARTBEAT_INTERVAL": "1", "ONCEFLOW_SECURITY_PROTOCOL": "PLAINTEXT"}


def onceflow_run(broker: EmbeddedBroker, items: int, unique: set[str], workdir: Path,
                 workers: int, service: str = "echo") -> tuple[float, float, Cpu]:
    """(docs/s, peak RSS MiB of the first worker, CPU spent) with `workers` workers.

    service "echo" publishes one output per unique uuid (the job); "noop" publishes none,
    and the rate is taken on the journal (one record per document) instead.
    """
    prefix = f"{PREFIX}w{workers}{service}."
    triggers = workdir / f"triggers-{service}.toml"
    triggers.write_text(TRIGGERS.replace('service = "echo"', f'service = "{service}"'))
    # The workers read the shared input topic under their own prefix's topic name.
    asyncio.run(copy_input(broker.bootstrap, prefix + "doc"))
    started = []
    for n in range(workers):
        name = f"of{workers}{service}-{n}"
        started.append(WorkerProcess(triggers, worker_env(broker, prefix, workdir / name),
                                     workdir / f"{name}.log").start())
    try:
        for worker in started:
            worker.wait_ready()
        pids = {f"worker {n}": w.process.pid for n, w in enumerate(started)}  # type: ignore[union-attr]
        cpu = Cpu({**pids, "broker": broker.process.pid})  # type: ignore[union-attr]
        alive = lambda: all(w.alive for w in started)  # noqa: E731
        if service == "echo":
            seconds, values = watch_outputs(broker.bootstrap, prefix + "echo.out",
                                            len(unique), alive, cpu)
            check_outputs(f"onceflow x{workers}", values, unique, "")
        else:
            seconds, values = watch_outputs(broker.bootstrap, prefix + "onceflow.journal",
                                            items, alive, cpu)
            processed = [line["identity"] for line in map(orjson.loads, values)
                         if line["outcome"] == "processed"]
            if len(processed) != len(unique) or set(processed) != unique:
                raise SystemExit(f"onceflow {service}: {len(processed)} processed for "
                                 f"{len(unique)} unique uuids")
        rss = peak_rss_mib(started[0].process.pid)  # type: ignore[union-attr]
        return items / seconds, rss, cpu
    finally:
        for worker in started:
            worker.stop()


async def copy_input(bootstrap: str, topic: str) -> None:
    """The input records again, partition for partition, under another name."""
    from onceflow.app.kafka import read_topic

    records = await read_topic(bootstrap, INPUT)
    await ensure_topics(bootstrap, [TopicSpec(topic, "input", 4, -1, RETENTION)])
    async with Producer(bootstrap) as producer:
        pending = []
        for record in records:
            pending.append(await producer.send(topic, record.value, key=record.key,
                                               partition=record.partition))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)


@contextmanager
def script_process(script: Path, env: dict[str, str], log_path: Path
                   ) -> Iterator[subprocess.Popen[bytes]]:
    """A contender that is a Python script of its own, run with `env` added; stopped after."""
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, str(script)], env={**os.environ, **env},
                                   stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=dies_with_parent())
        try:
            yield process
        finally:
            process.terminate()
            process.wait(30)


def script_run(broker: EmbeddedBroker, items: int, unique: set[str], name: str,
               script: Path, env: dict[str, str], output: str, log_path: Path
               ) -> tuple[float, float, Cpu]:
    """(docs/s, peak RSS MiB, CPU spent) of a contender that is a Python script of its own:
    run with `env` added, followed on `output` until one record per unique uuid."""
    with script_process(script, env, log_path) as process:
        cpu = Cpu({name: process.pid, "broker": broker.process.pid})  # type: ignore[union-attr]
        seconds, values = watch_outputs(broker.bootstrap, output, len(unique),
                                        lambda: process.poll() is None, cpu)
        rss = peak_rss_mib(process.pid)
        check_outputs(name, values, unique, "")
        return items / seconds, rss, cpu


def quix_job(broker: EmbeddedBroker, workdir: Path, mode: str, name: str, topic: str,
             output: str) -> tuple[Path, dict[str, str]]:
    """The Quix Streams job's script and settings; `name` names its group and state."""
    script = workdir / "quix_job.py"
    script.write_text(QUIX)
    return script, {"PEERS_MODE": mode, "PEERS_BROKER": broker.bootstrap, "PEERS_GROUP": name,
                    "PEERS_STATE": str(workdir / name), "PEERS_INPUT": topic,
                    "PEERS_OUTPUT": output}


def quix_run(broker: EmbeddedBroker, items: int, unique: set[str], workdir: Path,
             mode: str) -> tuple[float, float, Cpu]:
    """(docs/s, peak RSS MiB, CPU spent) of Quix Streams keyed on the Kafka key or after
    group_by."""
    output = f"{PREFIX}quix-{mode}.out"
    script, env = quix_job(broker, workdir, mode, f"quix-{mode}", INPUT, output)
    return script_run(broker, items, unique, f"quix {mode}", script, env, output,
                      workdir / f"quix-{mode}.log")


def floor_run(broker: EmbeddedBroker, items: int, unique: set[str],
              workdir: Path, writes: str = "worker") -> tuple[float, float, Cpu]:
    """(docs/s, peak RSS MiB, CPU spent) of bench/io_floor.py: onceflow's records (or
    another set of writes: PEERS_FLOOR_WRITES), no work."""
    prefix = f"{PREFIX}floor-{writes}."
    env = {"PEERS_BROKER": broker.bootstrap, "PEERS_INPUT": INPUT, "PEERS_PREFIX": prefix,
           "PEERS_FLOOR_WRITES": writes}
    return script_run(broker, items, unique, f"io floor {writes}",
                      Path(__file__).with_name("io_floor.py"), env, prefix + "echo.out",
                      workdir / f"io-floor-{writes}.log")


def onceflow_latency(broker: EmbeddedBroker, workdir: Path, rate: float,
                     seconds: float) -> dict[str, float]:
    """Latency figures of one onceflow worker (echo service) at `rate` documents a second."""
    prefix = f"{PREFIX}lat."
    triggers = workdir / "triggers-latency.toml"
    triggers.write_text(TRIGGERS)
    asyncio.run(ensure_topics(broker.bootstrap,
                              [TopicSpec(prefix + "doc", "input", 4, -1, RETENTION)]))
    worker = WorkerProcess(triggers, worker_env(broker, prefix, workdir / "latency"),
                           workdir / "latency.log").start()
    try:
        worker.wait_ready()
        return asyncio.run(latency.measure(broker.bootstrap, prefix + "doc",
                                           prefix + "echo.out", rate, seconds,
                                           lambda: worker.alive))
    finally:
        worker.stop()


def quix_latency(broker: EmbeddedBroker, workdir: Path, rate: float,
                 seconds: float) -> dict[str, float]:
    """Latency figures of the Quix Streams job keyed on the Kafka key at `rate`."""
    topic, output = f"{PREFIX}lat-quix.in", f"{PREFIX}quix-lat.out"
    script, env = quix_job(broker, workdir, "key", "quix-lat", topic, output)
    asyncio.run(ensure_topics(broker.bootstrap, [TopicSpec(topic, "input", 4, -1, RETENTION)]))
    with script_process(script, env, workdir / "quix-lat.log") as process:
        return asyncio.run(latency.measure(broker.bootstrap, topic, output, rate, seconds,
                                           lambda: process.poll() is None))


def print_latency(rate: float, seconds: float, figures: dict[str, dict[str, float]]) -> None:
    """The latency table, and onceflow's p99 against Quix's."""
    print(f"end-to-end latency (publisher to output read back), distinct documents at "
          f"{rate:,.0f}/s for {seconds:g} s:")
    print(f"{'contender':<46} {'sent/s':>8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'back':>9}")
    for name, f in figures.items():
        print(f"{name:<46} {f['rate']:>8,.0f} {f['p50']:>7.1f} {f['p90']:>7.1f} "
              f"{f['p99']:>7.1f} {f['max']:>7.1f} {f['back']:>4,.0f}/{f['sent']:,.0f}")
    ours, quix = figures.get("onceflow, 1 worker"), figures.get("Quix Streams, keyed")
    if ours and quix:
        print(f"onceflow p99 / Quix p99: {ours['p99'] / quix['p99']:.2f}x (target <= 1x); "
              f"p50: {ours['p50'] / quix['p50']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--skip", default="", help="comma-separated: onceflow2, noop, "
                        "quix-key, quix-groupby, floor, naive, latency")
    parser.add_argument("--floor-variants", action="store_true",
                        help="also run the floor with fewer writes (bench/io_floor.py)")
    parser.add_argument("--latency-rate", type=float, default=0.0,
                        help="documents a second for the latency runs (default: half of "
                        "Quix keyed's rate in this run)")
    parser.add_argument("--latency-seconds", type=float, default=15.0)
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    items = documents(args.documents)
    unique = {uuid for uuid, _ in items}
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-peers-"))
    rows: list[tuple[str, float, float, Cpu | None]] = []
    load = os.getloadavg()[0]
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        asyncio.run(fill(broker.bootstrap, items))
        rows.append(("onceflow, 1 worker, echo service",
                     *onceflow_run(broker, len(items), unique, workdir, 1)))
        if "onceflow2" not in skip:
            rows.append(("onceflow, 2 workers",
                         *onceflow_run(broker, len(items), unique, workdir, 2)))
        if "noop" not in skip:
            rows.append(("onceflow, 1 worker, no-op service, no output",
                         *onceflow_run(broker, len(items), unique, workdir, 1, "noop")))
        if "quix-key" not in skip:
            rows.append(("Quix Streams, dedup on the Kafka key",
                         *quix_run(broker, len(items), unique, workdir, "key")))
        if "quix-groupby" not in skip:
            rows.append(('Quix Streams after group_by("uuid")',
                         *quix_run(broker, len(items), unique, workdir, "groupby")))
        if "floor" not in skip:
            rows.append((FLOOR,
                         *floor_run(broker, len(items), unique, workdir)))
        if args.floor_variants:
            for writes in ("chunked", "no-history", "outputs"):
                rows.append((f"floor, writes: {writes}",
                             *floor_run(broker, len(items), unique, workdir, writes)))
        if "naive" not in skip:
            rows.append(("naive Faust agent (get + put, no output)",
                         naive_rate_on(broker, len(items), workdir), 0.0, None))
        quix_rate = {n: r for n, r, _, _ in rows}.get("Quix Streams, dedup on the Kafka key")
        lat_rate = args.latency_rate or (quix_rate or 0.0) / 2
        lat: dict[str, dict[str, float]] = {}
        if "latency" not in skip and lat_rate > 0:
            lat["onceflow, 1 worker"] = onceflow_latency(broker, workdir, lat_rate,
                                                         args.latency_seconds)
            lat["Quix Streams, keyed"] = quix_latency(broker, workdir, lat_rate,
                                                      args.latency_seconds)
    ours = rows[0][1]
    print(f"{len(items):,} documents ({len(unique):,} unique) on 4 partitions, one "
          f"embedded broker, {os.cpu_count()} cores, load {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"{'contender':<46} {'docs/s':>8} {'vs onceflow':>11} {'peak RSS':>9} "
          f"{'CPU us/doc':>10} {'broker us/doc':>13}")
    per_doc = {}
    for name, rate, rss, cpu in rows:
        shown = f"{rss:,.0f} MiB" if rss else "-"
        own = broker_us = "-"
        if cpu is not None and cpu.spent:
            # CPU between the first output and the last (the span the rate is taken on).
            docs = len(items)
            own_s = sum(v for k, v in cpu.spent.items() if k != "broker")
            per_doc[name] = (own_s / docs * 1e6, cpu.spent["broker"] / docs * 1e6)
            own, broker_us = (f"{per_doc[name][0]:.0f}", f"{per_doc[name][1]:.0f}")
        print(f"{name:<46} {rate:>8,.0f} {rate / ours:>10.2f}x {shown:>9} "
              f"{own:>10} {broker_us:>13}")
    rates = {n: r for n, r, _, _ in rows}
    quix = rates.get("Quix Streams, dedup on the Kafka key")
    if quix:
        print(f"onceflow / Quix keyed: {ours / quix:.2f}x (target >= 2x)")
    floor = rates.get(FLOOR)
    if floor:
        print(f"onceflow / its aiokafka floor: {ours / floor:.2f}x (target >= 0.75x); "
              f"floor / onceflow: {floor / ours:.2f}x"
              + (f"; floor / Quix keyed: {floor / quix:.2f}x (the most onceflow could reach "
                 "with aiokafka and its writes)" if quix else ""))
    two = rates.get("onceflow, 2 workers")
    if two:
        print(f"2 onceflow workers / 1: {two / ours:.2f}x")
    noop = "onceflow, 1 worker, no-op service, no output"
    if noop in rates:
        echo = rows[0][0]
        print(f"outputs: the no-op run is {rates[noop] / ours:.2f}x the echo run's rate; per "
              f"document the worker spends {per_doc[echo][0]:.0f} us of CPU with outputs and "
              f"{per_doc[noop][0]:.0f} us without, the broker {per_doc[echo][1]:.0f} and "
              f"{per_doc[noop][1]:.0f} us")
    if lat:
        print_latency(lat_rate, args.latency_seconds, lat)
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"(logs in {workdir}; this process's peak RSS {parent:,.0f} MiB)")


def naive_rate_on(broker: EmbeddedBroker, count: int, workdir: Path) -> float:
    """The naive agent of bench/worker.py on this run's input topic."""
    import worker as worker_bench

    worker_bench.PREFIX = PREFIX  # its topic is PREFIX + "doc": this run's input
    return naive_rate(broker, count, workdir, "naive", False)


if __name__ == "__main__":
    with stopped_on_term():  # SIGTERM stops the broker and workers it started
        main()
