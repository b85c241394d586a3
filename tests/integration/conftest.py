"""Integration fixtures: one embedded broker per session, workers and prefixes as factories.

Every test works under fresh topic names (a prefix of its own), so tests share the broker
without seeing each other's records, groups or tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from onceflow.app.broker import EmbeddedBroker, free_port
from onceflow.app.process import WorkerProcess


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    embedded = EmbeddedBroker(log_path=log).start()
    yield embedded
    embedded.stop()


@pytest.fixture
def new_prefix() -> Callable[[], str]:
    def make() -> str:
        return f"t{uuid.uuid4().hex[:10]}."
    return make


@pytest.fixture
def start_worker(broker: EmbeddedBroker, tmp_path: Path
                 ) -> Iterator[Callable[..., WorkerProcess]]:
    """start_worker(triggers, prefix, *, name, partitions, **ONCEFLOW_settings) -> ready worker.

    The worker runs with the product's defaults: only where it is, what it reads and writes
    (broker, prefix, partitions, data dir, web port, plaintext) is set here.  A test that
    changes any other setting says why.
    """
    started: list[WorkerProcess] = []

    def start(triggers: Path, prefix: str, *, name: str = "w1", partitions: int = 4,
              wait: bool = True, **settings: object) -> WorkerProcess:
        env = {
            "ONCEFLOW_BROKER_URL": broker.url,
            "ONCEFLOW_TOPIC_PREFIX": prefix,
            "ONCEFLOW_PARTITIONS": str(partitions),
            "ONCEFLOW_DATA_DIR": str(tmp_path / name / "data"),
            "ONCEFLOW_WEB_PORT": str(free_port()),
            "ONCEFLOW_SECURITY_PROTOCOL": "PLAINTEXT",
        }
        env.update({f"ONCEFLOW_{k.upper()}": str(v) for k, v in settings.items()})
        (tmp_path / name).mkdir(exist_ok=True)
        worker = WorkerProcess(triggers, env, tmp_path / name / "worker.log").start()
        started.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.kill()
