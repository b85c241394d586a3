"""Web views from two workers, suspension by token, and the operators' commands."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_runner import onceflow
from onceflow.agents import wire
from onceflow.agents.signing import RouteSigner
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer, read_topic
from onceflow.app.process import WorkerProcess, http_json

from .support import orders_and_pairs

pytestmark = pytest.mark.integration

TRIGGERS = orders_and_pairs(join_timeout=None)
TOKEN = "s3cret"


def journal(broker: EmbeddedBroker, prefix: str) -> list[dict[str, Any]]:
    names = wire.Names(prefix)
    return [orjson.loads(r.value)
            for r in asyncio.run(read_topic(broker.bootstrap, names.journal))]


def wait_for(broker: EmbeddedBroker, prefix: str, check: Any, timeout: float = 30
             ) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        lines = journal(broker, prefix)
        if check(lines):
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"journal never got there: {lines[-10:]}")
        time.sleep(0.3)


def outcomes(lines: list[dict[str, Any]], identity: str) -> list[str]:
    return [line["outcome"] for line in lines if line["identity"] == identity]


def write_input(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


@pytest.fixture
def deployment(broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path
               ) -> tuple[str, Path, list[WorkerProcess], dict[str, str]]:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    workers = [start_worker(triggers, prefix, name=name, admin_token=TOKEN, wait=False)
               for name in ("w1", "w2")]
    for worker in workers:
        worker.wait_ready()
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_PARTITIONS": "4"}
    return prefix, triggers, workers, env


def test_views_answer_from_both_workers_and_suspension_needs_the_token(
        broker: EmbeddedBroker, deployment: Any, tmp_path: Path) -> None:
    prefix, _, workers, env = deployment
    records = [{"ts": i, "topic": "order", "key": f"o-{i}", "value": {"uuid": f"o-{i}"}}
               for i in range(8)]
    records.append({"ts": 9, "topic": "left", "key": "l-1",
                    "value": {"uuid": "l-1", "activation": "a-1"}})
    done = onceflow("send", str(write_input(tmp_path / "in.jsonl", records)), env=env)
    assert done.returncode == 0, done.stderr
    wait_for(broker, prefix, lambda lines: len(lines) >= 9)
    # Wait until both workers own partitions (the second one may still be joining).
    for worker in workers:
        assert http_json(worker.web_url + "/ready")[0] == 200

    views = [http_json(w.web_url + "/triggers")[1] for w in workers]
    for view in views:
        assert view["workers"] == 2
        assert view["triggers"]["orders"]["counts"] == {"processed": 8}
        assert view["triggers"]["pairs"]["open_joins"] == 1
        assert view["triggers"]["orders"]["definition"]["types"] == ["order"]
        assert view["triggers"]["orders"]["suspended"] is False
    # The console's view of the group, from either worker: both workers, each with its own
    # partitions, the counts summed, and the journal tail of both.
    urls = sorted(w.web_url for w in workers)
    for worker in workers:
        overview = http_json(worker.web_url + "/overview")[1]
        assert overview["worker"] == worker.web_url and overview["unreachable"] == []
        assert sorted(w["url"] for w in overview["workers"]) == urls
        owned = [(p["topic"], p["partition"]) for w in overview["workers"]
                 for p in w["partitions"] if p["topic"].endswith(".order")]
        assert len(owned) == len(set(owned)) == 4  # every order partition, each once
        assert all(w["partitions"] for w in overview["workers"])
        # The group's lag by input topic: each partition once, from whichever worker has it.
        lag = {t["topic"]: t for t in overview["lag"]["topics"]}
        assert set(lag) == {"order", "left", "right", "onceflow.route"}
        assert [p["partition"] for p in lag["order"]["partitions"]] == [0, 1, 2, 3]
        assert {p["worker"] for p in lag["onceflow.route"]["partitions"]} == set(urls)
        known = [p["lag"] for p in lag["order"]["partitions"] if p["lag"] is not None]
        assert lag["order"]["lag"] == (sum(known) if known else None)
        assert overview["triggers"]["orders"]["counts"] == {"processed": 8}
        assert [j["activation"] for j in overview["joins"]] == ["a-1"]
        tail = http_json(worker.web_url + "/journal/tail")[1]
        assert sorted(r["identity"] for r in tail["records"]
                      if r["outcome"] == "processed") == sorted(f"o-{i}" for i in range(8))
    entries = [http_json(w.web_url + "/history/orders/o-3")[1] for w in workers]
    assert entries[0] == entries[1]
    assert entries[0]["entry"]["completed"] is True
    joins = [http_json(w.web_url + "/joins/pairs/a-1")[1] for w in workers]
    assert joins[0] == joins[1]
    assert list(joins[0]["open"]["members"]) == ["left"]

    url = workers[0].web_url + "/triggers/orders/suspend"
    assert http_json(url, method="POST")[0] == 403
    assert http_json(url, method="POST", headers={"Authorization": "Bearer nope"})[0] == 403
    refused = onceflow("suspend", "orders", "--web", workers[1].web_url, env=env)
    assert refused.returncode != 0 and "ONCEFLOW_ADMIN_TOKEN" in refused.stderr
    admin = {**env, "ONCEFLOW_ADMIN_TOKEN": TOKEN}
    done = onceflow("suspend", "orders", "--web", workers[1].web_url, env=admin)
    assert done.returncode == 0, done.stderr
    lines = wait_for(broker, prefix, lambda ls: any(x["outcome"] == "suspended" for x in ls))
    assert [x["trigger"] for x in lines if x["outcome"] == "suspended"] == ["orders"]

    held = [{"ts": 20, "topic": "order", "key": "o-20", "value": {"uuid": "o-20"}},
            {"ts": 21, "topic": "order", "key": "o-21", "value": {"uuid": "o-21"}}]
    assert onceflow("send", str(write_input(tmp_path / "held.jsonl", held)),
                    env=env).returncode == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        view = http_json(workers[0].web_url + "/triggers")[1]["triggers"]["orders"]
        if view["held"] == 2:
            break
        time.sleep(0.3)
    assert view["suspended"] is True and view["held"] == 2
    assert not outcomes(journal(broker, prefix), "o-20")

    done = onceflow("resume", "orders", "--web", workers[0].web_url, env=admin)
    assert done.returncode == 0, done.stderr
    # o-20 and o-21 may be held on partitions of different workers, each resuming on its
    # own: wait for both.
    lines = wait_for(broker, prefix, lambda ls: "processed" in outcomes(ls, "o-21")
                     and bool(outcomes(ls, "o-20")))
    assert outcomes(lines, "o-20") == ["processed"]
    assert [x["trigger"] for x in lines if x["outcome"] == "resumed"] == ["orders"]

    status, text = http_json(workers[0].web_url + "/metrics")
    assert status == 200
    assert 'onceflow_journal_records_total{outcome="processed",trigger="orders"}' in text
    assert "onceflow_service_seconds_bucket{" in text
    assert 'onceflow_open_joins{trigger="pairs"}' in text
    assert "onceflow_consumer_lag_records{" in text
    shown = onceflow("history", "orders", "o-1", "--web", workers[1].web_url, env=env)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["entry"]["completed"] is True


def test_resubmit_decides_in_doubt_and_error_documents_again(
        broker: EmbeddedBroker, deployment: Any, tmp_path: Path) -> None:
    prefix, triggers, _, env = deployment
    names = wire.Names(prefix)

    async def seed_processing_entry() -> None:
        # Signed as the admin would (the workers refuse route records that are not).
        partition = wire.route_partition("o-1", 4)
        seed = wire.control_message(wire.SEED, trigger="orders", identity="o-1",
                                    status="processing", ts=time.time() - 5)
        async with Producer(broker.bootstrap) as producer:
            await producer.send_and_wait(
                names.route, seed, partition=partition,
                headers=RouteSigner.from_tokens(TOKEN).headers(names.route, partition, seed))

    asyncio.run(seed_processing_entry())
    records = [{"ts": 0, "topic": "order", "key": "o-1", "value": {"uuid": "o-1"}},
               {"ts": 1, "topic": "order", "key": "o-2",
                "value": {"uuid": "o-2", "body": {"raise": "fatal"}}}]
    assert onceflow("send", str(write_input(tmp_path / "in.jsonl", records)),
                    env=env).returncode == 0
    wait_for(broker, prefix, lambda ls: outcomes(ls, "o-1") == ["in-doubt"]
             and outcomes(ls, "o-2") == ["error"])

    admin = {**env, "ONCEFLOW_ADMIN_TOKEN": TOKEN}  # resubmit signs what it routes
    done = onceflow("resubmit", "orders", "--triggers", str(triggers), env=admin)
    assert done.returncode == 0, done.stderr
    assert "1 in-doubt document(s)" in done.stdout
    lines = wait_for(broker, prefix, lambda ls: len(outcomes(ls, "o-1")) == 2)
    assert outcomes(lines, "o-1") == ["in-doubt", "processed"]

    done = onceflow("resubmit", "orders", "--triggers", str(triggers), "--outcome", "error",
                    "--identity", "o-2", env=admin)
    assert done.returncode == 0, done.stderr
    lines = wait_for(broker, prefix, lambda ls: len(outcomes(ls, "o-2")) == 2)
    # Run again (its failed entry removed), not rejected as a copy of a failed document.
    assert outcomes(lines, "o-2") == ["error", "error"]
