"""A worker whose broker goes away: not ready at once, a few lines, then one line and exit 3.

It kept answering /readyz 200 for about 45 s, logged 4,966 lines in 75 s (aiokafka's
errors every 50 ms, tracebacks) and stopped with Faust's crash (issue 28 §6).  The test
runs a broker of its own, to stop it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.process import WorkerProcess, WorkerUnreachable, http_json

from .support import trigger_file

pytestmark = pytest.mark.integration

TIMEOUT = 10  # ONCEFLOW_BROKER_LOST_TIMEOUT: short, so that the test sees the worker stop


def test_a_worker_whose_broker_is_gone_stops_quietly_with_exit_3(tmp_path: Path) -> None:
    """ONCEFLOW_BROKER_LOST_TIMEOUT=10 instead of the default 60 s, for the test's time."""
    triggers = trigger_file(tmp_path)
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    log = tmp_path / "worker.log"
    worker = WorkerProcess(triggers, {
        "ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": "lost.",
        "ONCEFLOW_DATA_DIR": str(tmp_path / "data"), "ONCEFLOW_WEB_PORT": str(free_port()),
        "ONCEFLOW_SESSION_TIMEOUT": "2", "ONCEFLOW_HEARTBEAT_INTERVAL": "0.3",
        "ONCEFLOW_SECURITY_PROTOCOL": "PLAINTEXT",
        "ONCEFLOW_BROKER_LOST_TIMEOUT": str(TIMEOUT)}, log).start()
    try:
        worker.wait_ready()
        before = len(log.read_text().splitlines())
        broker.stop()
        lost = time.monotonic()
        not_ready_after = None
        while not_ready_after is None and time.monotonic() - lost < TIMEOUT:
            try:
                status, body = http_json(worker.web_url + "/readyz", timeout=1.0)
            except WorkerUnreachable:
                status, body = 0, None
            if status == 503:
                not_ready_after = time.monotonic() - lost
                assert any("no broker has answered" in r for r in body["reasons"]), body
            time.sleep(0.2)
        assert not_ready_after is not None and not_ready_after < 5
        assert worker.process is not None
        code = worker.process.wait(timeout=TIMEOUT + 30)
        took = time.monotonic() - lost
        assert code == 3
        assert TIMEOUT <= took < TIMEOUT + 15
        lines = [line for line in log.read_text().splitlines()[before:] if line.strip()]
        # One line every few seconds while it waits, then the one that says it stops.
        assert len(lines) <= TIMEOUT // 5 + 6, "\n".join(lines[:40])
        assert lines[-1].startswith("onceflow: no broker at ") and "exit" not in lines[-1]
        assert "ONCEFLOW_BROKER_LOST_TIMEOUT" in lines[-1]
        assert "Traceback" not in "\n".join(lines)
    finally:
        worker.kill()
        broker.stop()
