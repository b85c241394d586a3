"""The I/O floor under onceflow's worker: aiokafka moving the records it moves, no decisions.

Run by bench/peers.py as a contender of its own (a separate process, like the others).  It
reads the input topic with aiokafka in fetches of up to 5,000 records, takes them in
chunks of 1,000 as the worker does, and writes, through onceflow's own producer path
(`tables.outbox.KafkaSender`: one producer batch per topic-partition), what the worker
writes for a simple trigger, in the worker's three waits a chunk:

1. a processing entry per new document to a history changelog (the write that must be
   acknowledged before any service runs);
2. the output (the echoed document) and a journal record per document;
3. a completed entry per new document to the history changelog.

`PEERS_FLOOR_WRITES` changes what is written, to show what each kind of write costs
(bench/peers.py --floor-variants runs them all in one run):

- `worker` (the default): the above, 3.7 records a document;
- `chunked`: the processing and the completed entries of a chunk as one record each per
  partition (a list of keys), instead of one record a document: what writing them once per
  chunk would leave;
- `no-history`: outputs and journal records only (no processing or completed entries);
- `outputs`: the outputs alone (about what Quix writes besides its changelog).

A set in memory stands for the duplicate check (nothing is decided, nothing persisted
locally), and offsets are committed once a second.  So its rate is what aiokafka and the
broker allow for onceflow's write pattern on this machine; onceflow's own work (ingress,
the decisions, RocksDB, Faust) comes on top of it.

    PEERS_BROKER=host:port PEERS_INPUT=topic PEERS_PREFIX=p. python bench/io_floor.py
"""

from __future__ import annotations

import asyncio
import os
import time

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from onceflow.app.topics import TopicSpec, ensure_topics
from onceflow.tables.outbox import KafkaSender, Outbox

CHUNK = 1000
PARTITIONS = 4


async def main() -> None:
    broker = os.environ["PEERS_BROKER"]
    prefix = os.environ["PEERS_PREFIX"]
    history, output, journal = (prefix + "history-changelog", prefix + "echo.out",
                                prefix + "journal")
    await ensure_topics(broker, [TopicSpec(history, "changelog", PARTITIONS, -1, ()),
                                 TopicSpec(output, "output", PARTITIONS, -1, ()),
                                 TopicSpec(journal, "output", PARTITIONS, -1, ())])
    consumer = AIOKafkaConsumer(os.environ["PEERS_INPUT"], bootstrap_servers=broker,
                                group_id=prefix + "group", auto_offset_reset="earliest",
                                enable_auto_commit=False, max_poll_records=5000,
                                session_timeout_ms=6000, heartbeat_interval_ms=1000)
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all",
                                enable_idempotence=False, linger_ms=0,
                                max_batch_size=1024 * 1024)
    await consumer.start()
    await producer.start()
    sender = KafkaSender(producer)
    writes = os.environ.get("PEERS_FLOOR_WRITES", "worker")
    if writes not in WRITES:
        raise SystemExit(f"PEERS_FLOOR_WRITES: one of {', '.join(WRITES)}")
    seen: set[bytes] = set()
    committed_at = time.monotonic()
    try:
        while True:
            fetched = await consumer.getmany(timeout_ms=1000)
            records = [r for batch in fetched.values() for r in batch]
            for start in range(0, len(records), CHUNK):
                await chunk_of(records[start:start + CHUNK], seen, sender, history,
                               output, journal, writes)
            if time.monotonic() - committed_at > 1.0:
                await consumer.commit()
                committed_at = time.monotonic()
    finally:
        await producer.stop()
        await consumer.stop()


WRITES = ("worker", "chunked", "no-history", "outputs")


async def chunk_of(records: list, seen: set[bytes], sender: KafkaSender, history: str,
                   output: str, journal: str, writes: str = "worker") -> None:
    """One chunk: processing entries, then outputs and journal, then completed entries."""
    processing, results, completed = Outbox(), Outbox(), Outbox()
    entries = writes in ("worker", "chunked")
    keys: dict[int, list[str]] = {}
    for record in records:
        document = orjson.loads(record.value)
        uuid = document["uuid"].encode()
        partition = record.partition
        start = record.timestamp / 1000
        new = uuid not in seen
        if new:
            seen.add(uuid)
            if writes == "worker":
                processing.add(history, partition, b"echo" + uuid, orjson.dumps([start, 1]))
                completed.add(history, partition, b"echo" + uuid, orjson.dumps([start, 3]))
            elif writes == "chunked":
                keys.setdefault(partition, []).append(document["uuid"])
            results.add(output, partition, record.key, orjson.dumps(document))
        if writes != "outputs":
            results.add(journal, partition, record.key, orjson.dumps({
                "trigger": "echo", "outcome": "processed" if new else "duplicate",
                "identity": document["uuid"], "activation": None, "ts": start,
                "topic": record.topic, "partition": partition, "offset": record.offset}))
    for partition, uuids in keys.items():
        processing.add(history, partition, b"echo-chunk", orjson.dumps([uuids, 1]))
        completed.add(history, partition, b"echo-chunk", orjson.dumps([uuids, 3]))
    for outbox in ((processing, results, completed) if entries else (results,)):
        if outbox.count:
            await sender.send(outbox)


if __name__ == "__main__":
    asyncio.run(main())
