"""The worker's consumer reads a gap in the offsets of onceflow.route again before it takes it
as real, and a gap of an input topic only at the partition's end (agents/transport.py,
agents/gaps.py).  The consumer is Faust's, built by the worker's app; only the broker is
left out: each test hands `_take_fetch` the fetches and notes where the consumer seeks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from faust.types import TP
from onceflow.agents.faust_app import OnceflowApp
from onceflow.agents.gaps import GAP_REFETCHES, TAIL_GAP_REFETCHES
from onceflow.agents.metrics import Metrics
from onceflow.agents.wire import Names

ROUTE = "onceflow.route"
INPUT = "orders"
ROUTE_TP = TP(ROUTE, 0)
INPUT_TP = TP(INPUT, 0)


class Rec(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int = 1_700_000_000_000
    key: bytes | None = None
    value: bytes = b"{}"
    headers: tuple[Any, ...] = ()


class Broker:
    """Stands for the consumer thread: hands out fetches, notes seeks and highwaters."""

    def __init__(self) -> None:
        self.seeks: list[tuple[TP, int]] = []
        self.highwaters: dict[TP, int] = {}
        self.committed: dict[TP, int] = {}


@pytest.fixture
def consumer() -> Any:
    app = OnceflowApp("gaps", broker="kafka://127.0.0.1:9", store="memory://")
    for name in (INPUT, ROUTE):
        app.topics.add(app.topic(name, value_type=bytes, key_type=bytes))
    app.topics._acking_topics.update({INPUT, ROUTE})  # as once the worker has subscribed
    app.runtime = SimpleNamespace(metrics=Metrics(), names=Names(""))  # what it counts in
    consumer = app.consumer
    consumer.route_topics = frozenset({ROUTE})
    broker = Broker()
    consumer._thread.seek = lambda tp, offset: broker.seeks.append((tp, offset))

    async def seek_to_committed() -> dict[TP, int]:
        return dict(broker.committed)

    consumer._thread.seek_to_committed = seek_to_committed
    consumer.highwater = lambda tp: broker.highwaters.get(tp, 1_000_000)
    consumer.broker = broker
    return consumer


def records(tp: TP, *offsets: int) -> list[Rec]:
    return [Rec(tp.topic, tp.partition, offset) for offset in offsets]


async def fetch(consumer: Any, fetched: dict[TP, list[Rec]]) -> list[tuple[str, int]]:
    """Hand the consumer one fetch; the records it delivers, as (topic, offset)."""
    async def wait_next_records(timeout: float) -> tuple[dict[TP, list[Rec]], None]:
        return fetched, None

    consumer._wait_next_records = wait_next_records
    batch: list[Any] = []
    await consumer._take_fetch(frozenset({INPUT, ROUTE}), batch, {})
    return [(d.topic, d.offset) for d in batch]


def gap_of(consumer: Any, tp: TP) -> list[tuple[int, int]]:
    """The offsets Faust may commit past unacknowledged, as [begin, end) ranges."""
    return sorted((i.begin, i.end) for i in consumer._gap[tp])


async def test_a_skipped_route_batch_is_read_again_and_delivered_in_order(consumer: Any) -> None:
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 0, 1)}) == [(ROUTE, 0), (ROUTE, 1)]
    # The batch at 2..3 was not readable yet; the one at 4 came first.
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 4, 5)}) == []
    assert consumer.broker.seeks == [(ROUTE_TP, 2)]
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 2, 3, 4, 5)}) == [
        (ROUTE, 2), (ROUTE, 3), (ROUTE, 4), (ROUTE, 5)]
    assert consumer.broker.seeks == [(ROUTE_TP, 2)] and gap_of(consumer, ROUTE_TP) == []


async def test_records_before_a_gap_in_the_same_fetch_are_delivered(consumer: Any) -> None:
    fetched = {ROUTE_TP: records(ROUTE_TP, 0, 1, 2, 6, 7), INPUT_TP: records(INPUT_TP, 0, 1)}
    delivered = await fetch(consumer, fetched)
    assert sorted(delivered) == [(ROUTE, 0), (ROUTE, 1), (ROUTE, 2), (INPUT, 0), (INPUT, 1)]
    assert consumer.broker.seeks == [(ROUTE_TP, 3)]


async def test_a_route_gap_the_broker_keeps_showing_is_taken_as_real(consumer: Any) -> None:
    await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 0)})
    for _ in range(GAP_REFETCHES):
        assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 3, 4)}) == []
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 3, 4)}) == [(ROUTE, 3), (ROUTE, 4)]
    assert consumer.broker.seeks == [(ROUTE_TP, 1)] * GAP_REFETCHES
    assert gap_of(consumer, ROUTE_TP) == [(1, 3)]  # the offsets are committed past
    assert consumer.app.runtime.metrics.fetch_gaps == {
        (ROUTE, "read-again"): GAP_REFETCHES, (ROUTE, "taken"): 1}


async def test_an_input_gap_behind_the_end_is_taken_at_once(consumer: Any) -> None:
    # A compacted input topic has gaps everywhere; away from its end they are real.
    consumer.broker.highwaters[INPUT_TP] = 500
    await fetch(consumer, {INPUT_TP: records(INPUT_TP, 0, 1)})
    assert await fetch(consumer, {INPUT_TP: records(INPUT_TP, 5, 6, 9)}) == [
        (INPUT, 5), (INPUT, 6), (INPUT, 9)]
    assert consumer.broker.seeks == [] and gap_of(consumer, INPUT_TP) == [(2, 5), (7, 9)]
    assert consumer.app.runtime.metrics.fetch_gaps == {(INPUT, "taken"): 2}


async def test_an_input_gap_at_the_end_is_read_again_a_few_times(consumer: Any) -> None:
    consumer.broker.highwaters[INPUT_TP] = 10
    await fetch(consumer, {INPUT_TP: records(INPUT_TP, 0, 1)})
    for _ in range(TAIL_GAP_REFETCHES):
        assert await fetch(consumer, {INPUT_TP: records(INPUT_TP, 8, 9)}) == []
    assert await fetch(consumer, {INPUT_TP: records(INPUT_TP, 8, 9)}) == [(INPUT, 8), (INPUT, 9)]
    assert consumer.broker.seeks == [(INPUT_TP, 2)] * TAIL_GAP_REFETCHES
    assert gap_of(consumer, INPUT_TP) == [(2, 8)]


async def test_a_seek_moves_where_the_next_record_is_expected(consumer: Any) -> None:
    await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 0, 1, 2, 3)})
    await consumer.seek(ROUTE_TP, 2)  # records given back at a rebalance
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 2, 3)}) == [(ROUTE, 2), (ROUTE, 3)]
    await consumer.seek(ROUTE_TP, 4)
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 6)}) == []
    assert consumer.broker.seeks[-1] == (ROUTE_TP, 4)


async def test_after_a_seek_to_the_committed_offsets_a_gap_is_judged_from_them(
        consumer: Any) -> None:
    await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 0, 1, 2)})
    consumer.broker.committed = {ROUTE_TP: 1}
    await consumer.perform_seek()  # Faust's, after recovery and when the flow stops
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 3)}) == []
    assert consumer.broker.seeks == [(ROUTE_TP, 1)]
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 1, 2, 3)}) == [
        (ROUTE, 1), (ROUTE, 2), (ROUTE, 3)]


async def test_the_first_records_of_a_partition_after_a_revoke_are_taken(consumer: Any) -> None:
    await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 0, 1)})
    consumer._gapless.moved(ROUTE_TP, None)  # what a revoke or an assignment does
    assert await fetch(consumer, {ROUTE_TP: records(ROUTE_TP, 40, 41)}) == [
        (ROUTE, 40), (ROUTE, 41)]
    assert consumer.broker.seeks == []


async def test_an_empty_partition_in_a_fetch_is_passed_over(consumer: Any) -> None:
    assert await fetch(consumer, {ROUTE_TP: [], INPUT_TP: records(INPUT_TP, 0)}) == [(INPUT, 0)]
    assert consumer.broker.seeks == []


# Records a fetch returns and the consumer drops are read again: every record a fetch returned
# moved the partition's position past it, and aiokafka's seek to the committed offsets leaves
# a partition alone when it has no committed offset or has 0, so a dropped record of such a
# partition was read by nobody (issue 28: records skipped by a partition's next owner).

async def stopped_flow_fetch(consumer: Any, fetched: dict[TP, list[Rec]]) -> list[tuple[str, int]]:
    """A fetch that arrives while the flow is stopped (recovery after a rebalance)."""
    consumer.flow_active = False
    try:
        return await fetch(consumer, fetched)
    finally:
        consumer.flow_active = True


async def test_a_fetch_dropped_while_the_flow_is_stopped_is_read_again_without_commit(
        consumer: Any) -> None:
    assert await stopped_flow_fetch(consumer, {INPUT_TP: records(INPUT_TP, 0, 1, 2)}) == []
    assert consumer.broker.seeks == [(INPUT_TP, 0)]
    assert await fetch(consumer, {INPUT_TP: records(INPUT_TP, 0, 1, 2)}) == [
        (INPUT, 0), (INPUT, 1), (INPUT, 2)]


async def test_a_fetch_dropped_while_the_flow_is_stopped_is_read_again_after_commit_0(
        consumer: Any) -> None:
    assert await fetch(consumer, {INPUT_TP: records(INPUT_TP, 0, 1, 2)}) == [
        (INPUT, 0), (INPUT, 1), (INPUT, 2)]
    consumer.broker.committed = {INPUT_TP: 0, ROUTE_TP: -1001}
    dropped = {INPUT_TP: records(INPUT_TP, 3, 4), ROUTE_TP: records(ROUTE_TP, 0)}
    assert await stopped_flow_fetch(consumer, dropped) == []
    assert sorted(consumer.broker.seeks) == [(ROUTE_TP, 0), (INPUT_TP, 3)]
    assert sorted(await fetch(consumer, dropped)) == sorted([(INPUT, 3), (INPUT, 4), (ROUTE, 0)])


async def test_a_partition_with_a_committed_offset_is_left_to_the_seek_to_it(
        consumer: Any) -> None:
    consumer.broker.committed = {INPUT_TP: 5}  # aiokafka seeks there itself
    assert await stopped_flow_fetch(consumer, {INPUT_TP: records(INPUT_TP, 7, 8)}) == []
    assert consumer.broker.seeks == []


def rebalance_after(consumer: Any, taken: int, *, stop_flow: bool = False) -> None:
    """Make a rebalance start (a new generation, or the flow stopped) after `taken` records."""
    iterate = consumer.scheduler.iterate

    def iterate_then_rebalance(records: Any) -> Any:
        for n, item in enumerate(iterate(records)):
            if n == taken:
                if stop_flow:
                    consumer.flow_active = False
                else:
                    consumer.app.consumer_generation_id += 1
            yield item

    consumer.scheduler.iterate = iterate_then_rebalance


@pytest.mark.parametrize("stop_flow", [False, True])
async def test_the_rest_of_a_fetch_cut_by_a_rebalance_is_read_again(
        consumer: Any, stop_flow: bool) -> None:
    rebalance_after(consumer, 3, stop_flow=stop_flow)
    fetched = {INPUT_TP: records(INPUT_TP, 0, 1, 2, 3), ROUTE_TP: records(ROUTE_TP, 0, 1)}
    delivered = await fetch(consumer, fetched)
    assert len(delivered) == 3
    consumer.flow_active = True
    consumer.scheduler.iterate = type(consumer.scheduler).iterate.__get__(consumer.scheduler)
    taken = {tp: max((o for t, o in delivered if t == tp.topic), default=-1)
             for tp in fetched}
    assert sorted(consumer.broker.seeks) == sorted(
        (tp, taken[tp] + 1) for tp in fetched if taken[tp] + 1 <= fetched[tp][-1].offset)
    again = {tp: [r for r in rs if r.offset > taken[tp]] for tp, rs in fetched.items()}
    assert sorted(delivered + await fetch(consumer, again)) == sorted(
        (r.topic, r.offset) for rs in fetched.values() for r in rs)


async def test_records_of_a_partition_no_longer_active_are_read_again(consumer: Any) -> None:
    async def wait_next_records(timeout: float) -> tuple[dict[TP, list[Rec]], set[TP]]:
        return {INPUT_TP: records(INPUT_TP, 0, 1), ROUTE_TP: records(ROUTE_TP, 0)}, {ROUTE_TP}

    consumer._wait_next_records = wait_next_records
    batch: list[Any] = []
    await consumer._take_fetch(frozenset({INPUT, ROUTE}), batch, {})
    assert [(d.topic, d.offset) for d in batch] == [(ROUTE, 0)]
    assert consumer.broker.seeks == [(INPUT_TP, 0)]
