"""A record or a tick cannot push a worker's partition time into the future.

One record stamped in year 9999 used to move partition time there, and every join opened
on the partition afterwards expired at once, after restarts too (the time is stored).
Now such a record is `bad-input` (reason naming ONCEFLOW_MAX_CLOCK_SKEW), a tick beyond
the skew is `bad-input` on the repartition topic, and a stored time that is already
absurd starts again from the wall clock.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer

from .support import outcomes, records, trigger_file, wait_journal

pytestmark = pytest.mark.integration

YEAR_9999 = 253_402_300_799_000  # ms: 9999-12-31T23:59:59Z


def send(bootstrap: str, names: wire.Names,
         items: list[tuple[str, dict[str, Any] | bytes, int | None]]) -> None:
    """(topic, envelope or route-topic value, timestamp ms or None: now), in order, partition 0."""
    async def run() -> None:
        async with Producer(bootstrap) as producer:
            for topic, value, timestamp_ms in items:
                data = value if isinstance(value, bytes) else orjson.dumps(value)
                real = names.route if topic == "route" else names.topic(topic)
                await producer.send_and_wait(real, data, key=b"k", partition=0,
                                             timestamp_ms=timestamp_ms)

    asyncio.run(run())


def join(n: int) -> list[tuple[str, dict[str, Any] | bytes, int | None]]:
    return [("left", {"uuid": f"l-{n}", "activation": f"a-{n}"}, None),
            ("right", {"uuid": f"r-{n}", "activation": f"a-{n}"}, None)]


def joined(lines: list[dict[str, Any]], n: int) -> bool:
    """Whether join n has an answer: both members processed, or one expired."""
    members = outcomes(lines, f"l-{n}", "pairs") + outcomes(lines, f"r-{n}", "pairs")
    return members.count("processed") == 2 or "join-expired" in members


def assert_completed(lines: list[dict[str, Any]], n: int) -> None:
    # (A record the broker hands over again after a rebalance, which a loaded machine can
    # cause, is journaled again as a duplicate: only the first answer counts.)
    for member in (f"l-{n}", f"r-{n}"):
        assert "processed" in outcomes(lines, member, "pairs"), member
        assert "join-expired" not in outcomes(lines, member), member


def test_a_record_or_tick_from_the_future_does_not_expire_joins(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = trigger_file(tmp_path)
    prefix = new_prefix()
    names = wire.Names(prefix)
    bootstrap = broker.bootstrap

    # Without the limit (a skew of ~30,000 years), what a worker did before: the record
    # moves partition time to 9999 and stores it; the next join expires at once.
    worker = start_worker(triggers, prefix, partitions=1, max_clock_skew=1e12)
    # (Topics are fetched in no fixed order: the join is sent once the order is journaled.)
    send(bootstrap, names, [("order", {"uuid": "f-0"}, YEAR_9999)])
    wait_journal(bootstrap, names, lambda ls: bool(outcomes(ls, "f-0")), worker)
    send(bootstrap, names, join(0))
    wait_journal(bootstrap, names, lambda ls: "join-expired" in outcomes(ls, "r-0"), worker)
    worker.stop()

    # With the default limit on the same data: the stored time starts from the clock again.
    worker = start_worker(triggers, prefix, partitions=1)
    send(bootstrap, names, join(1))
    assert_completed(wait_journal(bootstrap, names, lambda ls: joined(ls, 1), worker), 1)

    # A record from year 9999: bad input, and the next join on the partition completes.
    send(bootstrap, names, [("left", {"uuid": "f-1", "activation": "a-2"}, YEAR_9999),
                            *join(2)])
    lines = wait_journal(bootstrap, names, lambda ls: joined(ls, 2), worker)
    future = next(x for x in lines if x["identity"] == "f-1")
    assert (future["trigger"], future["outcome"]) == (None, "bad-input")
    assert future["topic"] == "left" and future["activation"] == "a-2"
    assert "9999-12-31T23:59:59Z" in future["reason"]
    assert "ONCEFLOW_MAX_CLOCK_SKEW (300 s)" in future["reason"]
    assert_completed(lines, 2)
    letters = [orjson.loads(r.value) for r in records(bootstrap, names.dead_letter)]
    letter = next(x for x in letters if x.get("value", {}).get("uuid") == "f-1")
    assert "ONCEFLOW_MAX_CLOCK_SKEW" in letter["reason"] and letter["offset"] == future["offset"]

    # Ticks through the repartition topic: one at 1e300 and one a day ahead are bad input;
    # one far in the past and a record stamped at 1970 move nothing forward.
    send(bootstrap, names, [
        ("route", wire.control_message(wire.TICK, ts=1e300), None),
        ("route", wire.control_message(wire.TICK, ts=time.time() + 86_400), None),
        ("route", wire.control_message(wire.TICK, ts=-5.0), None),
        ("order", {"uuid": "old-1"}, 0),
        *join(3)])
    def route_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        by_offset = {x["offset"]: x for x in lines if x["topic"] == "onceflow.route"}
        return [by_offset[offset] for offset in sorted(by_offset)]

    lines = wait_journal(bootstrap, names, lambda ls: joined(ls, 3) and len(route_lines(ls))
                         >= 2 and bool(outcomes(ls, "old-1")), worker)
    ticks = route_lines(lines)
    assert [(x["trigger"], x["outcome"]) for x in ticks] == [(None, "bad-input")] * 2
    for tick in ticks:
        assert f"the tick message onceflow.route/0@{tick['offset']} was not applied" \
            in tick["reason"]
        assert "ONCEFLOW_MAX_CLOCK_SKEW" in tick["reason"]
    assert "1e+300" in ticks[0]["reason"]
    assert outcomes(lines, "old-1")[0] == "processed"
    assert_completed(lines, 3)
    assert worker.alive
