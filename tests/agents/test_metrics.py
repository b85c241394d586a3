"""What a worker counts for operators: its own failures apart from publishers' bad input,
documents held by suspended triggers, when each trigger last processed a document, and
whether the worker is processing; read back as Prometheus text."""

from __future__ import annotations

import time

import pytest
from onceflow.agents.metrics import Gauges, Metrics, worker_registry
from onceflow.agents.wire import Delivery
from onceflow.journal import JournalRecord
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from .test_partition import cluster, doc, journal
from .test_record_faults import fail_on


def scrape(metrics: Metrics, gauges: Gauges) -> dict[tuple[str, tuple[tuple[str, str], ...]],
                                                     float]:
    """{(sample name, sorted labels): value} of the worker's exposition."""
    text = generate_latest(worker_registry(metrics, lambda: gauges)).decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


NO_GAUGES = Gauges({}, {}, {}, {})


async def test_a_record_the_worker_fails_on_is_an_internal_failure_not_bad_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"]})
    fail_on(monkeypatch, "i-2")
    before = time.time()
    await c.runtime.handle([doc("inv", 0, 1, uuid="i-1"), doc("inv", 1, 2, uuid="i-2"),
                            doc("inv", 2, 3, uuid="i-3")])
    # A publisher's bad input (not JSON), on the same topic.
    await c.runtime.handle([doc("inv", 3, 4, uuid="i-4")])
    await c.runtime.handle([Delivery("inv", 0, 4, 5, None, b"{not json", [])])
    # The last resort reads nothing of the record: it journals it under its coordinates.
    assert journal(c) == [("bill", "processed", "i-1"), (None, "bad-input", "inv/0@1"),
                          ("bill", "processed", "i-3"), ("bill", "processed", "i-4"),
                          (None, "bad-input", "inv/0@4")]
    metrics = c.runtime.metrics
    found = scrape(metrics, NO_GAUGES)
    assert found[("onceflow_internal_failures_total", (("topic", "inv"),))] == 1
    assert found[("onceflow_ingress_records_total",
                  (("outcome", "bad-input"), ("topic", "inv")))] == 1
    assert not metrics.rejecting  # nothing left marked once the reject is done
    last = found[("onceflow_last_processed_timestamp_seconds", (("trigger", "bill"),))]
    assert before <= last <= time.time()


def test_last_processed_follows_the_clock_and_only_processed_records() -> None:
    now = [1000.0]
    metrics = Metrics(clock=lambda: now[0])
    metrics.count_journal([JournalRecord("bill", "processed", "i-1", None, 1000, "inv", 0, 0)])
    now[0] = 1060.0
    metrics.count_journal([JournalRecord("bill", "error", "i-2", None, 2000, "inv", 0, 1),
                           JournalRecord("ship", "in-doubt", "s-1", None, 2000, "inv", 0, 2)])
    found = scrape(metrics, NO_GAUGES)
    assert found[("onceflow_last_processed_timestamp_seconds", (("trigger", "bill"),))] \
        == 1000.0
    # A trigger that processed nothing since the worker started has no series.
    assert not any(name == "onceflow_last_processed_timestamp_seconds"
                   and ("trigger", "ship") in labels for name, labels in found)


def test_held_documents_and_readiness_are_gauges() -> None:
    gauges = Gauges({"bill": 0}, {"bill": 3}, {("inv", 0): 7}, {"bill": True},
                    held={"bill": 42}, ready=False)
    found = scrape(Metrics(), gauges)
    assert found[("onceflow_held_documents", (("trigger", "bill"),))] == 42
    assert found[("onceflow_trigger_suspended", (("trigger", "bill"),))] == 1
    assert found[("onceflow_worker_ready", ())] == 0
    found = scrape(Metrics(), Gauges({}, {}, {}, {}, ready=True))
    assert found[("onceflow_worker_ready", ())] == 1
    # Not known (a registry without a worker behind it): no series rather than a guess.
    assert ("onceflow_worker_ready", ()) not in scrape(Metrics(), NO_GAUGES)


def test_each_trigger_names_the_topics_whose_lag_is_its_own() -> None:
    gauges = Gauges({}, {}, {}, {}, inputs={"bill": ("p.inv", "p.onceflow.route"),
                                            "ship": ("p.order", "p.onceflow.route")})
    found = scrape(Metrics(), gauges)
    info = {dict(labels)["topic"] + " " + dict(labels)["trigger"]
            for name, labels in found if name == "onceflow_trigger_input_info"}
    assert info == {"p.inv bill", "p.onceflow.route bill", "p.order ship",
                    "p.onceflow.route ship"}


def test_a_service_time_falls_in_the_bucket_bisect_gives() -> None:
    import bisect
    import math

    from onceflow.agents.metrics import LATENCY_BUCKETS, Histogram

    for seconds in (0.0, 0.0005, 0.001, 0.0011, 0.05, 0.3, 1.0, 59.9, 60.0, 61.0, 1e9,
                    -1.0, math.nan, math.inf):
        histogram = Histogram()
        histogram.observe(seconds)
        expected = [0] * (len(LATENCY_BUCKETS) + 1)
        expected[bisect.bisect_left(LATENCY_BUCKETS, seconds)] = 1
        assert histogram.counts == expected, seconds
