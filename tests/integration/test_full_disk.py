"""A full disk under the data directory stops the worker; nothing is lost or decided twice.

RocksDB (through rocksdict) fails with a plain `Exception('IO error: No space left on
device ...')`.  That is never a record's fault: the worker must not journal the records
at hand as `bad-input` and commit past them, but stop, say so in one line naming the
store's directory and the cause, and exit with code 4 (the operating system refused).
After space is freed, a restart decides what was not acknowledged, on what is durable.

The data directory is a small tmpfs mounted for the test (the tests run as root; the test
is skipped, saying why, where mounting is not permitted).
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer
from onceflow.journal import DUPLICATE, TERMINAL

from .support import ORDERS_ONLY, journal, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = ORDERS_ONLY
DOCUMENTS = 300


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not permitted'})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path) -> Path:
    """Write a file until the filesystem is full."""
    path = folder / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return path


def send(bootstrap: str, topic: str, uuids: list[str]) -> None:
    async def run() -> None:
        async with Producer(bootstrap) as producer:
            for uuid in uuids:
                await producer.send_and_wait(topic, orjson.dumps({"uuid": uuid}),
                                             key=uuid.encode(), partition=0)
    asyncio.run(run())


def test_a_full_disk_stops_the_worker_and_a_restart_loses_nothing(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path,
        small_disk: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = Names(prefix)
    data = small_disk / "data"
    workers = []
    try:
        first = start_worker(triggers, prefix, name="w1", partitions=1, data_dir=data)
        workers.append(first)
        filler = fill(small_disk)
        uuids = [f"d-{n}" for n in range(DOCUMENTS)]
        send(broker.bootstrap, names.topic("order"), uuids)

        deadline = time.monotonic() + 90
        while first.alive and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not first.alive, "the worker went on with a full disk"
        assert first.process.returncode == 4
        log = first.log_path.read_text()
        said = [line for line in log.splitlines() if "No space left on device" in line
                and "onceflow: the local store " in line]
        assert len(said) == 1, log[-5000:]
        assert "Traceback" not in log, log[-5000:]
        assert str(data) in said[0] and "the worker stops (exit code 4)" in said[0]
        assert "bad-input" not in {line["outcome"] for line in journal(broker.bootstrap,
                                                                        names)}

        filler.unlink()
        second = start_worker(triggers, prefix, name="w2", partitions=1, data_dir=data)
        workers.append(second)

        def settled(lines: list[dict[str, Any]]) -> bool:
            return {line["identity"] for line in lines if line["outcome"] in TERMINAL} \
                >= set(uuids)

        lines = wait_journal(broker.bootstrap, names, settled, second, timeout=90)
    finally:
        for worker in workers:
            worker.kill()
    terminals: dict[str, list[str]] = {}
    for line in lines:
        if line["outcome"] in TERMINAL:
            terminals.setdefault(line["identity"], []).append(line["outcome"])
    assert "bad-input" not in {outcome for found in terminals.values() for outcome in found}
    # Each document decided once: a record delivered again after the stop may only add
    # `duplicate` (it was decided, and journaled, before the store failed).
    for uuid in uuids:
        found = terminals[uuid]
        assert found[0] != DUPLICATE and all(later == DUPLICATE for later in found[1:]), \
            (uuid, found)
