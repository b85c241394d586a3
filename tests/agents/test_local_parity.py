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
from onceflow.agents.signing import RouteSigner, route_key
from onceflow.app.feed import JournalMapper, StandIns, feed, seed_message, seed_partitions
from onceflow.app.replay import replay_scenario
from onceflow.envelope import Record, seconds
from onceflow.journal import contract_key
from onceflow.scenario import Control, load_scenario

from .cluster import LocalCluster

SCENARIOS = Path(__file__).parents[1] / "scenarios"
TOKEN = "the local run's admin token"


async def run_local(folder: Path, partitions: int = 4) -> list[dict]:
    scenario = load_scenario(folder)
    topics = {r.topic for r in scenario.iter_records() if isinstance(r, Record)}
    # As a live run: the run's own admin key signs its controls and the markers of the
    # stand-ins for redeliveries.
    cluster = LocalCluster(scenario.triggers, partitions=partitions, base_dir=folder,
                           extra_topics=tuple(sorted(topics)), route_keys=(route_key(TOKEN),))
    stand_ins = StandIns(RouteSigner.from_tokens(TOKEN))
    names = cluster.names
    for seed in scenario.history:
        for partition in seed_partitions(scenario.triggers, seed, partitions):
            cluster.broker.append(names.route, partition, _control(
                names.route, partition, wire.SEED, **seed_message(seed)))
    await cluster.pump()
    mapper = JournalMapper()
    now = None
    for item in feed(scenario):
        ts = item.ts if isinstance(item, Control) else item.record.ts
        if now is None or ts > now:
            now = ts
            for partition in range(partitions):
                cluster.broker.append(names.route, partition, _control(
                    names.route, partition, wire.TICK, ts=seconds(ts)))
        if isinstance(item, Control):  # the operator's command, as `onceflow suspend` sends it
            for partition in range(partitions):
                cluster.broker.append(names.route, partition, _control(
                    names.route, partition, item.action, trigger=item.trigger,
                    reason=REASONS[item.action], journal=partition == 0))
            await cluster.pump()
            continue
        headers = stand_ins.headers(item, names.topic(item.record.topic))
        offset = cluster.send(item.record.topic, item.record.partition, item.value, ts=ts,
                              key=item.key, headers=headers)
        mapper.sent(item.record, item.record.topic, item.record.partition, offset)
        stand_ins.sent(item, offset)
        await cluster.pump()
    return [mapper.map(line) for line in cluster.journal()]


REASONS = {"suspend": "suspended by command", "resume": "resumed by command"}


def _control(route: str, partition: int, kind: str, **fields: object):
    from onceflow.tables.outbox import OutRecord
    value = wire.control_message(kind, **fields)
    signed = RouteSigner.from_tokens(TOKEN).headers(route, partition, value)
    return OutRecord(kind.encode(), value, signed)


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
