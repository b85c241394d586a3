"""End-to-end latency at a fixed rate: how long a document takes from publisher to output.

Used by bench/peers.py.  A contender (a onceflow worker, or the Quix Streams job) is
started on an empty input topic of its own; one warm-up document is sent until its output
comes back (so the group has joined and state is open), then distinct documents are sent
at a steady rate for a fixed time, in small paced batches.  The latency of a document is
the time its output is read back on the output topic minus the time it was handed to the
producer: both are this process's wall clock, and both contenders' outputs are read the
same way (a consumer waiting at most 20 ms a fetch), so the reading adds about the same to
both.  Record timestamps are not used: Quix Streams gives an output its input's
timestamp, onceflow the time it is produced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
from onceflow.app.kafka import Producer, TopicFollower
from onceflow.app.topics import TopicSpec, ensure_topics

BATCHES_A_SECOND = 100


async def _follow(follower: TopicFollower, seen: dict[str, float], stop: asyncio.Event) -> None:
    """Stamp each output with the wall time it was read, until stop."""
    done = 0
    while not stop.is_set():
        await follower.wait(0.01)
        now = time.time()
        records = follower.records
        for record in records[done:]:
            uuid = orjson.loads(record.value)["uuid"]
            seen.setdefault(uuid, now)
        done = len(records)


async def measure(bootstrap: str, input_topic: str, output_topic: str, rate: float,
                  seconds: float, alive: Callable[[], bool],
                  partitions: int = 4) -> dict[str, float]:
    """Send distinct documents at `rate` a second for `seconds`: the latency figures.

    Returns p50, p90, p99 and max in milliseconds, the rate actually sent, and how many
    documents were sent and came back.
    """
    await ensure_topics(bootstrap, [TopicSpec(input_topic, "input", partitions, -1,
                                              (("retention.ms", "604800000"),))])
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    async with Producer(bootstrap) as producer:
        follower = None
        deadline = time.monotonic() + 120
        # Warm up: the output topic may not exist before the contender's first output.
        while follower is None:
            if not alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{output_topic}: no warm-up output within 120 s")
            value = orjson.dumps({"uuid": "warm-up", "body": {"n": -1}})
            await (await producer.send(input_topic, value, key=b"warm-up"))
            try:
                follower = await TopicFollower(bootstrap, output_topic).start()
            except TimeoutError:
                follower = None
        stop = asyncio.Event()
        reader = asyncio.create_task(_follow(follower, seen, stop))
        try:
            while "warm-up" not in seen:
                if not alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"{output_topic}: no warm-up output within 120 s")
                await asyncio.sleep(0.05)
            per_batch = max(1, round(rate / BATCHES_A_SECOND))
            interval = per_batch / rate
            start = time.monotonic()
            n = 0
            pending = []
            while time.monotonic() - start < seconds:
                for _ in range(per_batch):
                    uuid = f"lat-{n:09d}"
                    value = orjson.dumps({"uuid": uuid, "body": {"n": n, "pad": "x" * 64}})
                    sent[uuid] = time.time()
                    pending.append(await producer.send(input_topic, value,
                                                       key=uuid.encode()))
                    n += 1
                if len(pending) >= 2000:
                    await asyncio.gather(*pending)
                    pending = []
                pause = start + n / per_batch * interval - time.monotonic()
                await asyncio.sleep(max(0.0, pause))
            await asyncio.gather(*pending)
            elapsed = time.monotonic() - start
            last_change = time.monotonic()
            count = len(seen)
            while len(seen) < len(sent) + 1 and alive():
                await asyncio.sleep(0.1)
                if len(seen) != count:
                    count, last_change = len(seen), time.monotonic()
                elif time.monotonic() - last_change > 30:
                    break
        finally:
            stop.set()
            await reader
            await follower.stop()
    late = sorted((seen[uuid] - at) * 1000 for uuid, at in sent.items() if uuid in seen)
    if not late:
        raise RuntimeError(f"{output_topic}: none of {len(sent)} documents came back")

    def pct(p: float) -> float:
        return late[min(len(late) - 1, int(p / 100 * len(late)))]

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": late[-1],
            "rate": len(sent) / elapsed, "sent": float(len(sent)),
            "back": float(len(late))}
