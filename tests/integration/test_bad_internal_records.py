"""Records a real worker cannot use do not stop it, on the first run or after a restart.

A record of the repartition topic that is not a message the worker can apply, a control
message for a trigger the worker does not have, and input records whose dup-id or
activation is too long to be stored in state (against the smallest record limit the
worker accepts, where such a state record would be refused by the broker): each gets a
`bad-input` journal record and a dead-letter copy, its offset is committed, and the worker
goes on.  Before, the first one stopped the worker on every restart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer

from .support import outcomes, publish, records, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = """
[[trigger]]
name = "orders"
types = ["order"]
service = "scripted"

[[trigger]]
name = "first"
types = ["left", "right"]
service = "scripted"
condition = "only_one"
"""
LIMIT = 16_384  # the smallest ONCEFLOW_MAX_RECORD_BYTES


def test_bad_internal_records_are_journaled_and_skipped_across_a_restart(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = wire.Names(prefix)
    worker = start_worker(triggers, prefix, partitions=2, max_record_bytes=LIMIT)
    bad_route = [b"{not json", orjson.dumps({"k": "doc", "t": ["orders"]}),
                 wire.control_message(wire.SUSPEND, trigger="audit", reason="by command",
                                      journal=True)]

    async def route() -> list[int]:
        async with Producer(broker.bootstrap) as producer:
            return [(await producer.send_and_wait(names.route, value, key=b"x",
                                                  partition=0)).offset
                    for value in bad_route]

    offsets = asyncio.run(route())
    long_dup_id = "d" * 20_000
    publish(broker.bootstrap, names, [
        ("order", orjson.dumps({"uuid": "dup-1"}), "dup-1", {"dup-id": long_dup_id}, 0),
        ("left", orjson.dumps({"uuid": "act-1", "activation": "a" * 20_000}), "act-1", {}, 0),
        ("order", orjson.dumps({"uuid": "o-1"}), "o-1", {}, 1),
    ])

    def route_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # (by offset: records of no identity are spread over the journal's partitions)
        return sorted((line for line in lines if line["topic"] == "onceflow.route"),
                      key=lambda line: line["offset"])

    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "o-1") == ["processed"]
                         and len(route_lines(ls)) == 3 and bool(outcomes(ls, "dup-1"))
                         and bool(outcomes(ls, "act-1")), worker)
    not_json, no_d, unknown = route_lines(lines)
    assert [line["offset"] for line in (not_json, no_d, unknown)] == offsets
    for line in (not_json, no_d):
        assert (line["trigger"], line["outcome"]) == (None, "bad-input")
        assert f"record onceflow.route/0@{line['offset']} of the repartition topic" \
            in line["reason"]
    assert "not JSON" in not_json["reason"] and "field 'd' is missing" in no_d["reason"]
    assert (unknown["trigger"], unknown["outcome"]) == ("audit", "bad-input")
    assert unknown["reason"].startswith("trigger 'audit' is not defined on this worker")
    assert outcomes(lines, "dup-1") == ["bad-input"]
    assert outcomes(lines, "act-1") == ["bad-input"]
    (dup,) = [line for line in lines if line["identity"] == "dup-1"]
    assert "the dup-id is longer than 1000 characters (20000)" in dup["reason"]
    (act,) = [line for line in lines if line["identity"] == "act-1"]
    assert "the activation is longer than 1000 characters (20000)" in act["reason"]

    # Nothing is lost: every one of them is on the dead-letter topic.
    letters = [orjson.loads(r.value) for r in records(broker.bootstrap, names.dead_letter)]
    assert sorted((x["topic"], x["offset"]) for x in letters
                  if x["topic"] == "onceflow.route") == [("onceflow.route", o) for o in offsets]
    (dup_letter,) = [x for x in letters if x["topic"] == "order"]
    assert dup_letter["value"] == {"uuid": "dup-1"}
    (act_letter,) = [x for x in letters if x["topic"] == "left"]
    assert act_letter["size"] > LIMIT and "value" not in act_letter  # by reference
    assert worker.alive

    # A restart does not meet them again: their offsets were committed.
    worker.stop()
    worker = start_worker(triggers, prefix, partitions=2, max_record_bytes=LIMIT)
    publish(broker.bootstrap, names, [("order", orjson.dumps({"uuid": "o-2"}), "o-2", {}, 0)])
    lines = wait_journal(broker.bootstrap, names,
                         lambda ls: outcomes(ls, "o-2") == ["processed"], worker)
    assert len(route_lines(lines)) == 3
    assert outcomes(lines, "dup-1") == outcomes(lines, "act-1") == ["bad-input"]
    assert worker.alive
