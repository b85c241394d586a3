"""free_port: the ports the tests and the demo hand to brokers and workers."""

from __future__ import annotations

import os
import socket

import pytest
from onceflow.app import broker
from onceflow.app.broker import PICK_FLOOR, ephemeral_ports, free_port, pick_ranges


def test_ports_come_from_outside_the_ephemeral_range_and_never_twice() -> None:
    low, high = ephemeral_ports()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    for port in ports:
        assert PICK_FLOOR <= port < low or high < port <= 65535, (port, low, high)
        with socket.socket() as sock:  # free: it can be bound
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    low, high = ephemeral_ports()
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        # This process's next pick starts at that port again, as if never given.
        monkeypatch.setattr(broker, "_picked", set())
        at = pick_ranges(low, high).index(port)
        monkeypatch.setattr(broker, "_pick_from", {os.getpid(): at})
        after = free_port()
        assert after != port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", after))


def test_without_room_outside_the_range_the_kernel_picks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker, "ephemeral_ports", lambda: (1024, 65535))
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
