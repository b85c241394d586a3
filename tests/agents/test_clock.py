"""Partition time and the wall clock (ONCEFLOW_MAX_CLOCK_SKEW), with the clock set by hand.

The worker test (tests/integration/test_clock.py) sends a record from year 9999 and
ticks from the future through a real worker; these cover what a single worker cannot
show: a routed document stamped ahead by another worker's clock, and a stored time from
before the limit.
"""

from __future__ import annotations

from typing import Any

import orjson
from onceflow.agents import wire
from onceflow.agents.wire import Delivery
from onceflow.envelope import Document, record_time
from onceflow.triggers import parse_triggers

from .cluster import LocalCluster

NOW = 1_800_000_000.0  # the wall clock, in seconds
NOW_MS = record_time(NOW)  # partition time is in ms
PAIR = {"name": "pair", "service": "scripted",
        "types": ["a", "b"], "condition": "all", "join_timeout": "10m"}


def cluster(**options: Any) -> LocalCluster:
    c = LocalCluster(parse_triggers({"trigger": [PAIR]}), partitions=1, **options)
    c.runtime.wall_clock = lambda: NOW
    return c


def member(kind: str, offset: int, ts: float, uuid: str, activation: str) -> Delivery:
    """An input record stamped `ts` seconds (Kafka's record time is in ms)."""
    return Delivery(kind, 0, offset, record_time(ts), None,
                    orjson.dumps({"uuid": uuid, "activation": activation}), [])


def outcomes(c: LocalCluster) -> list[tuple[str, str]]:
    return [(line["outcome"], line["identity"]) for line in c.journal()]


async def test_a_routed_document_from_a_clock_far_ahead_moves_time_only_to_the_limit() -> None:
    c = cluster()
    ahead = Document("a", "a-0", "x", {"uuid": "a-0", "activation": "x"}, NOW_MS + 10**12, "a", 0,
                     0, "a/0@0", 1)
    await c.runtime.handle([Delivery(c.names.route, 0, 0, NOW_MS, b"x",
                                     wire.doc_message(["pair"], ahead), [])])
    worker = c.runtime.worker(0)
    assert worker.now == NOW_MS + 300_000
    await c.runtime.handle([member("a", 0, NOW, "a-1", "y"), member("b", 0, NOW + 1, "b-1", "y")])
    assert outcomes(c) == [("join-pending", "a-0"), ("join-pending", "a-1"),
                           ("processed", "a-1"), ("processed", "b-1")]


async def test_a_stored_time_beyond_the_limit_starts_again_from_the_clock() -> None:
    before = cluster(max_clock_skew=1e12)  # as a worker without the limit did
    await before.runtime.handle([member("a", 0, 253_402_300_799.0, "a-0", "x")])
    assert before.runtime.worker(0).now == 253_402_300_799_000

    c = cluster()
    c.state = before.state
    worker = c.runtime.worker(0)
    assert worker.now == NOW_MS
    await c.runtime.handle([member("a", 1, NOW, "a-1", "y"), member("b", 0, NOW + 1, "b-1", "y")])
    assert outcomes(c) == [("join-pending", "a-1"), ("processed", "a-1"), ("processed", "b-1")]
    assert worker.control["time"] == NOW_MS + 1000  # stored again, within the limit


async def test_a_partition_time_stored_in_seconds_by_an_earlier_version_is_read_in_ms() -> None:
    before = cluster()
    await before.runtime.handle([member("a", 0, NOW - 100, "a-0", "x")])
    # An earlier version stored partition time in seconds, as a float.
    before.state["control"][0].data[b"time"] = orjson.dumps(NOW - 50.0)
    c = cluster()
    c.state = before.state
    assert c.runtime.worker(0).now == NOW_MS - 50_000


async def test_input_records_and_ticks_beyond_the_limit_are_bad_input() -> None:
    c = cluster(max_clock_skew=60)
    await c.runtime.handle([member("a", 0, NOW + 61, "a-0", "x"),
                            Delivery(c.names.route, 0, 0, NOW_MS, b"tick",
                                     wire.control_message(wire.TICK, ts=NOW + 61), []),
                            member("a", 1, NOW + 60, "a-1", "y")])
    lines = c.journal()
    assert [(x["outcome"], x["identity"]) for x in lines] == [
        ("bad-input", "a-0"), ("bad-input", "onceflow.route/0@0"), ("join-pending", "a-1")]
    assert "61 s ahead of this worker's clock, more than ONCEFLOW_MAX_CLOCK_SKEW (60 s)" \
        in lines[0]["reason"]
    assert lines[1]["reason"].startswith("the tick message onceflow.route/0@0 was not applied")
    assert c.runtime.worker(0).now == NOW_MS + 60_000
    letters = [orjson.loads(r.value) for r in c.broker.records(c.names.dead_letter)]
    assert [x["value"] for x in letters][:1] == [{"uuid": "a-0", "activation": "x"}]
