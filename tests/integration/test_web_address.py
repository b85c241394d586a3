"""Two workers that listen on one address and advertise another (ONCEFLOW_WEB_BIND and
ONCEFLOW_WEB_ADVERTISE): a request about a key is forwarded to the advertised address of
the worker that owns it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.process import http_json

from .support import publish, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = '[[trigger]]\nname = "orders"\ntypes = ["order"]\nservice = "scripted"\n'


def test_requests_are_forwarded_to_the_advertised_address(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    # w1 listens on loopback and advertises a host name; w2 listens on every address and
    # advertises a loopback address other than the one the views are asked on.
    w1 = start_worker(triggers, prefix, name="w1", wait=False, web_bind="127.0.0.1",
                      web_advertise="localhost")
    w2 = start_worker(triggers, prefix, name="w2", wait=False, web_bind="0.0.0.0",
                      web_advertise="127.0.0.2")
    w1.wait_ready()
    w2.wait_ready()
    advertised = {f"http://localhost:{w1.env['ONCEFLOW_WEB_PORT']}",
                  f"http://127.0.0.2:{w2.env['ONCEFLOW_WEB_PORT']}"}
    names = wire.Names(prefix)
    # One document on each of the four partitions.
    uuids = {}
    for n in range(200):
        uuids.setdefault(wire.route_partition(f"o-{n}", 4), f"o-{n}")
        if len(uuids) == 4:
            break
    publish(broker.bootstrap, names,
            [("order", orjson.dumps({"uuid": uuid}), uuid, {}, None) for uuid in
             uuids.values()])
    wait_journal(broker.bootstrap, names, lambda lines: len(lines) >= 4, w1, timeout=120)

    view = http_json(w1.web_url + "/triggers")[1]
    assert view["workers"] == 2
    assert view["triggers"]["orders"]["counts"]["processed"] == 4
    owners = set()
    for uuid in uuids.values():
        answers = [http_json(w.web_url + f"/history/orders/{uuid}")[1] for w in (w1, w2)]
        assert answers[0] == answers[1]
        assert answers[0]["entry"]["completed"] is True
        owners.add(answers[0]["worker"])
    # Each worker owns partitions, and each answer names its owner's advertised address.
    assert owners == advertised
    assert "advertised as http://localhost:" in w1.log_path.read_text()
