"""Route-topic signatures in a deployment with an admin token (memory broker, dict tables).

The worker test (tests/integration/test_route_signatures.py) writes forged records to a
real worker's route topic; these check the partitions' side in process: documents and
controls a signed deployment writes for itself are applied, anything else is refused.
"""

from __future__ import annotations

from typing import Any

import orjson
from onceflow.agents import wire
from onceflow.agents.signing import HEADER, RouteSigner, route_key
from onceflow.agents.wire import Delivery
from onceflow.tables.outbox import OutRecord
from onceflow.triggers import parse_triggers

from .cluster import LocalCluster

TOKEN = "t0ken"


def signed_cluster(token: str | None = TOKEN) -> LocalCluster:
    triggers = parse_triggers({"trigger": [
        {"name": "pair", "service": "scripted", "types": ["a", "b"], "condition": "all"},
        {"name": "plain", "service": "scripted", "types": ["p"]}]})
    keys = (route_key(token),) if token else ()
    return LocalCluster(triggers, partitions=2, route_keys=keys)


def member(kind: str, partition: int, uuid: str, activation: str) -> Delivery:
    return Delivery(kind, partition, 0, 1, None,
                    orjson.dumps({"uuid": uuid, "activation": activation}), [])


def outcomes(c: LocalCluster) -> list[tuple[Any, str, Any]]:
    return [(x["trigger"], x["outcome"], x["identity"]) for x in c.journal()]


async def test_what_a_signed_deployment_routes_is_signed_and_applied() -> None:
    c = signed_cluster()
    target = wire.route_partition("x", 2)
    await c.runtime.handle([member("a", 1 - target, "a-1", "x")])
    (routed,) = c.broker.log(c.names.route, target)
    assert dict(routed.headers)[HEADER] == RouteSigner.from_tokens(TOKEN).headers(
        c.names.route, target, routed.value)[0][1]
    await c.pump()
    await c.runtime.handle([member("b", target, "b-1", "x")])
    assert outcomes(c) == [("pair", "join-pending", "a-1"), ("pair", "processed", "a-1"),
                           ("pair", "processed", "b-1")]


async def test_unsigned_or_foreign_route_records_are_refused_and_kept() -> None:
    c = signed_cluster()
    suspend = wire.control_message(wire.SUSPEND, trigger="plain", reason="x", journal=True)
    other = RouteSigner.from_tokens("other")
    route = c.names.route
    c.broker.append(route, 0, OutRecord(b"k", suspend, [], 1))
    c.broker.append(route, 0, OutRecord(b"k", suspend, other.headers(route, 0, suspend), 1))
    # Signed by another deployment (topic prefix) with the same token.
    c.broker.append(route, 0, OutRecord(b"k", suspend, RouteSigner.from_tokens(
        TOKEN).headers("other." + route, 0, suspend), 1))
    await c.pump()
    lines = c.journal()
    assert [(x["trigger"], x["outcome"], x["identity"]) for x in lines] == [
        (None, "bad-input", f"onceflow.route/0@{n}") for n in range(3)]
    assert "(a 'suspend' message for 'plain') was not applied: it has no signature" \
        in lines[0]["reason"]
    assert "its signature does not match" in lines[1]["reason"]
    assert not c.runtime.worker(0).processors["plain"].suspended
    assert len(c.broker.records(c.names.dead_letter)) == 3


async def test_a_second_token_is_accepted_but_never_signs() -> None:
    old, new = RouteSigner.from_tokens("old"), RouteSigner.from_tokens("new", "old")
    value = wire.control_message(wire.TICK, ts=1)
    assert new.check("r", 0, value, old.headers("r", 0, value)) is None
    assert new.headers("r", 0, value) != old.headers("r", 0, value)
    assert old.check("r", 0, value, new.headers("r", 0, value)) is not None
    assert RouteSigner.from_tokens(None).check("r", 0, value, []) is None  # no token
    assert route_key("") is None and route_key("\udcff") is not None
