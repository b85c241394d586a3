"""Redelivery in the worker is a fact about offsets (issue 26 §3, spec sections 1 and 7).

The worker's partitions over a memory broker: route-topic redeliveries raise a routed
document's count, a live replay's stand-in counts as a redelivery only with a marker
signed under the deployment's admin key, and a resubmitted document is New.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from onceflow.agents import wire
from onceflow.agents.signing import RouteSigner, route_key
from onceflow.agents.wire import Delivery
from onceflow.envelope import Document
from onceflow.triggers import parse_triggers

from .cluster import LocalCluster

TOKEN = "an admin token of the deployment"


def cluster(*triggers: dict[str, Any], partitions: int = 1) -> LocalCluster:
    return LocalCluster(parse_triggers({"trigger": list(triggers)}), partitions=partitions,
                        route_keys=(route_key(TOKEN),))


def outcomes(c: LocalCluster) -> list[tuple[Any, ...]]:
    return [(line["trigger"], line["outcome"], line["identity"]) for line in c.journal()]


def _routed(identity: str, **fields: Any) -> bytes:
    doc = Document("a", identity, None, {"uuid": identity}, 1, "a", 0, 0, "a/0@0", 1)
    for name, value in fields.items():
        setattr(doc, name, value)
    return wire.doc_message(["plain"], doc)


async def test_each_redelivery_of_a_route_record_raises_the_routed_count() -> None:
    c = cluster({"name": "plain", "service": "scripted", "types": ["a"], "use_history": False,
                 "max_delivery_count": 3})
    value = _routed("a-1")
    signed = RouteSigner([route_key(TOKEN)]).headers(c.names.route, 0, value)
    delivery = Delivery(c.names.route, 0, 0, 1, b"a-1", value, signed)
    for _ in range(3):
        await c.runtime.handle([delivery])  # the broker hands it over again and again
    assert outcomes(c) == [("plain", "processed", "a-1"), ("plain", "in-doubt", "a-1"),
                           ("plain", "rejected", "a-1")]
    assert "delivery count 3" in c.journal()[-1]["reason"]
    (letter,) = c.broker.records(c.names.dead_letter)
    assert orjson.loads(letter.value)["identity"] == "a-1"


async def test_a_resubmitted_document_is_new_without_history() -> None:
    c = cluster({"name": "plain", "service": "scripted", "types": ["a"], "use_history": False})
    c.send("a", 0, orjson.dumps({"uuid": "a-1"}), ts=1)
    c.send("a", 0, orjson.dumps({"uuid": "a-1"}), ts=2,
           headers={"delivery-count": "2"})  # in-doubt: no history, no resolver
    await c.pump()
    value = _routed("a-1", delivery_count=3, resubmitted=True)
    c.broker.append(c.names.route, 0, _signed(c, value))
    await c.pump()
    assert outcomes(c) == [("plain", "processed", "a-1"), ("plain", "in-doubt", "a-1"),
                           ("plain", "processed", "a-1")]


def _signed(c: LocalCluster, value: bytes) -> Any:
    from onceflow.tables.outbox import OutRecord
    headers = RouteSigner([route_key(TOKEN)]).headers(c.names.route, 0, value)
    return OutRecord(b"k", value, headers)


def marker(c: LocalCluster, original: str, value: bytes, *, token: str = TOKEN,
           topic: str = "inv", partition: int = 0) -> str:
    made = RouteSigner([route_key(token)]).redelivery_marker(
        c.names.topic(topic), partition, original, value)
    assert made is not None
    return made


async def test_a_signed_stand_in_passes_the_id_cache_and_counts_as_a_redelivery() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"], "use_history": False})
    value = orjson.dumps({"uuid": "i-1"})
    headers = {"dup-id": "d1", "message-id": "inv/0@0"}
    c.send("inv", 0, value, ts=1, headers=headers)
    # A live replay's stand-in for the broker handing offset 0 over again.
    c.send("inv", 0, value, ts=2, headers={
        **headers, "delivery-count": "2",
        "onceflow-redelivery": marker(c, "inv/0@0", value)})
    await c.pump()
    assert outcomes(c) == [("bill", "processed", "i-1"), ("bill", "in-doubt", "i-1")]
    assert "delivery count 2" in c.journal()[-1]["reason"]


@pytest.mark.parametrize("hostile", [
    b"", b"garbage", b"inv/0@0", b"inv/0@0 " + b"0" * 64, b"inv/0@0 " + b"z" * 64,
    b"x" * 100_000, b"inv/0@0 " + b"\xff" * 64, "\u0663/\u0663@\u0663 ".encode() + b"a" * 64,
    b"inv/0@-1 " + b"a" * 64, b"inv/0@99999999999999999999999 " + b"a" * 64,
])
async def test_a_marker_that_is_not_validly_signed_is_an_ordinary_resend(hostile: bytes
                                                                         ) -> None:
    from onceflow.tables.outbox import OutRecord
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"], "use_history": False})
    value = orjson.dumps({"uuid": "i-1"})
    headers = {"dup-id": "d1", "message-id": "inv/0@0"}
    c.send("inv", 0, value, ts=1, headers=headers)
    raw = [(k, v.encode()) for k, v in {**headers, "delivery-count": "2"}.items()]
    c.broker.append(c.names.topic("inv"), 0, OutRecord(
        None, value, [*raw, ("onceflow-redelivery", hostile)], 2))  # type: ignore[arg-type]
    await c.pump()
    got = outcomes(c)
    # Dropped by the dup-id cache (or bad input: a header that is not UTF-8), never run.
    assert got.count(("bill", "processed", "i-1")) == 1 and len(got) == 2
    (dropped,) = [line for line in got if line[0] is None]
    assert dropped[1] in ("duplicate-id", "bad-input")


async def test_markers_signed_elsewhere_or_for_another_record_mean_nothing() -> None:
    c = cluster({"name": "bill", "service": "scripted", "types": ["inv"], "use_history": False})
    value = orjson.dumps({"uuid": "i-1"})
    other = orjson.dumps({"uuid": "i-2"})
    headers = {"dup-id": "d1", "message-id": "inv/0@0"}
    c.send("inv", 0, value, ts=1, headers=headers)
    wrong = [
        marker(c, "inv/0@0", value, token="another deployment's token"),
        marker(c, "inv/0@0", other),  # signed for another value
        marker(c, "inv/0@0", value, partition=1),  # signed for another partition
        marker(c, "inv/1@0", value),  # names another partition than its own
        marker(c, "inv/0@9", value),  # names a later offset
    ]
    for ts, made in enumerate(wrong, 2):
        c.send("inv", 0, value, ts=ts, headers={**headers, "onceflow-redelivery": made})
    await c.pump()
    assert sorted(outcomes(c), key=str) == sorted(
        [("bill", "processed", "i-1")] + [(None, "duplicate-id", "i-1")] * 5, key=str)


async def test_a_signed_stand_in_for_a_waiting_member_is_pending_again() -> None:
    c = cluster({"name": "pair", "service": "scripted", "types": ["l", "r"], "condition": "all"})
    value = orjson.dumps({"uuid": "l-1", "activation": "x"})
    c.send("l", 0, value, ts=1)
    c.send("l", 0, value, ts=2, headers={"delivery-count": "2", "message-id": "l/0@0"})
    c.send("l", 0, value, ts=3, headers={
        "delivery-count": "2", "message-id": "l/0@0",
        "onceflow-redelivery": marker(c, "l/0@0", value, topic="l")})
    await c.pump()
    assert [o for _, o, _ in outcomes(c)] == ["join-pending", "join-discarded", "join-pending"]
