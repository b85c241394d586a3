"""Who asked: suspend, resume and resubmit name the admin token that authenticated them.

The journal's `suspended` and `resumed` records and the control messages on
onceflow.route carry the token's name (ONCEFLOW_ADMIN_TOKEN_NAME, default "admin";
ONCEFLOW_SECOND_ADMIN_TOKEN_NAME, default "second"), never the token.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cli_runner import onceflow
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.process import http_json

from .support import orders_and_pairs, outcomes, publish, records, wait_journal

pytestmark = pytest.mark.integration

TOKEN = "first-s3cret-token"
SECOND = "second-s3cret-token"


def test_suspend_resume_and_resubmit_name_the_token_that_asked(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    """The worker names its admin token "ops-team" (ONCEFLOW_ADMIN_TOKEN_NAME: the setting
    under test); the second token keeps its default name, "second"."""
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(orders_and_pairs())
    prefix = new_prefix()
    names = wire.Names(prefix)
    worker = start_worker(triggers, prefix, partitions=2, admin_token=TOKEN,
                          admin_token_name="ops-team", second_admin_token=SECOND)
    publish(broker.bootstrap, names, [
        ("order", orjson.dumps({"uuid": "o-1"}), "o-1", {}, None),
        ("order", orjson.dumps({"uuid": "o-2", "body": {"raise": "fatal"}}), "o-2", {}, None)])
    wait_journal(broker.bootstrap, names, lambda ls: outcomes(ls, "o-1") == ["processed"]
                 and outcomes(ls, "o-2") == ["error"], worker)
    url = worker.web_url

    # Suspended through the web view with the second token: the journal names "second".
    status, body = http_json(url + "/triggers/orders/suspend", method="POST",
                             headers={"Authorization": f"Bearer {SECOND}"})
    assert status == 202 and body["by"] == "second", body
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: any(x["outcome"] == "suspended" for x in ls), worker)
    assert [x["reason"] for x in lines if x["outcome"] == "suspended"] == [
        "suspended by command (second)"]
    assert http_json(url + "/triggers")[1]["triggers"]["orders"]["reason"] == (
        "suspended by command (second)")

    # Resumed by the command with the admin token: the worker names it "ops-team".
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_PARTITIONS": "2"}
    done = onceflow("resume", "orders", "--web", url,
                    env={**env, "ONCEFLOW_ADMIN_TOKEN": TOKEN})
    assert done.returncode == 0, done.stderr
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: any(x["outcome"] == "resumed" for x in ls), worker)
    assert [x["reason"] for x in lines if x["outcome"] == "resumed"] == [
        "resumed by command (ops-team)"]

    # Resubmitted through the web view with the second token, then by the command with
    # the admin token: each removal message names who asked.
    answer = httpx.post(url + "/triggers/orders/resubmit", headers={
        "X-Onceflow-Token": SECOND}, content=orjson.dumps({"outcome": "error",
                                                          "identities": ["o-2"]}), timeout=30)
    body = answer.json()
    assert answer.status_code == 202 and body["by"] == "second", body
    assert len(body["resubmitted"]) == 1, body
    wait_journal(broker.bootstrap, names, lambda ls: outcomes(ls, "o-2") == ["error"] * 2,
                 worker)
    done = onceflow("resubmit", "orders", "--triggers", str(triggers), "--outcome", "error",
                    "--identity", "o-2", env={**env, "ONCEFLOW_ADMIN_TOKEN": TOKEN,
                                              "ONCEFLOW_ADMIN_TOKEN_NAME": "ops-team"})
    assert done.returncode == 0, done.stderr
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "o-2") == ["error"] * 3, worker)
    # Each run of a resubmitted document names who resubmitted it in its terminal record.
    reasons = [x["reason"] for x in lines if x["identity"] == "o-2"]
    assert "resubmitted" not in reasons[0], reasons
    assert reasons[1].endswith("; resubmitted by second"), reasons
    assert reasons[2].endswith("; resubmitted by ops-team"), reasons

    controls = [orjson.loads(r.value) for r in records(broker.bootstrap, names.route)
                if not r.value.startswith(b'{"k":"doc"') and not r.value.startswith(
                    b'{"k":"tick"')]
    asked = sorted((c["k"], c.get("by")) for c in controls)  # read partition by partition
    assert asked == sorted([("suspend", "second")] * 2 + [("resume", "ops-team")] * 2 + [
        ("forget", "second"), ("forget", "ops-team")]), asked

    # The tokens themselves are nowhere: not on the route topic, the journal, the log.
    time.sleep(0.5)
    for topic in (names.route, names.journal):
        for record in records(broker.bootstrap, topic):
            for data in (record.value or b"", *(v or b"" for _, v in record.headers or ())):
                assert TOKEN.encode() not in data and SECOND.encode() not in data
    log = worker.log_path.read_text(errors="replace")
    assert TOKEN not in log and SECOND not in log
    assert worker.alive


def test_a_token_name_that_is_not_one_printable_line_is_refused_at_start() -> None:
    """A name goes into journal reasons and the console: no line breaks or markup."""
    for variable in ("ONCEFLOW_ADMIN_TOKEN_NAME", "ONCEFLOW_SECOND_ADMIN_TOKEN_NAME"):
        for name in ("", "a\nb", "<script>", "x" * 65):
            done = onceflow("resume", "orders", "--web", "http://127.0.0.1:9",
                            env={variable: name})
            assert done.returncode != 0, name
            assert variable in done.stderr and "Traceback" not in done.stderr, done.stderr
