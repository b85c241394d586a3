"""Benchmark: the worker's per-partition path against the replay engine, in one process.

The job of bench/peers.py (JSON documents keyed by uuid on 4 partitions, about 10% resent
under the same key, a simple trigger with the `echo` service, history, journal and
duplicate-ID cache on), without Kafka and without Faust, so that the worker's own code is
measured alone and with little noise:

- replay: the core's `Engine` over the records, in one loop (the baseline: the trigger
  semantics with nothing around them);
- worker: the worker's `Runtime.handle` over the same records, handed over in fetches of
  up to CHUNK records a partition as the transport does, with in-memory table partitions
  in place of RocksDB, and aiokafka's record batch builder in place of the producer: every
  journal record, output and changelog entry is encoded into a record batch as it would be
  sent, and the batch dropped;
- floor: decoding every input value and encoding one journal record and one output a
  document (what any runner must do).

Each line prints CPU microseconds a document and its ratio to the replay's, from the same
run.  One difference from a real worker: in this process glibc hands the heap top back to
the kernel between fetches and takes it back page by page (about 590,000 page faults in a
worker run of 200,000 documents, 212,000 with 64 MiB kept by mallopt), while a real worker
on bench/peers.py took about 35,000 a 100,000 documents, so the worker line here carries a
microsecond or two a document that the worker does not pay (2026-11-26).

Both runners must give the same multiset of journal outcomes and one output a unique
uuid; the bench fails otherwise.

    .venv/bin/python bench/partition.py [--documents 200000] [--repeat 3] [--profile FILE]
                                        [--only none|replay|worker|floor]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import RecordMetadata
from onceflow.agents.context import WorkerOptions
from onceflow.app.settings import WorkerSettings
from onceflow.engine import Engine
from onceflow.envelope import Record, seconds
from onceflow.keys import kafka_partition
from onceflow.processor import Sink
from onceflow.store import MemoryState
from onceflow.tables.outbox import KafkaSender
from onceflow.triggers import TriggerSet, parse_triggers

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # memory_broker
from peers import TRIGGERS, documents  # noqa: E402

from tests.agents.cluster import LocalCluster  # noqa: E402

PARTITIONS = 4
CHUNK = WorkerOptions().chunk_size  # the transport hands a fetch over in chunks this size


def records(count: int) -> list[tuple[int, int, bytes, bytes, int]]:
    """(partition, offset, key, value, timestamp ms) as the producer partitions them."""
    offsets = [0] * PARTITIONS
    out = []
    base = int(time.time() * 1000) - 60_000
    for n, (uuid, value) in enumerate(documents(count)):
        key = uuid.encode()
        partition = kafka_partition(key, PARTITIONS)
        out.append((partition, offsets[partition], key, value, base + n // 100))
        offsets[partition] += 1
    return out


def replay(triggers: TriggerSet, items: list[tuple[int, int, bytes, bytes, int]]
           ) -> tuple[float, Counter[str], int]:
    """CPU seconds, outcome counts and outputs of the core engine (one per partition)."""
    engines = [Engine(triggers, state=MemoryState()) for _ in range(PARTITIONS)]
    sinks = [Sink() for _ in range(PARTITIONS)]
    start = time.process_time()
    for partition, offset, key, value, ts in items:
        record = Record("doc", partition, offset, ts, orjson.loads(value),
                        key.decode(), {})
        engines[partition].process(record, offset, sinks[partition])
        # what the worker sends: every journal record and output, encoded
    for sink in sinks:
        for journal_record in sink.journal:
            orjson.dumps(journal_record.as_dict())
        for output in sink.outputs:
            orjson.dumps(output.value)
    spent = time.process_time() - start
    outcomes = Counter(r.outcome for s in sinks for r in s.journal)
    return spent, outcomes, sum(len(s.outputs) for s in sinks)


class BatchProducer:
    """The part of aiokafka's producer KafkaSender uses, building real record batches.

    Each batch is built (aiokafka's DefaultRecordBatchBuilder, as the producer would) and
    not sent; the journal's batches are kept, to be read after the clock has stopped.
    """

    def __init__(self, journal: str, output: str) -> None:
        self.journal_topic, self.output_topic = journal, output
        self.journal: list[bytes] = []
        self.outputs = 0
        self.offsets: dict[tuple[str, int], int] = {}

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(1024 * 1024, 0)

    async def send_batch(self, batch: BatchBuilder, topic: str, *,
                         partition: int) -> asyncio.Future[RecordMetadata]:
        count = batch._relative_offset
        data = batch._build()
        if topic == self.journal_topic:
            self.journal.append(bytes(data))
        elif topic == self.output_topic:
            self.outputs += count
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + count
        done = asyncio.get_running_loop().create_future()
        done.set_result(RecordMetadata(topic, partition, None, offset, -1, 0, 0))
        return done

    def journal_values(self) -> list[bytes]:
        values = []
        for data in self.journal:
            records = MemoryRecords(data)
            while (batch := records.next_batch()) is not None:
                values.extend(record.value for record in batch)
        return values


def worker(triggers: TriggerSet, items: list[tuple[int, int, bytes, bytes, int]]
           ) -> tuple[float, Counter[str], int]:
    """CPU seconds, outcome counts and outputs of the worker's Runtime.handle."""
    cluster = LocalCluster(triggers, partitions=PARTITIONS, idle_ticks=False)
    names = cluster.names
    producer = BatchProducer(names.journal, names.topic("echo.out"))
    cluster.runtime.sender = KafkaSender(producer)
    topic = names.topic("doc")
    from onceflow.agents.wire import Delivery

    by_partition: list[list[Delivery]] = [[] for _ in range(PARTITIONS)]
    for partition, offset, key, value, ts in items:
        by_partition[partition].append(Delivery(topic, partition, offset, ts, key,
                                                value, []))
    fetches: list[list[Delivery]] = []
    longest = max(len(p) for p in by_partition)
    for start in range(0, longest, CHUNK):
        for part in by_partition:
            if part[start:start + CHUNK]:
                fetches.append(part[start:start + CHUNK])

    async def run() -> float:
        handle = cluster.runtime.handle
        begin = time.process_time()
        for fetch in fetches:
            await handle(fetch)
        return time.process_time() - begin

    spent = asyncio.run(run())
    outcomes = Counter(orjson.loads(value)["outcome"] for value in producer.journal_values())
    return spent, outcomes, producer.outputs


def floor(items: list[tuple[int, int, bytes, bytes, int]]) -> float:
    """CPU seconds to decode every value and encode a journal record and an output each."""
    start = time.process_time()
    for partition, offset, _key, value, ts in items:
        doc = orjson.loads(value)
        orjson.dumps({"trigger": "echo", "outcome": "processed", "identity": doc["uuid"],
                      "activation": None, "ts": seconds(ts), "topic": "doc",
                      "partition": partition, "offset": offset})
        orjson.dumps(doc)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", help="write a cProfile of one worker run to this file")
    parser.add_argument("--only", choices=("none", "replay", "worker", "floor"),
                        help="make the records and run this runner once (or none), printing "
                        "nothing: what bench/instructions.py counts under callgrind")
    args = parser.parse_args()
    import tomllib

    triggers = parse_triggers(tomllib.loads(TRIGGERS))
    # The collector as each runner has it: the worker freezes what it built at start and
    # raises the thresholds (app/worker.py); the replay turns it off (app/replay.py).
    gc.collect()
    gc.freeze()
    threshold = WorkerSettings.model_fields["gc_threshold"].default
    items = records(args.documents)
    unique = len({key for _, _, key, _, _ in items})
    if args.only is not None:
        gc.set_threshold(*threshold)
        if args.only == "replay":
            gc.disable()
            replay(triggers, items)
        elif args.only == "worker":
            worker(triggers, items)
        elif args.only == "floor":
            floor(items)
        return
    if args.profile:
        gc.set_threshold(*threshold)
        profiler = cProfile.Profile()
        profiler.enable()
        worker(triggers, items)
        profiler.disable()
        profiler.dump_stats(args.profile)
        print(f"profile of one worker run in {args.profile}")
        return
    best: dict[str, float] = {}
    answers = {}
    for _ in range(args.repeat):
        for name, run in (("replay", replay), ("worker", worker)):
            gc.collect()
            if name == "replay":
                gc.disable()
            else:
                gc.enable()
                gc.set_threshold(*threshold)
            spent, outcomes, outputs = run(triggers, items)
            gc.enable()
            best[name] = min(best.get(name, spent), spent)
            answers[name] = (outcomes, outputs)
        gc.collect()
        spent = floor(items)
        best["floor"] = min(best.get("floor", spent), spent)
    if answers["replay"] != answers["worker"] or answers["worker"][1] != unique:
        raise SystemExit(f"the runners disagree: {answers} ({unique} unique uuids)")
    count = len(items)
    print(f"{count:,} documents ({unique:,} unique) on {PARTITIONS} partitions, fetches of "
          f"{CHUNK}, best of {args.repeat}; {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'runner':<40} {'CPU us/doc':>10} {'vs replay':>10}")
    labels = {"floor": "floor (decode + encode a journal record, an output)",
              "replay": "replay engine (core only)",
              "worker": "worker path (Runtime.handle, memory tables)"}
    for name in ("floor", "replay", "worker"):
        print(f"{labels[name]:<40} {best[name] / count * 1e6:>10.2f} "
              f"{best[name] / best['replay']:>9.2f}x")


if __name__ == "__main__":
    main()
