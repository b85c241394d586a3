"""Retries in a worker started as a user starts one: the product's defaults only.

A trigger retries a transient failure after its `retry_interval` (a user's setting, one
second here); the worker's own settings are all defaults.  The journal says `retry` for the
failed attempt, then `processed`, as `onceflow replay` says for the same input.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_runner import onceflow
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.process import http_json
from onceflow.journal import TERMINAL

from .support import journal, outcomes, publish, records, wait_journal

pytestmark = pytest.mark.integration

BILLING = """
[[trigger]]
name = "billing"
types = ["invoice"]
service = "scripted"
max_retry_attempts = 2
retry_interval = "1s"

[[trigger]]
name = "plain"
types = ["slow"]
service = "slow_services:plain_wait"
"""

SERVICES = '''
import time


def plain_wait(document):
    """A plain function that blocks: the worker runs it off its event loop."""
    time.sleep(float(document["body"]["sleep"]))
    return {"slept": document["body"]["sleep"]}
'''


def billing(new_prefix: Any, tmp_path: Path) -> tuple[Path, str, Names]:
    """The trigger file and its service module in tmp_path; a fresh prefix and its names."""
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(BILLING)
    (tmp_path / "slow_services.py").write_text(SERVICES)
    prefix = new_prefix()
    return triggers, prefix, Names(prefix)


def test_a_transient_failure_is_retried_then_processed_with_default_settings(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers, prefix, names = billing(new_prefix, tmp_path)
    worker = start_worker(triggers, prefix, partitions=2)
    publish(broker.bootstrap, names, [
        ("invoice", orjson.dumps({"uuid": "inv-4", "body": {"raise": "transient:1"}}),
         "inv-4", {}, None),
        ("invoice", orjson.dumps({"uuid": "inv-5", "body": {"raise": "transient:2"}}),
         "inv-5", {}, None),
        ("invoice", orjson.dumps({"uuid": "inv-6", "body": {"raise": "transient:5"}}),
         "inv-6", {}, None),
        ("slow", orjson.dumps({"uuid": "slow-1", "body": {"sleep": 3}}), "slow-1", {}, None),
        ("invoice", orjson.dumps({"uuid": "inv-7"}), "inv-7", {}, None),
    ])
    done = ("inv-4", "inv-5", "inv-6", "inv-7", "slow-1")
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: all(set(outcomes(ls, uuid)) & TERMINAL for uuid in done),
                         worker, timeout=60)
    assert outcomes(lines, "inv-4") == ["retry", "processed"]
    assert outcomes(lines, "inv-5") == ["retry", "retry", "processed"]
    # Two retries allowed: three attempts, then a service error.
    assert outcomes(lines, "inv-6") == ["retry", "retry", "error"]
    assert outcomes(lines, "inv-7") == ["processed"]
    assert outcomes(lines, "slow-1") == ["processed"]
    processed = {line["identity"]: line for line in lines if line["outcome"] == "processed"}
    assert processed["inv-4"]["attempt"] == 2 and processed["inv-5"]["attempt"] == 3
    outputs = [orjson.loads(r.value) for r in records(broker.bootstrap,
                                                      names.topic("billing.out"))]
    assert len(outputs) == 3
    errors = [orjson.loads(r.value) for r in records(broker.bootstrap,
                                                     names.topic("billing.error"))]
    assert [(e["identity"], e["attempts"]) for e in errors] == [("inv-6", 3)]
    assert "await wasn't used" not in worker.log_path.read_text()


TOKEN = "retry-s3cret"


def test_resubmitted_documents_run_again_also_through_a_suspension(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    """The paths after a run: resubmit an error document, and resubmit it while the
    trigger is suspended, then resume.  The admin token is set because suspend, resume and
    resubmit need it (as in any deployment); every other setting is the default."""
    triggers, prefix, names = billing(new_prefix, tmp_path)
    worker = start_worker(triggers, prefix, partitions=2, admin_token=TOKEN)
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_PARTITIONS": "2", "ONCEFLOW_ADMIN_TOKEN": TOKEN}
    publish(broker.bootstrap, names, [
        ("invoice", orjson.dumps({"uuid": "inv-8", "body": {"raise": "transient:5"}}),
         "inv-8", {}, None),
        ("invoice", orjson.dumps({"uuid": "inv-9", "body": {"raise": "transient:5"}}),
         "inv-9", {}, None),
    ])
    wait_journal(broker.bootstrap, names,
                 lambda ls: "error" in outcomes(ls, "inv-8") and "error" in outcomes(ls, "inv-9"),
                 worker, timeout=60)

    again = onceflow("resubmit", "billing", "--triggers", str(triggers), "--outcome", "error",
                     "--identity", "inv-8", env=env)
    assert again.returncode == 0, again.stderr
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "inv-8").count("error") == 2, worker,
                         timeout=60)
    # Run again from attempt 1 (the failed entry was removed), not rejected as a copy.
    assert outcomes(lines, "inv-8") == ["retry", "retry", "error"] * 2

    web = ["--web", worker.web_url]
    assert onceflow("suspend", "billing", *web, env=env).returncode == 0
    again = onceflow("resubmit", "billing", "--triggers", str(triggers), "--outcome", "error",
                     "--identity", "inv-9", env=env)
    assert again.returncode == 0, again.stderr
    wait_journal(broker.bootstrap, names,
                 lambda ls: any(line["outcome"] == "suspended" for line in ls), worker)
    assert onceflow("resume", "billing", *web, env=env).returncode == 0
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "inv-9").count("error") == 2, worker,
                         timeout=60)
    assert outcomes(lines, "inv-9") == ["retry", "retry", "error"] * 2
    # One of each (the journal topic is read partition by partition: not in time order).
    assert sorted(line["outcome"] for line in lines if line["trigger"] == "billing"
                  and line["identity"] is None) == ["resumed", "suspended"]
    errors = [orjson.loads(r.value) for r in records(broker.bootstrap,
                                                     names.topic("billing.error"))]
    assert sorted(e["identity"] for e in errors) == ["inv-8", "inv-8", "inv-9", "inv-9"]
    assert "please report it" not in worker.log_path.read_text()


def test_a_plain_service_that_blocks_leaves_the_worker_answering(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    """A `def` service sleeping 6 s: the worker's web views answer meanwhile (its event
    loop, which also heartbeats the group, is free) and the document is processed once."""
    triggers, prefix, names = billing(new_prefix, tmp_path)
    worker = start_worker(triggers, prefix, partitions=2)
    publish(broker.bootstrap, names, [
        ("slow", orjson.dumps({"uuid": "slow-2", "body": {"sleep": 6}}), "slow-2", {}, None)])
    answered = []
    deadline = time.monotonic() + 30
    while not journal_outcomes(broker, names, "slow-2") and time.monotonic() < deadline:
        started = time.monotonic()
        status, _ = http_json(worker.web_url + "/livez", timeout=10)
        answered.append((status, time.monotonic() - started))
        time.sleep(0.5)
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: bool(outcomes(ls, "slow-2")), worker)
    assert outcomes(lines, "slow-2") == ["processed"]
    assert len(answered) >= 6, answered  # the service ran for most of the loop above
    # Answered while the service slept (not after it, ~6 s later).
    assert all(status == 200 and seconds < 2 for status, seconds in answered), answered


def journal_outcomes(broker: EmbeddedBroker, names: Names, identity: str) -> list[str]:
    """The outcomes of one identity so far."""
    return outcomes(journal(broker.bootstrap, names), identity)
