"""A service slower than the consumer's max poll interval: its worker loses its partitions.

aiokafka leaves the group when its consumer has not fetched for ONCEFLOW_MAX_POLL_INTERVAL
(a chunk is not done until its services have run), and a second worker takes the partitions
over and decides the same documents again (In Doubt, when the first worker's processing
entries are durable).  The first worker's runs complete afterwards:
their journal records and outputs must be dropped, not published (issue 28 §3), so that
every document is decided once, whichever worker decides it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names
from onceflow.journal import TERMINAL

from .support import journal, publish, records, trigger_file

pytestmark = pytest.mark.integration

DOCUMENTS = 8
SLOW = 8.0  # seconds a run takes: longer than the poll interval below
SERVICE = f'''
import asyncio
import os


async def run(document, context):
    if os.environ.get("ONCEFLOW_TEST_SLOW_SERVICE"):  # the first worker only
        await asyncio.sleep({SLOW})
    return {{"ran": True}}
'''


def test_runs_completing_after_the_worker_left_its_group_publish_nothing(
        broker: Any, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    """ONCEFLOW_MAX_POLL_INTERVAL=3: shorter than the slow service, so that the first
    worker leaves its group within the test (the default is 1000 s)."""
    (tmp_path / "slow_service.py").write_text(SERVICE)
    triggers = trigger_file(tmp_path, '[[trigger]]\nname = "orders"\ntypes = ["order"]\n'
                                      'service = "slow_service:run"\n')
    prefix = new_prefix()
    names = Names(prefix)
    first = start_worker(triggers, prefix, name="w1", max_poll_interval=3,
                         test_slow_service=1)
    publish(broker.bootstrap, names, [
        ("order", orjson.dumps({"uuid": f"d-{n}", "body": {}}), f"k{n}", {}, n % 4)
        for n in range(DOCUMENTS)])
    time.sleep(1.0)  # the first worker has taken them and started their runs
    second = start_worker(triggers, prefix, name="w2", max_poll_interval=3)
    deadline = time.monotonic() + 3 * SLOW + 30
    while True:
        terminal: dict[str, list[str]] = {}
        for line in journal(broker.bootstrap, names):
            if line["outcome"] in TERMINAL:
                terminal.setdefault(line["identity"], []).append(line["outcome"])
        if len(terminal) == DOCUMENTS and first_done(first):
            break
        assert time.monotonic() < deadline, f"not every document was decided: {terminal}"
        time.sleep(0.5)
    time.sleep(2.0)  # anything the first worker would still publish
    terminal = {}
    for line in journal(broker.bootstrap, names):
        if line["outcome"] in TERMINAL:
            terminal.setdefault(line["identity"], []).append(line["outcome"])
    assert sorted(terminal) == sorted(f"d-{n}" for n in range(DOCUMENTS))
    # A record read again after a rebalance (its offset not committed before the group
    # moved it) is a Duplicate of its own decision; any other second outcome is the first
    # worker's run published after the second worker had decided the document.
    twice = {identity: outcomes for identity, outcomes in terminal.items()
             if set(outcomes[1:]) - {"duplicate"}}
    assert not twice, f"documents decided twice: {twice}"
    outputs = records(broker.bootstrap, names.topic("orders.out"))
    processed = [identity for identity, outcomes in terminal.items()
                 if outcomes[0] == "processed"]
    assert sorted(dict(r.headers)["identity"]
                  .decode() for r in outputs) == sorted(processed)
    log = first.log_path.read_text()
    assert "may belong to another worker now" in log
    assert second.alive


def first_done(worker: Any) -> bool:
    """The first worker has said it dropped its runs' results (or has stopped)."""
    return not worker.alive or "may belong to another worker now" in worker.log_path.read_text()
