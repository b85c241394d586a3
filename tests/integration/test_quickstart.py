"""The README's quick start, run as a user runs it: its commands, its files.

The commands are read from the README's quick-start section; the test runs each with the
arguments shown.  What differs is only where: the session's broker instead of a broker of
its own on port 9092 (another test may hold that port), a topic prefix and a web port of
the test's own, and a data dir under the test's temporary folder.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_runner import onceflow
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.process import WorkerProcess, launch

from .support import outcomes, records, wait_journal

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]


def quick_start_commands() -> list[list[str]]:
    """Every `.venv/bin/onceflow ...` line of the README's quick start, as arguments."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            if line.startswith(".venv/bin/onceflow "):
                lines.append(shlex.split(line)[1:])
    return lines


class ShownWorker(WorkerProcess):
    """The worker started with the README's own arguments."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        super().__init__(ROOT / args[args.index("--triggers") + 1], env, log_path)
        self.args = args

    def start(self) -> ShownWorker:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by kill()
        self.started_at = time.time()
        self.process = launch(self.args, self.env, self._log)
        return self


def test_the_readme_quick_start_works(broker: EmbeddedBroker, new_prefix: Any,
                                      tmp_path: Path) -> None:
    commands = quick_start_commands()
    assert [c[0] for c in commands] == ["replay", "broker", "worker", "send", "journal"]
    replay, shown_broker, worker_args, send, journal = commands

    summary = onceflow(*replay, cwd=ROOT)
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.split("\n")[2].split() == ["orders", "2", "1", "1", "1"]

    assert shown_broker == ["broker", "--port", "9092"]  # the session's broker stands in
    prefix = new_prefix()
    env = {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix,
           "ONCEFLOW_SECURITY_PROTOCOL": "PLAINTEXT"}
    data = worker_args.index("--data-dir") + 1
    worker_args[data] = str(tmp_path / "quickstart")
    worker = ShownWorker(worker_args, {**os.environ, **env,
                                       "ONCEFLOW_WEB_PORT": str(free_port())},
                         tmp_path / "worker.log").start()
    try:
        worker.wait_ready()
        sent = onceflow(*send, env=env, cwd=ROOT)
        assert sent.returncode == 0, sent.stderr
        names = Names(prefix)
        lines = wait_journal(broker.bootstrap, names,
                             lambda ls: len(ls) >= 5, worker, timeout=60)
        assert outcomes(lines, "o-1") == ["processed", "duplicate"]
        assert outcomes(lines, "o-2") == ["retry", "processed"]
        assert outcomes(lines, "o-3") == ["error"]
        shown = onceflow(*journal, env=env, cwd=ROOT)
        assert shown.returncode == 0, shown.stderr
        for word in ("processed", "retry", "error", "duplicate", "o-1", "o-2", "o-3"):
            assert word in shown.stdout, shown.stdout
        out = [orjson.loads(r.value) for r in records(broker.bootstrap,
                                                      names.topic("orders.out"))]
        assert sorted((o["order"], o["total"]) for o in out) == [("o-1", 10), ("o-2", 30)]
        errors = [orjson.loads(r.value) for r in records(broker.bootstrap,
                                                         names.topic("orders.error"))]
        assert [e["error"]["type"] for e in errors] == ["ValueError"]
    finally:
        worker.kill()
