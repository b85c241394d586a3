"""What a worker counts (journal outcomes, service time, documents); its registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from onceflow import __version__
from prometheus_client import CollectorRegistry, Info, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

# The counters themselves are compiled (agents/counters.py); named here as before.
from .counters import LATENCY_BUCKETS, RECENT_JOURNAL, Histogram, Metrics

__all__ = ["LATENCY_BUCKETS", "RECENT_JOURNAL", "Gauges", "Histogram", "Metrics",
           "WorkerCollector", "exposition", "worker_registry"]


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
