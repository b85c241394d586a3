"""Reading onceflow's own topics without skipping a batch the broker has not shown yet.

The embedded broker (tansu) can answer a fetch at the end of a partition with a batch
written after one it has not made readable yet, when several producers write to the
partition at once; a reader that moved on never sees the earlier batch, although its
producer had the acknowledgement (docs/operations.md, broker workarounds).  onceflow's
journal, acks and repartition topics have no gaps in their offsets on any broker, so a gap
there is read again before it is taken as real.  The readers of the commands (app/kafka.py,
app/journal_reader.py) take their fetches through `GaplessReads.take`; the worker's
consumer (transport.py) keeps its own loop and asks `GaplessReads.read_again`.
"""

from __future__ import annotations

from typing import Any, Protocol


class Seeks(Protocol):
    """A consumer that can be sent back to an offset of a partition."""

    def seek(self, partition: Any, offset: int) -> None:
        """Read `partition` next from `offset`."""


# How many fetches a reader makes again at a gap in a partition's offsets before it takes
# the gap as real (see GaplessReads); a fetch that has records returns at once.
GAP_REFETCHES = 200
# ... for topics that may have real gaps (an input topic: compacted, or written with
# transactions), and only at the partition's end, where the embedded broker's fault shows.
TAIL_GAP_REFETCHES = 3


def up_to_gap(records: list[Any], expected: int | None) -> tuple[list[Any], int | None]:
    """The records of one partition's fetch before the first gap in their offsets.

    `expected`: the offset that should come next (None: any).  Returns the records to take
    and, when a record lay beyond the expected offset, that offset (to read again from).
    """
    for index, record in enumerate(records):
        if expected is not None and record.offset > expected:
            return records[:index], expected
        expected = record.offset + 1
    return records, None


class GaplessReads:
    """What a reader takes of each fetch of topics that have no gaps in their offsets.

    onceflow's journal, acks and repartition topics have none on any broker.  The embedded
    broker (tansu) can answer a fetch at the end of a partition with a batch written after
    one it has not made readable yet, and a reader that moved on never saw the earlier
    batch (docs/operations.md, broker workarounds).  So a partition's records are taken up
    to the first offset a fetch skipped, and the partition is read again from there; a gap
    still there after GAP_REFETCHES fetches is taken as real.

    `expected` holds the offset each partition's next record should have; a reader that
    seeks elsewhere says so (`moved`).  The worker's consumer keeps its own loop and asks
    `read_again` (agents/transport.py).
    """

    def __init__(self, consumer: Seeks | None = None) -> None:
        self._consumer = consumer
        self.expected: dict[Any, int] = {}  # the next offset of each partition
        self._tries: dict[Any, tuple[int, int]] = {}  # partition: (gap, fetches made again)

    def read_again(self, tp: Any, gap: int, refetches: int = GAP_REFETCHES) -> bool:
        """Whether to read `tp` again from `gap`, which a fetch skipped (False: it is real)."""
        last = self._tries.get(tp)
        tries = last[1] + 1 if last is not None and last[0] == gap else 1
        if tries > refetches:
            self._tries.pop(tp, None)
            return False
        self._tries[tp] = (gap, tries)
        return True

    def moved(self, tp: Any, offset: int | None) -> None:
        """The reader sought `tp` to `offset` (None: to where it does not know)."""
        self._tries.pop(tp, None)
        if offset is None:
            self.expected.pop(tp, None)
        else:
            self.expected[tp] = offset

    def take(self, batch: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
        """The records of a fetch to take, by partition (none may be left)."""
        assert self._consumer is not None
        taken: dict[Any, list[Any]] = {}
        for tp, items in batch.items():
            kept, gap = up_to_gap(items, self.expected.get(tp))
            if gap is not None:
                if self.read_again(tp, gap):
                    self._consumer.seek(tp, gap)
                else:
                    kept = items  # the broker says so every time
            if kept:
                self.expected[tp] = kept[-1].offset + 1
                taken[tp] = kept
        return taken
