"""Records written straight to `onceflow.route` without the deployment's key do nothing.

Before, anyone who could write to the repartition topic could suspend a trigger, seed a
history entry that turns a document that never ran into a `duplicate`, or tick a
partition to ts 1e300.  A worker with an admin token now applies only records signed with
a key derived from it (its own, `onceflow resubmit`'s, a live run's); any other is
journaled `bad-input` with a dead-letter copy, and the worker goes on.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents import wire
from onceflow.agents.signing import HEADER, RouteSigner
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer
from onceflow.app.process import http_json
from onceflow.envelope import Document, record_time

from .support import outcomes, publish, records, trigger_file, wait_journal

pytestmark = pytest.mark.integration

TOKEN = "the-admin-token"
PARTITIONS = 2


def identities_on(partition: int, prefix: str, count: int) -> list[str]:
    """Identities whose routing key belongs to a partition."""
    found = (f"{prefix}{i}" for i in range(1000))
    return [x for x in found if wire.route_partition(x, PARTITIONS) == partition][:count]


def test_forged_route_records_are_journaled_and_not_applied(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = trigger_file(tmp_path)
    prefix = new_prefix()
    names = wire.Names(prefix)
    bootstrap = broker.bootstrap
    worker = start_worker(triggers, prefix, partitions=PARTITIONS, admin_token=TOKEN)
    route = names.route
    (victim, signed_victim) = identities_on(0, "o-", 2)
    admin = RouteSigner.from_tokens(TOKEN)
    stranger = RouteSigner.from_tokens("not-the-token")
    suspend = wire.control_message(wire.SUSPEND, trigger="orders", reason="forged",
                                   journal=True)
    seed = wire.control_message(wire.SEED, trigger="orders", identity=victim,
                                status="completed", ts=time.time())
    tick = wire.control_message(wire.TICK, ts=1e300)
    doc = Document("order", "o-routed", None, {"uuid": "o-routed"}, record_time(time.time()),
                   "order", 0, 0, "order/0@0", 1)
    routed = wire.doc_message(["orders"], doc)
    good_seed = wire.control_message(wire.SEED, trigger="orders", identity=signed_victim,
                                     status="completed", ts=time.time())
    forged: list[tuple[bytes, list[tuple[str, bytes]], str]] = [
        (suspend, [], "has no signature"),
        (seed, [], "has no signature"),
        (tick, [], "has no signature"),
        (routed, [], "has no signature"),
        (seed, stranger.headers(route, 0, seed), "signature does not match"),
        # Signed for partition 1, written to partition 0.
        (suspend, admin.headers(route, 1, suspend), "signature does not match"),
        # Signed, then changed.
        (suspend.replace(b"forged", b"FORGED"), admin.headers(route, 0, suspend),
         "signature does not match"),
        (seed, [(HEADER, b"\xff" * 64)], "signature does not match"),
        (seed, admin.headers(route, 0, seed) * 2, "2 signature headers"),
    ]

    async def write() -> list[int]:
        async with Producer(bootstrap) as producer:
            offsets = [(await producer.send_and_wait(route, value, key=b"x", partition=0,
                                                     headers=headers)).offset
                       for value, headers, _ in forged]
            # What the admin signs is applied: this seed makes signed_victim a duplicate.
            await producer.send_and_wait(route, good_seed, key=b"x", partition=0,
                                         headers=admin.headers(route, 0, good_seed))
            return offsets

    offsets = asyncio.run(write())

    def route_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # By offset, once each (a rebalance on a loaded machine can hand a record over
        # again, and it is journaled again).
        by_offset = {x["offset"]: x for x in lines if x["topic"] == "onceflow.route"}
        return [by_offset[offset] for offset in sorted(by_offset)]

    lines = wait_journal(bootstrap, names, lambda ls: len(route_lines(ls)) >= len(forged),
                         worker)
    rejected = route_lines(lines)
    assert [x["offset"] for x in rejected] == offsets
    for line, (_, _, why) in zip(rejected, forged, strict=True):
        assert (line["trigger"], line["outcome"]) == (None, "bad-input")
        assert line["identity"] == f"onceflow.route/0@{line['offset']}"
        assert f"record onceflow.route/0@{line['offset']} of the repartition topic" \
            in line["reason"] and "was not applied" in line["reason"]
        assert why in line["reason"], line["reason"]
    assert "(a 'suspend' message for 'orders')" in rejected[0]["reason"]
    assert "(a 'doc' message for 'orders')" in rejected[3]["reason"]
    letters = [orjson.loads(r.value) for r in records(bootstrap, names.dead_letter)]
    assert sorted({x["offset"] for x in letters if x["topic"] == "onceflow.route"}) == offsets

    # None of them took effect: the trigger runs, the forged seed did not make the victim
    # a duplicate, the tick did not expire the next join, the routed document never ran.
    left, right = identities_on(1, "l-", 1)[0], identities_on(1, "r-", 1)[0]
    publish(bootstrap, names, [
        ("order", orjson.dumps({"uuid": victim}), victim, {}, 0),
        ("order", orjson.dumps({"uuid": signed_victim}), signed_victim, {}, 0),
        ("left", orjson.dumps({"uuid": left, "activation": "a-1"}), left, {}, 1),
        ("right", orjson.dumps({"uuid": right, "activation": "a-1"}), right, {}, 0)])
    lines = wait_journal(bootstrap, names, lambda ls: bool(outcomes(ls, victim))
                         and bool(outcomes(ls, signed_victim))
                         and outcomes(ls, right, "pairs")[-1:] == ["processed"], worker)
    assert outcomes(lines, victim)[0] == "processed"
    assert outcomes(lines, signed_victim)[0] == "duplicate"
    assert outcomes(lines, "o-routed") == []
    assert "join-expired" not in outcomes(lines, left)
    assert not any(x["outcome"] == "suspended" for x in lines)
    # The join's members met across partitions: routed documents are signed by the worker.
    routed_records = records(bootstrap, route)
    assert any(dict(r.headers).get(HEADER) for r in routed_records if b'"k":"doc"' in r.value)

    # The worker's own controls are signed too: a suspend by command is applied.
    status, _ = http_json(worker.web_url + "/triggers/orders/suspend", method="POST",
                          headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 202
    lines = wait_journal(bootstrap, names,
                         lambda ls: any(x["outcome"] == "suspended" for x in ls), worker)
    assert {x["reason"] for x in lines if x["outcome"] == "suspended"} == {
        "suspended by command (admin)"}
    assert worker.alive
