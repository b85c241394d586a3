"""The readers of onceflow's topics read a partition again from the first offset a fetch
skipped (GaplessReads: TopicFollower, `onceflow journal`, the console's output tail)."""

from __future__ import annotations

from typing import Any, NamedTuple

from onceflow.agents.gaps import GAP_REFETCHES, GaplessReads, up_to_gap


class Rec(NamedTuple):
    offset: int


def offsets(records: list[Any]) -> list[int]:
    return [r.offset for r in records]


def test_contiguous_records_are_all_taken() -> None:
    kept, gap = up_to_gap([Rec(5), Rec(6), Rec(7)], 5)
    assert offsets(kept) == [5, 6, 7] and gap is None


def test_the_first_fetch_of_a_partition_takes_its_first_offset() -> None:
    kept, gap = up_to_gap([Rec(40), Rec(41)], None)
    assert offsets(kept) == [40, 41] and gap is None


def test_records_after_a_gap_are_left_for_the_next_fetch() -> None:
    # tansu answered with the batch at 16.. while the one at 12..15 was not readable yet.
    kept, gap = up_to_gap([Rec(10), Rec(11), Rec(16), Rec(17)], 10)
    assert offsets(kept) == [10, 11] and gap == 12


def test_a_fetch_that_starts_past_the_expected_offset_takes_nothing() -> None:
    kept, gap = up_to_gap([Rec(16), Rec(17)], 12)
    assert kept == [] and gap == 12


class Seeks:
    """Stands for the consumer: notes where each partition is read again from."""

    def __init__(self) -> None:
        self.seeks: list[tuple[str, int]] = []

    def seek(self, tp: str, offset: int) -> None:
        self.seeks.append((tp, offset))


def test_a_skipped_batch_is_read_again_and_then_taken() -> None:
    consumer = Seeks()
    reads = GaplessReads(consumer)  # type: ignore[arg-type]
    first = reads.take({"p0": [Rec(0), Rec(1)], "p1": [Rec(0)]})
    assert {tp: offsets(r) for tp, r in first.items()} == {"p0": [0, 1], "p1": [0]}
    # p0's batch at 2..3 was not readable yet: the one at 4.. came first.
    second = reads.take({"p0": [Rec(4), Rec(5)], "p1": [Rec(1)]})
    assert {tp: offsets(r) for tp, r in second.items()} == {"p1": [1]}
    assert consumer.seeks == [("p0", 2)]
    third = reads.take({"p0": [Rec(2), Rec(3), Rec(4), Rec(5)]})
    assert offsets(third["p0"]) == [2, 3, 4, 5] and consumer.seeks == [("p0", 2)]


def test_a_gap_the_broker_keeps_showing_is_taken_as_real() -> None:
    consumer = Seeks()
    reads = GaplessReads(consumer)  # type: ignore[arg-type]
    reads.take({"p0": [Rec(0)]})
    for _ in range(GAP_REFETCHES):
        assert reads.take({"p0": [Rec(3)]}) == {}
    assert offsets(reads.take({"p0": [Rec(3)]})["p0"]) == [3]
    assert consumer.seeks == [("p0", 1)] * GAP_REFETCHES
