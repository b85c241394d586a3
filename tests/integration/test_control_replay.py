"""A captured control cannot be replayed: a signed `suspend` copied and produced again.

Controls that act with an admin's power (suspend, resume, forget, seed, sweep) carry a
unique id and the time they were made, inside the signed value.  A worker applies each id
once per partition (the ids are kept in the partition's control table) and none older
than wire.CONTROL_MAX_AGE; anything else is `bad-input` with a dead-letter copy.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents import wire
from onceflow.agents.signing import RouteSigner
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer
from onceflow.app.process import http_json

from .support import outcomes, publish, records, trigger_file, wait_journal

pytestmark = pytest.mark.integration

TOKEN = "the-admin-token"


def test_a_suspend_copied_from_the_route_topic_and_produced_again_is_refused(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = trigger_file(tmp_path)
    prefix = new_prefix()
    names = wire.Names(prefix)
    bootstrap = broker.bootstrap
    route = names.route
    worker = start_worker(triggers, prefix, partitions=1, admin_token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def events(outcome: str) -> Any:
        return lambda ls: [x for x in ls if x["outcome"] == outcome]

    assert http_json(worker.web_url + "/triggers/orders/suspend", method="POST",
                     headers=auth)[0] == 202
    wait_journal(bootstrap, names, events("suspended"), worker)
    assert http_json(worker.web_url + "/triggers/orders/resume", method="POST",
                     headers=auth)[0] == 202
    wait_journal(bootstrap, names, events("resumed"), worker)

    # The operator's suspend, as an eavesdropper with write access to the topic sees it.
    (captured,) = [r for r in records(bootstrap, route) if b'"k":"suspend"' in r.value]
    message = orjson.loads(captured.value)
    assert isinstance(message["id"], str) and abs(message["at"] - time.time()) < 120
    # An old control, signed with the right key (as if captured long ago).
    old = wire.control_message(wire.SUSPEND, trigger="orders", reason="old", journal=True,
                               at=time.time() - 3600)
    signer = RouteSigner.from_tokens(TOKEN)

    async def write() -> list[int]:
        async with Producer(bootstrap) as producer:
            again = await producer.send_and_wait(route, captured.value, key=captured.key,
                                                 partition=0,
                                                 headers=list(captured.headers))
            aged = await producer.send_and_wait(route, old, key=b"suspend", partition=0,
                                                headers=signer.headers(route, 0, old))
            return [again.offset, aged.offset]

    offsets = asyncio.run(write())
    refused = {f"onceflow.route/0@{offset}" for offset in offsets}
    lines = wait_journal(bootstrap, names, lambda ls: refused <= {
        x["identity"] for x in ls if x["outcome"] == "bad-input"}, worker)
    reasons = {x["identity"]: x["reason"] for x in lines if x["identity"] in refused}
    again, aged = (f"onceflow.route/0@{offset}" for offset in offsets)
    assert f"the suspend message {again} was not applied to partition 0: control " \
        f"'{message['id']}' was applied here before (at offset {captured.offset})" \
        in reasons[again]
    assert "s ago, more than 300 s" in reasons[aged]
    letters = [orjson.loads(r.value) for r in records(bootstrap, names.dead_letter)]
    assert sorted(x["offset"] for x in letters if x["topic"] == "onceflow.route") == offsets

    # The trigger was not suspended again: a document runs.
    publish(bootstrap, names, [("order", orjson.dumps({"uuid": "o-1"}), "o-1", {}, 0)])
    lines = wait_journal(bootstrap, names, lambda ls: bool(outcomes(ls, "o-1")), worker)
    assert outcomes(lines, "o-1") == ["processed"]
    assert [x["outcome"] for x in lines if x["outcome"] in ("suspended", "resumed")] == [
        "suspended", "resumed"]
    assert worker.alive
