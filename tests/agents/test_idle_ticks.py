"""Wall-clock ticks move a partition's time only while its consumer has no lag (spec 4).

A worker that restarts after an outage has a backlog: a tick at wall-clock time before
the backlog is read would expire every open join whose members are still in it.  The
worker's timer (agents/faust_app.tick_idle_partitions) asks the consumer for each
partition's highwater and last offset read; here a fake consumer answers, and the ticks
go through the in-process cluster's repartition topic to the partition.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, NamedTuple

import orjson
from onceflow.agents.faust_app import tick_idle_partitions
from onceflow.agents.wire import Delivery
from onceflow.envelope import record_time
from onceflow.partition import caught_up
from onceflow.triggers import parse_triggers

from .cluster import LocalCluster

CONF = SimpleNamespace(broker_commit_interval=2.8)  # Faust's default, seconds
PAIR = {"name": "pair", "service": "scripted", "types": ["a", "b"], "join_timeout": "10m"}


class TP(NamedTuple):
    topic: str
    partition: int


class Consumer:
    """What the timer asks of the Kafka consumer: highwater and last offset read here,
    and the group's end and committed offsets of every input partition."""

    def __init__(self) -> None:
        self.ends: dict[TP, int | None] = {}
        self._read_offset: dict[TP, int] = {}
        self.group_ends: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self._thread = SimpleNamespace(group_committed=self._group_committed)

    def assignment(self) -> set[TP]:
        return set(self.ends)

    def highwater(self, tp: TP) -> int | None:
        return self.ends[tp]

    async def highwaters(self, *tps: Any) -> dict[Any, int]:
        return {tp: self.group_ends.get((tp.topic, tp.partition), 0) for tp in tps}

    async def _group_committed(self, tps: list[Any]) -> dict[tuple[str, int], int]:
        return {(tp.topic, tp.partition): self.committed[(tp.topic, tp.partition)]
                for tp in tps if (tp.topic, tp.partition) in self.committed}


def test_a_partition_is_caught_up_only_when_every_record_was_read() -> None:
    assert caught_up(0, None)  # an empty partition
    assert caught_up(5, 4)
    assert not caught_up(5, 3)  # one record not read yet
    assert not caught_up(5, None)
    assert not caught_up(None, 4)  # not fetched since assigned: nothing says it is idle


async def test_wall_clock_ticks_wait_until_the_backlog_is_read() -> None:
    c = LocalCluster(parse_triggers({"trigger": [PAIR]}), partitions=1)
    clock = [0.0]
    c.runtime.monotonic = lambda: clock[0]  # the timer's idle_after, on a clock by hand
    opened = record_time(time.time() - 3600)  # a join opened an hour ago (before an outage)
    await c.runtime.handle([Delivery("a", 0, 0, opened, None,
                                     orjson.dumps({"uuid": "a-1", "activation": "x"}), [])])
    worker = c.runtime.worker(0)
    consumer = Consumer()
    route = TP(c.names.route, 0)
    backlog = TP(c.names.topic("b"), 0)
    consumer.ends = {route: 0, backlog: 1}  # b-1, the join's other member, waits
    app = fake_app(consumer, route, route.topic, backlog.topic)
    options: Any = c.runtime.options
    clock[0] = worker.last_record_at + options.idle_after + 1  # idle for long enough

    await tick_idle_partitions(app, c.runtime, options)  # type: ignore[arg-type]
    await c.pump()
    assert worker.now == opened  # no tick: the join still waits for its backlog

    await c.runtime.handle([Delivery("b", 0, 0, opened + 1000, None,
                                     orjson.dumps({"uuid": "b-1", "activation": "x"}), [])])
    consumer._read_offset[backlog] = 0  # the backlog is read: caught up
    clock[0] += options.idle_after + 1
    await tick_idle_partitions(app, c.runtime, options)  # type: ignore[arg-type]
    await c.pump()
    assert worker.now is not None and worker.now > opened + 3_000_000  # the wall clock
    assert [(line["outcome"], line["identity"]) for line in c.journal()] == [
        ("join-pending", "a-1"), ("processed", "a-1"), ("processed", "b-1")]


async def test_no_tick_while_another_worker_has_a_backlog() -> None:
    """The partitions here are caught up, but an input partition another worker owns is
    not (its records feed this partition through the repartition topic): no tick."""
    c, clock, opened, owner, worker = await join_opened_an_hour_ago(0.0)
    consumer = Consumer()
    route = TP(c.names.route, owner)
    consumer.ends = {route: 0}  # nothing waits here
    elsewhere = (c.names.topic("b"), 1 - owner)  # another worker's, with b-1 unread
    consumer.group_ends = {elsewhere: 1}
    app = fake_app(consumer, route, route.topic)
    options: Any = c.runtime.options
    clock[0] = worker.last_record_at + options.idle_after + 1
    before = worker.now

    await tick_idle_partitions(app, c.runtime, options)  # type: ignore[arg-type]
    await c.pump()
    assert worker.now == before  # the join waits for b-1

    consumer.committed = {elsewhere: 1}  # that worker has read it
    await tick_idle_partitions(app, c.runtime, options)  # type: ignore[arg-type]
    await c.pump()
    assert worker.now is not None and worker.now > opened + 3_000_000


async def test_a_group_that_keeps_up_with_steady_traffic_still_ticks() -> None:
    """Records keep arriving on another partition and are committed a little later: the
    group has committed everything that was there a commit interval ago, so it is not a
    backlog, and the idle partition here gets its tick."""
    c, clock, opened, owner, worker = await join_opened_an_hour_ago(100.0)
    consumer = Consumer()
    route = TP(c.names.route, owner)
    consumer.ends = {route: 0}
    busy = (c.names.topic("b"), 1 - owner)
    app = fake_app(consumer, route, route.topic)
    options: Any = c.runtime.options
    clock[0] = worker.last_record_at + options.idle_after + 1
    before = worker.now
    for second in range(6):  # ten records a second arrive; commits trail by a second
        consumer.group_ends = {busy: 10 * (second + 1)}
        consumer.committed = {busy: 10 * second}
        await tick_idle_partitions(app, c.runtime, options)  # type: ignore[arg-type]
        await c.pump()
        if second < 3:  # no snapshot a commit interval old yet: strict
            assert worker.now == before
        clock[0] += 1
    assert worker.now is not None and worker.now > opened + 3_000_000


def fake_app(consumer: Consumer, route: TP, *topics: str) -> Any:
    """What tick_idle_partitions reads of the Faust app: one route partition assigned."""
    return SimpleNamespace(onceflow_producer=object(), consumer=consumer, conf=CONF,
                           assignor=SimpleNamespace(assigned_actives=lambda: {route}),
                           bulk_delivery=(frozenset(topics),))


async def join_opened_an_hour_ago(start: float) -> tuple[LocalCluster, list[float], int, int,
                                                          Any]:
    """Two partitions; a join of activation x opened an hour ago on one of them (its owner
    partition); the timer's monotonic clock by hand, from `start`."""
    c = LocalCluster(parse_triggers({"trigger": [PAIR]}), partitions=2)
    clock = [start]
    c.runtime.monotonic = lambda: clock[0]
    opened = record_time(time.time() - 3600)
    await c.runtime.handle([Delivery("a", 0, 0, opened, None,
                                     orjson.dumps({"uuid": "a-1", "activation": "x"}), [])])
    await c.pump()
    (owner,) = [p for p, w in c.runtime.workers.items() if len(w.processors["pair"].joins)]
    return c, clock, opened, owner, c.runtime.worker(owner)
