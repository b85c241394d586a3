"""What a worker counts as it goes (journal outcomes, service time, documents).

Kept apart from agents/metrics.py, which turns these counts into Prometheus families at
scrape time: this module is compiled with mypyc (setup.py, COMPILED_WORKER), because the
partition worker counts every journal record and every service run here, while the
registry side imports prometheus_client and subclasses its classes (it stays interpreted).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Final

from onceflow.journal import PROCESSED, JournalRecord

RECENT_JOURNAL: Final = 500
# Seconds; the upper bounds of the service latency histogram.  Typed as a tuple of any
# length: mypyc keeps a fixed-length tuple of floats unboxed and built a new Python tuple
# of it for every observation.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                                      2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """A cumulative-on-render histogram of one trigger's service latency."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        """Count one service call that took `seconds`."""
        # bisect.bisect_left, written out: the first bucket whose bound is not below
        # `seconds` (most services fall in the first few; a call to bisect compared the
        # Python floats through the generic protocol, about 750 instructions a run).
        index = 0
        for bound in LATENCY_BUCKETS:
            if not bound < seconds:
                break
            index += 1
        self.counts[index] += 1
        self.total += seconds
        self.count += 1


class Metrics:
    """Counters of one worker since it started."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.ingress: Counter[tuple[str, str]] = Counter()
        # The newest journal records this worker wrote (the console's live tail).
        self.recent: deque[JournalRecord] = deque(maxlen=RECENT_JOURNAL)
        self.latency: dict[str, Histogram] = {}
        self.batches = 0
        self.documents = 0
        # Gaps in the offsets of a fetch of onceflow's topics (transport.py), by topic and
        # what was done: "read-again" (a fetch made again) or "taken" (committed past).
        self.fetch_gaps: Counter[tuple[str, str]] = Counter()
        # Records the worker itself failed on (kept on the dead-letter topic), by topic:
        # never a publisher's bad input, so counted apart from `ingress`.
        self.internal_failures: Counter[str] = Counter()
        # (topic, partition, offset) of the records being rejected right now: their
        # journal record is an internal failure, not ingress.
        self.rejecting: set[tuple[str, int, int]] = set()
        # Unix seconds when this worker last journaled `processed`, by trigger.
        self.last_processed: dict[str, float] = {}

    def count_journal(self, records: Sequence[JournalRecord]) -> None:
        """Count journal records by trigger and outcome (ingress ones by topic)."""
        ingress = self.ingress
        self.recent.extend(records)
        processed: set[str] = set()
        # Counted in a plain dict first, then added to the Counter once a key: a Counter
        # (a dict subclass) takes mypyc's generic item path, twice a record.
        counted: dict[tuple[str, str], int] = {}
        for record in records:
            trigger = record.trigger
            if trigger is None:
                if self.rejecting and (record.topic, record.partition,
                                       record.offset) in self.rejecting:
                    self.internal_failures[record.topic or ""] += 1
                else:
                    ingress[(record.topic or "", record.outcome)] += 1
            else:
                outcome = record.outcome
                key = (trigger, outcome)
                counted[key] = counted.get(key, 0) + 1
                if outcome == PROCESSED:
                    processed.add(trigger)
        outcomes = self.outcomes
        for key, count in counted.items():
            outcomes[key] += count
        if processed:
            now = self._clock()
            for trigger in processed:
                self.last_processed[trigger] = now

    def observe_service(self, trigger: str, seconds: float) -> None:
        """Count one service run."""
        histogram = self.latency.get(trigger)
        if histogram is None:
            histogram = self.latency[trigger] = Histogram()
        histogram.observe(seconds)

    def by_trigger(self, trigger: str) -> dict[str, int]:
        """Outcome counts of one trigger."""
        return {outcome: n for (name, outcome), n in sorted(self.outcomes.items())
                if name == trigger}
