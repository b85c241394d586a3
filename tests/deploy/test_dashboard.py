"""The Grafana dashboard in deploy/ asks only for series a worker exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from onceflow.agents.metrics import Gauges, Metrics, worker_registry
from onceflow.journal import JournalRecord
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "onceflow-dashboard.json"
SERIES = re.compile(r"\b((?:onceflow|process)_[a-z_]+)\b")


def exported() -> set[str]:
    metrics = Metrics()
    metrics.count_journal([JournalRecord("orders", "processed", "o-1", None, 1000, "order", 0, 0),
                           JournalRecord(None, "bad-input", None, None, 1000, "order", 0, 1)])
    metrics.observe_service("orders", 0.01)
    metrics.fetch_gaps[("onceflow.route", "read-again")] += 1
    metrics.rejecting.add(("order", 0, 2))  # a record the worker failed on itself
    metrics.count_journal([JournalRecord(None, "bad-input", None, None, 1000, "order", 0, 2)])
    gauges = Gauges({"orders": 0}, {"orders": 1}, {("order", 0): 3}, {"orders": False},
                    held={"orders": 0}, ready=True,
                    inputs={"orders": ("order", "onceflow.route")})
    text = generate_latest(worker_registry(metrics, lambda: gauges)).decode()
    return {sample.name for family in text_string_to_metric_families(text)
            for sample in family.samples}


def test_every_dashboard_query_names_an_exported_series() -> None:
    names = exported()
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"]
                if isinstance(v.get("query"), dict)]
    assert len(queries) >= 12
    used = {name for query in queries for name in SERIES.findall(query)}
    assert used and used <= names, sorted(used - names)
    # Every family the worker exports under onceflow_ is on the dashboard.
    ours = {n for n in names if n.startswith("onceflow_") and not n.endswith("_created")}
    families = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in ours}
    shown = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used}
    assert families - {"onceflow_batches"} <= shown, sorted(families - shown)
