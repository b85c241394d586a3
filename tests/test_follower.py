"""TopicFollower reads a partition again from the first offset a fetch skipped."""

from __future__ import annotations

from typing import Any, NamedTuple

from onceflow.app.kafka import up_to_gap


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
