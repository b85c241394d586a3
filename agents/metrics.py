"""What a worker counts: journal outcomes, service latency, and their Prometheus text form."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable

from onceflow.journal import JournalRecord

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
        self.latency: dict[str, Histogram] = {}
        self.batches = 0
        self.documents = 0

    def count_journal(self, records: Iterable[JournalRecord]) -> None:
        """Count journal records by trigger ("" at ingress) and outcome."""
        outcomes = self.outcomes
        for record in records:
            outcomes[(record.trigger or "", record.outcome)] += 1

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


def _labels(**values: object) -> str:
    parts = []
    for name, value in values.items():
        text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{name}="{text}"')
    return "{" + ",".join(parts) + "}"


def prometheus_text(metrics: Metrics, *, open_joins: dict[str, int],
                    history_entries: dict[str, int], lag: dict[tuple[str, int], int],
                    suspended: dict[str, bool]) -> str:
    """The Prometheus text exposition of a worker's metrics."""
    lines = [
        "# HELP onceflow_journal_records_total Journal records written, by trigger and outcome.",
        "# TYPE onceflow_journal_records_total counter",
    ]
    for (trigger, outcome), n in sorted(metrics.outcomes.items()):
        lines.append(f"onceflow_journal_records_total{_labels(trigger=trigger, outcome=outcome)}"
                     f" {n}")
    lines += [
        "# HELP onceflow_service_seconds Service run time, retries included.",
        "# TYPE onceflow_service_seconds histogram",
    ]
    for trigger, histogram in sorted(metrics.latency.items()):
        running = 0
        for bound, n in zip((*LATENCY_BUCKETS, float("inf")), histogram.counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f"onceflow_service_seconds_bucket{_labels(trigger=trigger, le=le)} "
                         f"{running}")
        lines.append(f"onceflow_service_seconds_sum{_labels(trigger=trigger)} "
                     f"{histogram.total:.6f}")
        lines.append(f"onceflow_service_seconds_count{_labels(trigger=trigger)} "
                     f"{histogram.count}")
    gauges = [
        ("onceflow_open_joins", "Open joins on this worker's partitions.", open_joins),
        ("onceflow_history_entries", "History entries on this worker's partitions.",
         history_entries),
        ("onceflow_trigger_suspended", "1 when the trigger is suspended.",
         {name: int(flag) for name, flag in suspended.items()}),
    ]
    for name, help_text, values in gauges:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for trigger, value in sorted(values.items()):
            lines.append(f"{name}{_labels(trigger=trigger)} {value}")
    lines += [
        "# HELP onceflow_consumer_lag Records behind the end of each assigned partition.",
        "# TYPE onceflow_consumer_lag gauge",
    ]
    for (topic, partition), value in sorted(lag.items()):
        lines.append(f"onceflow_consumer_lag{_labels(topic=topic, partition=partition)} {value}")
    lines += [
        "# HELP onceflow_documents_total Records taken in by this worker.",
        "# TYPE onceflow_documents_total counter",
        f"onceflow_documents_total {metrics.documents}",
    ]
    return "\n".join(lines) + "\n"
