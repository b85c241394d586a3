"""Every scenario through the worker's partition logic, in process, against replay.

The partitions run over a memory broker with dict tables, fed the way `replay --live`
feeds a real worker: in file order, each record after the previous one is done, ticks
moving every partition to the newest ts.  The journal must equal replay's as a multiset
of the five contract fields.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from onceflow.agents import wire
from onceflow.app.feed import JournalMapper, feed, seed_message, seed_partitions
from onceflow.app.replay import replay_scenario
from onceflow.envelope import Record, seconds
from onceflow.journal import contract_key
from onceflow.scenario import Control, load_scenario

from .cluster import LocalCluster

SCENARIOS = Path(__file__).parents[1] / "scenarios"


async def run_local(folder: Path, partitions: int = 4) -> list[dict]:
    scenario = load_scenario(folder)
    topics = {r.topic for r in scenario.iter_records() if isinstance(r, Record)}
    cluster = LocalCluster(scenario.triggers, partitions=partitions, base_dir=folder,
                           extra_topics=tuple(sorted(topics)))
    names = cluster.names
    for seed in scenario.history:
        for partition in seed_partitions(scenario.triggers, seed, partitions):
            cluster.broker.append(names.route, partition, _control(wire.SEED,
                                                                   **seed_message(seed)))
    await cluster.pump()
    mapper = JournalMapper()
    now = None
    for item in feed(scenario):
        ts = item.ts if isinstance(item, Control) else item.record.ts
        if now is None or ts > now:
            now = ts
            for partition in range(partitions):
                cluster.broker.append(names.route, partition, _control(wire.TICK, ts=seconds(ts)))
        if isinstance(item, Control):  # the operator's command, as `onceflow suspend` sends it
            for partition in range(partitions):
                cluster.broker.append(names.route, partition, _control(
                    item.action, trigger=item.trigger, reason=REASONS[item.action],
                    journal=partition == 0))
            await cluster.pump()
            continue
        offset = cluster.send(item.record.topic, item.record.partition, item.value, ts=ts,
                              key=item.key, headers=item.headers)
        mapper.sent(item.record, item.record.topic, item.record.partition, offset)
        await cluster.pump()
    return [mapper.map(line) for line in cluster.journal()]


REASONS = {"suspend": "suspended by command", "resume": "resumed by command"}


def _control(kind: str, **fields: object):
    from onceflow.tables.outbox import OutRecord
    return OutRecord(kind.encode(), wire.control_message(kind, **fields))


@pytest.mark.parametrize("folder", sorted(p for p in SCENARIOS.iterdir()
                                          if (p / "triggers.toml").exists()),
                         ids=lambda p: p.name)
async def test_partitions_match_replay(folder: Path) -> None:
    if (folder / "XFAIL").exists():
        pytest.skip("the core is known to get this scenario wrong")
    journal, _, _ = replay_scenario(load_scenario(folder))
    expected = Counter(contract_key(r.as_dict()) for r in journal)
    got = Counter(contract_key(line) for line in await run_local(folder))
    assert got == expected, (
        f"missing: {expected - got}\nunexpected: {got - expected}")
