"""Every scenario of tests/scenarios through a real worker on the session's broker.

The journal of the live run must equal replay's as a multiset of the five contract
fields of spec section 7.  The runs go six at a time (each worker waits most of its
start-up on the consumer group); each scenario still passes or fails on its own.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.live import LiveRun, live_env, run_live
from onceflow.app.replay import replay_scenario
from onceflow.errors import OnceflowError
from onceflow.journal import contract_key
from onceflow.scenario import load_scenario

pytestmark = pytest.mark.integration

HERE = Path(__file__).parents[1]
SCENARIOS = sorted(p for p in (HERE / "scenarios").iterdir() if (p / "triggers.toml").exists())
SHARED = Path(__file__).parents[3] / "shared" / "examples"
EXAMPLES = sorted(p for p in SHARED.iterdir() if (p / "triggers.toml").exists()) \
    if SHARED.is_dir() else []
AT_ONCE = 16


async def _run_one(folder: Path, bootstrap: str, gate: asyncio.Semaphore) -> Any:
    async with gate:
        workdir = Path(tempfile.mkdtemp(prefix=f"live-{folder.name}-"))
        run = LiveRun(load_scenario(folder), bootstrap, workdir)
        try:
            journal = await run.run()
        except Exception as exc:  # reported by the scenario's own test; the files stay
            return exc
        finally:
            await asyncio.to_thread(run.worker.kill)
        shutil.rmtree(workdir, ignore_errors=True)
        return journal


@pytest.fixture(scope="module")
def live_journals(broker: EmbeddedBroker, request: pytest.FixtureRequest) -> dict[str, Any]:
    wanted = [item.callspec.params["folder"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")]

    async def run_all() -> dict[str, Any]:
        gate = asyncio.Semaphore(AT_ONCE)
        results = await asyncio.gather(*(_run_one(f, broker.bootstrap, gate) for f in wanted))
        return {str(f): r for f, r in zip(wanted, results, strict=True)}

    return asyncio.run(run_all())


@pytest.mark.parametrize("folder", SCENARIOS + EXAMPLES, ids=lambda p: p.name)
def test_live_journal_equals_replay(folder: Path, live_journals: dict[str, Any]) -> None:
    if (folder / "XFAIL").exists():
        pytest.skip("the core is known to get this scenario wrong")
    result = live_journals[str(folder)]
    if isinstance(result, Exception):
        raise result
    journal, _, _ = replay_scenario(load_scenario(folder))
    expected = Counter(contract_key(r.as_dict()) for r in journal)
    got = Counter(contract_key(line) for line in result)
    assert got == expected, f"missing: {expected - got}\nunexpected: {got - expected}"


def test_live_runs_use_the_worker_defaults(tmp_path: Path) -> None:
    # A live run is a user's worker: its retries wait out retry_interval and its group
    # session is the default one, on the embedded broker as on any other.  Only idle ticks
    # are off: the scenario's time is its records' time.
    for embedded in (True, False):
        env = live_env("127.0.0.1:9092", "p.", 2, tmp_path, embedded=embedded)
        assert env["ONCEFLOW_IDLE_TICKS"] == "false"
        for name in ("SESSION_TIMEOUT", "HEARTBEAT_INTERVAL", "MAX_RETRY_WAIT",
                     "HISTORY_SWEEPS", "IDLE_AFTER", "TICK_INTERVAL"):
            assert f"ONCEFLOW_{name}" not in env
    run = LiveRun(load_scenario(SCENARIOS[0]), "127.0.0.1:9092", tmp_path)
    assert "ONCEFLOW_SESSION_TIMEOUT" not in run.worker.env


def test_a_failed_live_run_keeps_the_log_it_points_to(
        broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker that answers slower than the run waits: the run fails, naming the worker's
    # log, and that log is still there to read.
    real_run = LiveRun.run

    async def impatient(self: LiveRun) -> list[dict[str, Any]]:
        self.record_timeout = 0.001
        return await real_run(self)

    monkeypatch.setattr(LiveRun, "run", impatient)
    with pytest.raises(OnceflowError) as failure:
        run_live(str(HERE / "scenarios" / "keys_over_1000_characters"),
                 bootstrap=broker.bootstrap)
    message = str(failure.value)
    log = Path(message.rsplit("see ", 1)[1].split(" (the live run's files", 1)[0])
    assert log.is_file(), message
    assert message.endswith(f"(the live run's files are kept in {log.parent})"), message
    shutil.rmtree(log.parent)
