"""Probes and answers while partitions move: /livez, /readyz, /ready, /servingz, and 503 +
Retry-After.

Two real workers; one is killed with SIGKILL and the survivor is asked about a key the
dead one owned, and about every worker's counts, until its partitions have moved.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names, route_partition
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.process import WorkerProcess

from .support import ORDERS_ONLY, outcomes, publish, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = ORDERS_ONLY
PARTITIONS = 4


def get(url: str) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body or text) of a GET; never raises for an HTTP status."""
    try:
        with urllib.request.urlopen(url, timeout=15) as response:
            status, headers, body = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, headers, body = exc.code, dict(exc.headers), exc.read()
    try:
        return status, headers, orjson.loads(body)
    except orjson.JSONDecodeError:
        return status, headers, body.decode("utf-8", "replace")


def readyz_until_ready(worker: WorkerProcess, timeout: float = 90,
                       serving: WorkerProcess | None = None) -> list[Any]:
    """Every /readyz answer from the worker's start until the first 200.

    `serving`: a worker whose /servingz must answer 200 all along (it had started).
    """
    answers: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if serving is not None:
            status, _, body = get(serving.web_url + "/servingz")
            assert status == 200 and body["serving"] is True, body
        try:
            status, _, body = get(worker.web_url + "/readyz")
        except OSError:  # the web server is not listening yet
            time.sleep(0.1)
            continue
        answers.append((status, body))
        if status == 200:
            return answers
        time.sleep(0.1)
    raise AssertionError(f"never ready: {answers[-3:]}; see {worker.log_path}")


def check_not_ready(answers: list[Any]) -> None:
    for status, body in answers:
        if status != 200:
            assert status == 503, (status, body)
            assert body["ready"] is False and body["reasons"], body


def test_probes_and_a_dead_owner_answer_503_with_retry_after(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = Names(prefix)

    first = start_worker(triggers, prefix, name="w1", wait=False)
    answers = readyz_until_ready(first)
    check_not_ready(answers)
    assert answers[-1][1]["partitions"] == list(range(PARTITIONS))
    status, _, body = get(first.web_url + "/ready")
    assert status == 200 and body["ready"] is True
    status, _, body = get(first.web_url + "/livez")
    assert (status, body["alive"], body["problems"]) == (200, True, [])

    status, _, body = get(first.web_url + "/servingz")
    assert status == 200 and body["serving"] is True, body

    second = start_worker(triggers, prefix, name="w2", wait=False)
    check_not_ready(readyz_until_ready(second, serving=first))
    # While the second one joins, the first keeps serving its views (the Kubernetes
    # readiness probe), whatever /readyz says about processing.
    status, _, body = get(first.web_url + "/servingz")
    assert status == 200 and body["serving"] is True, body
    # Both settle after the second one's join: each owns its part, and together all.
    owned: dict[int, WorkerProcess] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(owned) < PARTITIONS:
        owned = {}
        for worker in (first, second):
            status, _, body = get(worker.web_url + "/readyz")
            if status == 200:
                owned.update({p: worker for p in body["partitions"]})
        time.sleep(0.2)
    assert sorted(owned) == list(range(PARTITIONS)), owned
    assert {id(w) for w in owned.values()} == {id(first), id(second)}

    # A key on a partition of the second worker, with characters that need quoting.
    identity = next(f"o-{i} ö/ü?" for i in range(1000)
                    if owned[route_partition(f"o-{i} ö/ü?", PARTITIONS)] is second)
    publish(broker.bootstrap, names, [
        ("order", orjson.dumps({"uuid": identity}), identity, {}, None)])
    wait_journal(broker.bootstrap, names,
                 lambda lines: "processed" in outcomes(lines, identity), first)
    url = first.web_url + "/history/orders/" + urllib.parse.quote(identity, safe="")
    status, _, body = get(url)
    assert status == 200 and body["entry"]["completed"] is True, body  # forwarded

    second.kill()
    status, headers, body = get(url)
    assert status == 503, (status, body)
    assert int(headers["Retry-After"]) >= 1
    assert "does not answer" in body["error"], body
    status, headers, body = get(first.web_url + "/triggers")
    assert status == 503 and int(headers["Retry-After"]) >= 1, (status, body)
    # The console's overview still answers, naming the worker that does not answer (or,
    # once the group has moved on, only the survivor).
    status, _, body = get(first.web_url + "/overview")
    assert status == 200, (status, body)
    assert body["worker"] == first.web_url
    assert first.web_url in [w["url"] for w in body["workers"]]
    assert second.web_url not in [w["url"] for w in body["workers"]]
    assert body["unreachable"] in ([second.web_url], []), body["unreachable"]

    # Until the survivor has the partitions: 503 with Retry-After, never a 500.
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, headers, body = get(url)
        seen.append(status)
        if status == 200:
            break
        assert status == 503 and int(headers["Retry-After"]) >= 1, (status, body)
        time.sleep(0.1)
    assert status == 200 and body["entry"]["completed"] is True, (seen, body)
    answers = readyz_until_ready(first)
    check_not_ready(answers)
    assert answers[-1][1]["partitions"] == list(range(PARTITIONS))
    assert get(first.web_url + "/triggers")[0] == 200
    status, _, body = get(first.web_url + "/livez")
    assert (status, body["alive"]) == (200, True), body
