"""The worker's watch of its brokers (app/broker_loss.py), on a clock moved by hand."""

from __future__ import annotations

import logging

import pytest
from onceflow.agents.health import Health
from onceflow.app import broker_loss
from onceflow.app.broker_loss import BrokerWatch, LostBrokerQuiet


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(name: str, message: str) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, None)


def test_a_broker_back_within_the_timeout_ends_the_loss(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    stopped: list[float] = []
    clock = Clock()
    health = Health(stuck_after=120)
    watch = BrokerWatch(health, "b1:9092,b2:9092", timeout=30, clock=clock)
    monkeypatch.setattr(watch, "stop", stopped.append)
    watch.seen(False)
    assert health.broker_lost_since == 100.0 and watch.quiet.quiet
    clock.now += 29
    watch.seen(False)
    assert not stopped
    clock.now += 0.5
    watch.seen(True)
    assert health.broker_lost_since is None and not watch.quiet.quiet and not stopped
    # A new loss counts from its own start.
    watch.seen(False)
    clock.now += 30
    watch.seen(False)
    assert stopped == [30.0]


def test_while_the_brokers_are_gone_only_onceflow_lines_pass() -> None:
    clock = Clock()
    quiet = LostBrokerQuiet(clock)
    noise = "Unable connect to node with id 1: [Errno 111] Connect call failed"
    assert quiet.filter(record("aiokafka", noise))  # the first one tells what happened
    assert not quiet.filter(record("aiokafka", noise))
    assert quiet.filter(record("faust", "something else"))
    clock.now += broker_loss.SAY_EVERY
    assert quiet.filter(record("aiokafka", noise))
    quiet.quiet = True
    assert not quiet.filter(record("faust", "Drain messages raised"))
    assert quiet.filter(record("onceflow.broker", "no broker has answered"))


def test_servers_of_a_bootstrap_list() -> None:
    assert broker_loss.servers_of("a:1, b:2,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]


async def test_a_server_that_listens_answers() -> None:
    import asyncio

    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await broker_loss.any_server_answers([("127.0.0.1", 9), ("127.0.0.1", port)])
    finally:
        server.close()
    assert not await broker_loss.any_server_answers([("127.0.0.1", 9)])


async def test_the_servers_are_tried_only_after_a_connection_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[object] = []

    async def answers(servers: object) -> bool:
        tried.append(servers)
        return True

    monkeypatch.setattr(broker_loss, "any_server_answers", answers)
    watch = BrokerWatch(Health(stuck_after=120), "b1:9092", timeout=30, clock=Clock())
    await watch.check()
    assert tried == []  # a healthy worker opens no connections of its own
    watch.quiet.filter(record("aiokafka.conn", "Unable connect to node with id 1"))
    await watch.check()
    await watch.check()
    assert tried == [[("b1", 9092)]]
