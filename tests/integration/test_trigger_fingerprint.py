"""A worker whose trigger file differs from its group's refuses to join (two real workers)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from onceflow.app.process import http_json

pytestmark = pytest.mark.integration

FILE = """
[[trigger]]
name = "orders"
types = ["order"]
service = "scripted"
"""
SAME = "# the same triggers, written otherwise\n" + FILE.replace('"order"', "'order'")
OTHER = FILE + """
[[trigger]]
name = "audit"
types = ["order"]
service = "scripted"
"""


def _exit(worker: Any, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while worker.alive and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not worker.alive, "the worker kept running"
    return int(worker.process.returncode)


def test_a_worker_with_another_trigger_file_refuses_to_join(
        start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    first, same, other = (tmp_path / "first.toml", tmp_path / "same.toml",
                          tmp_path / "other.toml")
    first.write_text(FILE)
    same.write_text(SAME)
    other.write_text(OTHER)
    prefix = new_prefix()
    w1 = start_worker(first, prefix, name="w1", partitions=2)
    rebalances = http_json(w1.web_url + "/readyz")[1]["rebalances"]

    refused = start_worker(other, prefix, name="w2", partitions=2, wait=False)
    assert _exit(refused) == 2
    log = refused.log_path.read_text()
    assert "Traceback" not in log
    (line,) = [x for x in log.splitlines() if "its fingerprint is" in x]
    assert line.startswith(f"onceflow: {other}: trigger set: its fingerprint is")
    # Refused before joining (from the member ids on the embedded broker), not by the
    # group leader once it had joined: the group did not rebalance (issue 28 §6).
    assert "group leader" not in line
    assert http_json(w1.web_url + "/readyz")[1]["rebalances"] == rebalances
    assert "run another trigger file" in line
    assert "ONCEFLOW_ALLOW_TRIGGER_CHANGE" in line
    assert w1.alive
    assert b"\x1b[" not in w1.log_path.read_bytes()  # a log file, not a terminal

    # The same triggers written differently: the same fingerprint, so it joins.
    w3 = start_worker(same, prefix, name="w3", partitions=2)
    assert w3.alive and w1.alive

    # A rolling change, said so: it joins.
    w4 = start_worker(other, prefix, name="w4", partitions=2, allow_trigger_change="true")
    assert w4.alive
