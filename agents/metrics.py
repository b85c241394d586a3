"""What a worker counts (journal outcomes, service time, documents); its registry."""

from __future__ import annotations

import bisect
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from onceflow import __version__
from onceflow.journal import PROCESSED, JournalRecord
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
        outcomes = self.outcomes
        ingress = self.ingress
        self.recent.extend(records)
        processed: set[str] = set()
        for record in records:
            if record.trigger is None:
                if self.rejecting and (record.topic, record.partition,
                                       record.offset) in self.rejecting:
                    self.internal_failures[record.topic or ""] += 1
                else:
                    ingress[(record.topic or "", record.outcome)] += 1
            else:
                outcomes[(record.trigger, record.outcome)] += 1
                if record.outcome == PROCESSED:
                    processed.add(record.trigger)
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


@dataclass(frozen=True, slots=True)
class Gauges:
    """What a worker reads at scrape time (per trigger, or per topic-partition for lag)."""

    open_joins: dict[str, int]
    history_entries: dict[str, int]
    lag: dict[tuple[str, int], int]
    suspended: dict[str, bool]
    # Documents held by suspended triggers, by trigger.
    held: dict[str, int] = field(default_factory=dict)
    # Whether the worker is processing its partitions (/readyz); None: not known.
    ready: bool | None = None
    # The topics whose records reach each trigger (real names): its input topics and the
    # repartition topic, to relate lag to triggers in queries.
    inputs: dict[str, tuple[str, ...]] = field(default_factory=dict)


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
        failures = CounterMetricFamily(
            "onceflow_internal_failures", "Records this worker failed on itself (not a "
            "publisher's bad input): journaled bad-input with the failure as the reason "
            "and kept on the dead-letter topic, by topic.", labels=["topic"])
        for topic, n in sorted(metrics.internal_failures.items()):
            failures.add_metric([topic], n)
        yield failures
        last = GaugeMetricFamily(
            "onceflow_last_processed_timestamp_seconds", "Unix time when this worker last "
            "journaled a processed document of the trigger (absent: none since it "
            "started).", labels=["trigger"])
        for trigger, when in sorted(metrics.last_processed.items()):
            last.add_metric([trigger], when)
        yield last
        gauges = self._read()
        for name, help_text, values in (
                ("onceflow_open_joins", "Open joins on this worker's partitions.",
                 gauges.open_joins),
                ("onceflow_history_entries", "History entries on this worker's partitions.",
                 gauges.history_entries),
                ("onceflow_trigger_suspended", "1 when the trigger is suspended.",
                 {n: int(flag) for n, flag in gauges.suspended.items()}),
                ("onceflow_held_documents", "Documents held by the suspended trigger on "
                 "this worker's partitions (decided when it resumes).", gauges.held)):
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
        inputs = GaugeMetricFamily(
            "onceflow_trigger_input_info", "Always 1: a topic whose records reach the "
            "trigger (its input topics and the repartition topic), to join lag to triggers.",
            labels=["trigger", "topic"])
        for trigger, topics in sorted(gauges.inputs.items()):
            for topic in topics:
                inputs.add_metric([trigger, topic], 1)
        yield inputs
        if gauges.ready is not None:
            ready = GaugeMetricFamily(
                "onceflow_worker_ready", "1 while the worker processes its partitions "
                "(/readyz answers 200), 0 otherwise (a rebalance, a recovery, a stuck "
                "consumer).")
            ready.add_metric([], int(gauges.ready))
            yield ready


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
