"""The alert rules in deploy/: they parse, they are what the Prometheus operator gets too,
and they ask only for series and labels a worker exports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from onceflow.agents.metrics import Gauges, Metrics, worker_registry
from onceflow.journal import JournalRecord
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "onceflow-rules.yml"
OPERATOR_RULES = DEPLOY / "k8s" / "prometheus-operator" / "prometheusrule.yaml"
SERIES = re.compile(r"\b((?:onceflow|process)_[a-z_]+)\b")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
TEMPLATE_LABELS = re.compile(r"\$labels\.([a-zA-Z_]+)")
DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}


def exported() -> dict[str, set[str]]:
    """{series name: its label names} of a worker that has seen one of everything."""
    metrics = Metrics()
    metrics.count_journal([
        JournalRecord("orders", "processed", "o-1", None, 1000, "order", 0, 0),
        JournalRecord("orders", "in-doubt", "o-2", None, 1000, "order", 0, 1),
        JournalRecord(None, "bad-input", None, None, 1000, "order", 0, 2)])
    metrics.rejecting.add(("order", 0, 3))
    metrics.count_journal([JournalRecord(None, "bad-input", None, None, 1000, "order", 0, 3)])
    metrics.observe_service("orders", 0.01)
    metrics.fetch_gaps[("onceflow.route", "read-again")] += 1
    gauges = Gauges({"orders": 0}, {"orders": 1}, {("order", 0): 3}, {"orders": True},
                    held={"orders": 2}, ready=False,
                    inputs={"orders": ("order", "onceflow.route")})
    text = generate_latest(worker_registry(metrics, lambda: gauges)).decode()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def rules(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for group in groups for rule in group["rules"]]


def plain_groups() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    assert set(loaded) == {"groups"}
    return loaded["groups"]


def test_the_rules_file_parses_and_every_rule_is_complete() -> None:
    groups = plain_groups()
    assert [group["name"] for group in groups] == ["onceflow"]
    for rule in rules(groups):
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"Onceflow[A-Za-z]+", rule["alert"]), rule["alert"]
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        if "for" in rule:
            assert DURATION.fullmatch(rule["for"]), rule["for"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        expr = rule["expr"]
        for opening, closing in ("()", "{}", "[]"):
            depth = 0
            for char in expr:
                depth += (char == opening) - (char == closing)
                assert depth >= 0, (rule["alert"], expr)
            assert depth == 0, (rule["alert"], expr)
    alerts = {rule["alert"] for rule in rules(groups)}
    assert len(alerts) == len(rules(groups))
    # What operators expect to be told (issue 28).
    assert alerts >= {"OnceflowWorkerNotReady", "OnceflowConsumerLagGrowing",
                      "OnceflowInternalFailure", "OnceflowInDoubtDocuments",
                      "OnceflowTriggerSuspended", "OnceflowTriggerStalled"}


def test_every_series_and_label_the_rules_name_is_one_a_worker_exports() -> None:
    names = exported()
    labels = set().union(*names.values()) | TARGET_LABELS
    for rule in rules(plain_groups()):
        expr = rule["expr"]
        used = set(SERIES.findall(expr))
        assert used or "up{" in expr, rule["alert"]
        assert used <= set(names), (rule["alert"], sorted(used - set(names)))
        grouped = {label.strip() for match in GROUPING.findall(expr)
                   for label in match.split(",") if label.strip()}
        assert grouped <= labels, (rule["alert"], sorted(grouped - labels))
        for selector in re.findall(r"\{([^}]*)\}", expr):
            matched = {m.split("=")[0].rstrip("!~").strip()
                       for m in selector.split(",") if m.strip()}
            assert matched <= labels, (rule["alert"], matched)
        # An annotation names only labels the alert's series keep: the grouping labels
        # of an aggregated expression, the target's own otherwise.
        kept = grouped if "by (" in expr else TARGET_LABELS | {
            label for series in used for label in names[series]}
        text = " ".join(rule["annotations"].values())
        assert set(TEMPLATE_LABELS.findall(text)) <= kept, rule["alert"]


def test_the_operator_gets_the_same_rules() -> None:
    (resource,) = [doc for doc in yaml.safe_load_all(OPERATOR_RULES.read_text()) if doc]
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["kind"] == "PrometheusRule"
    assert set(resource) == {"apiVersion", "kind", "metadata", "spec"}
    assert resource["metadata"]["name"] == "onceflow"
    assert set(resource["spec"]) == {"groups"}
    assert resource["spec"]["groups"] == plain_groups()
