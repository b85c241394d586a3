"""/metrics of a real worker, read with prometheus_client's own parsers.

Documents are counted once (clock ticks are not documents), ingress outcomes carry their
input topic, a publisher's bad input is not the worker's internal failure, lag follows the
naming conventions, and the OpenMetrics form is served when Prometheus asks for it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families

from .support import publish, records, trigger_file, wait_journal

pytestmark = pytest.mark.integration



def samples(text: str, parse: Any = text_string_to_metric_families
            ) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{sample name: [(labels, value)]} of an exposition."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in parse(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str,
          **labels: str) -> float:
    return sum(v for got, v in found.get(name, []) if all(got.get(k) == x
                                                           for k, x in labels.items()))


def test_metrics_count_documents_not_ticks_and_parse(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = trigger_file(tmp_path)
    prefix = new_prefix()
    names = wire.Names(prefix)
    # Idle partitions get clock ticks through the route topic (idle after 2 s, the default).
    worker = start_worker(triggers, prefix, partitions=2)
    sent = [("order", orjson.dumps({"uuid": f"o-{i}"}), f"o-{i}", {}, None) for i in range(5)]
    sent += [("left", orjson.dumps({"uuid": "l-1", "activation": "a"}), "a", {}, None),
             ("order", b"{not json", "bad", {}, None),
             ("order", orjson.dumps({"uuid": "o-0"}), "o-0", {}, None)]
    publish(broker.bootstrap, names, sent)
    wait_journal(broker.bootstrap, names, lambda ls: len(ls) >= len(sent), worker)
    # Idle, and the group's commits caught up: the ticks run (a tick a second).  How soon
    # depends on the commit interval and the machine, so the test waits for them.
    deadline = time.monotonic() + 60
    while True:
        ticks = [r for r in records(broker.bootstrap, names.route)
                 if r.key == wire.TICK.encode()]
        if len(ticks) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(ticks) >= 4  # the worker took in ticks, which are not documents
    time.sleep(1.0)  # the last of them decided too

    answer = httpx.get(worker.web_url + "/metrics", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    found = samples(answer.text)
    assert value(found, "onceflow_documents_total") == len(sent)
    assert value(found, "onceflow_journal_records_total", trigger="orders",
                 outcome="processed") == 5
    assert value(found, "onceflow_journal_records_total", trigger="orders",
                 outcome="duplicate") == 1
    assert value(found, "onceflow_journal_records_total", trigger="pairs",
                 outcome="join-pending") == 1
    assert value(found, "onceflow_ingress_records_total", topic="order",
                 outcome="bad-input") == 1
    # The bad line was the publisher's, not the worker's failure.
    assert value(found, "onceflow_internal_failures_total") == 0
    assert value(found, "onceflow_held_documents", trigger="orders") == 0
    assert value(found, "onceflow_worker_ready") == 1
    inputs = {(labels["trigger"], labels["topic"]) for labels, _ in
              found["onceflow_trigger_input_info"]}
    assert ("orders", names.topic("order")) in inputs
    assert ("orders", names.route) in inputs
    (last,) = found["onceflow_last_processed_timestamp_seconds"]
    assert last[0] == {"trigger": "orders"} and 0 < time.time() - last[1] < 120, last
    assert all(labels.get("trigger") for name, series in found.items()
               for labels, _ in series if "trigger" in labels), "an empty trigger label"
    assert value(found, "onceflow_open_joins", trigger="pairs") == 1
    assert value(found, "onceflow_service_seconds_count", trigger="orders") == 5
    lag = found["onceflow_consumer_lag_records"]
    assert {labels["topic"] for labels, _ in lag} >= {names.topic("order"), names.route}
    assert "onceflow_consumer_lag" not in found
    (build,) = found["onceflow_build_info"]
    assert build[0]["version"] and build[1] == 1
    assert value(found, "process_resident_memory_bytes") > 0
    assert "python_info" in found

    open_form = httpx.get(worker.web_url + "/metrics", timeout=10, headers={
        "Accept": "application/openmetrics-text; version=1.0.0"})
    assert open_form.headers["content-type"].startswith("application/openmetrics-text")
    assert open_form.text.endswith("# EOF\n")
    strict = samples(open_form.text, openmetrics)
    assert value(strict, "onceflow_documents_total") == len(sent)
    assert value(strict, "onceflow_journal_records_total", trigger="orders",
                 outcome="processed") == 5
    assert worker.alive
