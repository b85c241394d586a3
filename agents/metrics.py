"""What a worker counts (journal outcomes, service time, documents); its registry."""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from onceflow import __version__
from onceflow.journal import JournalRecord
from prometheus_client import CollectorRegistry, Info, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

RECENT_JOURNAL = 500
# Seconds; the upper bounds of the service latency histogram.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0)


class Histogram:
    """A cumulative-on-render histogram of one trigger's service latency."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        """Count one service call that took `seconds`."""
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1


class Metrics:
    """Counters of one worker since it started."""

    def __init__(self) -> None:
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

    def count_journal(self, records: Sequence[JournalRecord]) -> None:
        """Count journal records by trigger and outcome (ingress ones by topic)."""
        outcomes = self.outcomes
        ingress = self.ingress
        self.recent.extend(records)
        for record in records:
            if record.trigger is None:
                ingress[(record.topic or "", record.outcome)] += 1
            else:
                outcomes[(record.trigger, record.outcome)] += 1

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


@dataclass(frozen=True, slots=True)
class Gauges:
    """What a worker reads at scrape time (per trigger, or per topic-partition for lag)."""

    open_joins: dict[str, int]
    history_entries: dict[str, int]
    lag: dict[tuple[str, int], int]
    suspended: dict[str, bool]


class WorkerCollector(Collector):
    """The worker's counters as Prometheus metric families, read at scrape time.

    The hot path only bumps plain counters (Metrics); this turns them into families when
    Prometheus asks, with the gauges `read()` returns at that moment.
    """

    def __init__(self, metrics: Metrics, read: Callable[[], Gauges]) -> None:
        self._metrics = metrics
        self._read = read

    def describe(self) -> list[Metric]:
        """No families up front: they are known at scrape time."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every onceflow family, with current values."""
        metrics = self._metrics
        records = CounterMetricFamily(
            "onceflow_journal_records", "Journal records of triggers, by trigger and outcome.",
            labels=["trigger", "outcome"])
        ingress = CounterMetricFamily(
            "onceflow_ingress_records",
            "Journal records of the ingress (before any trigger), by input topic and outcome.",
            labels=["topic", "outcome"])
        for (trigger, outcome), n in sorted(metrics.outcomes.items()):
            records.add_metric([trigger, outcome], n)
        for (topic, outcome), n in sorted(metrics.ingress.items()):
            ingress.add_metric([topic, outcome], n)
        yield records
        yield ingress
        latency = HistogramMetricFamily(
            "onceflow_service_seconds", "Service run time, retries included.",
            labels=["trigger"], unit="seconds")
        bounds = [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]
        for trigger, histogram in sorted(metrics.latency.items()):
            running = 0
            buckets = []
            for bound, n in zip(bounds, histogram.counts, strict=True):
                running += n
                buckets.append((bound, running))
            latency.add_metric([trigger], buckets, histogram.total)
        yield latency
        documents = CounterMetricFamily(
            "onceflow_documents", "Documents taken in from input topics by this worker "
            "(clock ticks and other control messages are not documents).")
        documents.add_metric([], metrics.documents)
        yield documents
        batches = CounterMetricFamily(
            "onceflow_batches", "Fetched record batches handled by this worker.")
        batches.add_metric([], metrics.batches)
        yield batches
        gaps = CounterMetricFamily(
            "onceflow_fetch_gaps", "Gaps in the offsets of fetched records: read again "
            "(a fetch made again from the first offset skipped) or taken as real (committed "
            "past), by topic.", labels=["topic", "action"])
        for (topic, action), n in sorted(metrics.fetch_gaps.items()):
            gaps.add_metric([topic, action], n)
        yield gaps
        gauges = self._read()
        for name, help_text, values in (
                ("onceflow_open_joins", "Open joins on this worker's partitions.",
                 gauges.open_joins),
                ("onceflow_history_entries", "History entries on this worker's partitions.",
                 gauges.history_entries),
                ("onceflow_trigger_suspended", "1 when the trigger is suspended.",
                 {n: int(flag) for n, flag in gauges.suspended.items()})):
            family = GaugeMetricFamily(name, help_text, labels=["trigger"])
            for trigger, value in sorted(values.items()):
                family.add_metric([trigger], value)
            yield family
        lag = GaugeMetricFamily(
            "onceflow_consumer_lag_records",
            "Records between the last committed offset and the end of each assigned "
            "partition.", labels=["topic", "partition"])
        for (topic, partition), value in sorted(gauges.lag.items()):
            lag.add_metric([topic, str(partition)], value)
        yield lag


def worker_registry(metrics: Metrics, read: Callable[[], Gauges]) -> CollectorRegistry:
    """A registry of one worker: its families, process and platform facts, build info."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(metrics, read))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    Info("onceflow_build", "The onceflow version this worker runs.",
         registry=registry).info({"version": __version__})
    return registry


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """(body, content type): OpenMetrics when the Accept header asks for it, else text."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
