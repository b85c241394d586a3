"""Every scenario of tests/scenarios through a real worker on the session's broker.

The journal of the live run must equal replay's as a multiset of the five contract
fields of spec section 7.  The runs go three at a time (each worker waits most of its
start-up on the consumer group); each scenario still passes or fails on its own.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.live import LiveRun
from onceflow.app.replay import replay_scenario
from onceflow.scenario import load_scenario

pytestmark = pytest.mark.integration

HERE = Path(__file__).parents[1]
SCENARIOS = sorted(p for p in (HERE / "scenarios").iterdir() if (p / "triggers.toml").exists())
SHARED = Path(__file__).parents[3] / "shared" / "examples"
EXAMPLES = sorted(p for p in SHARED.iterdir() if (p / "triggers.toml").exists()) \
    if SHARED.is_dir() else []
FIELDS = ("trigger", "outcome", "identity", "activation", "ts")
AT_ONCE = 3


def five(line: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(line[f] for f in FIELDS) + (type(line["ts"]).__name__,)


async def _run_one(folder: Path, bootstrap: str, gate: asyncio.Semaphore) -> Any:
    async with gate:
        workdir = Path(tempfile.mkdtemp(prefix=f"live-{folder.name}-"))
        run = LiveRun(load_scenario(folder), bootstrap, workdir)
        try:
            return await run.run()
        except Exception as exc:  # reported by the scenario's own test
            return exc
        finally:
            await asyncio.to_thread(run.worker.kill)


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
    expected = Counter(five(r.as_dict()) for r in journal)
    got = Counter(five(line) for line in result)
    assert got == expected, f"missing: {expected - got}\nunexpected: {got - expected}"
