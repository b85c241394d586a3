"""Records a real worker fails on: a null header value, and a fault on the normal path.

A Kafka header may have a null value (Java clients send them).  The worker reads such a
header as absent and keeps it, as null, in a dead-letter copy; it used to stop on it, on
the normal path and again in the last resort meant to catch the failure.  The last resort
itself reads nothing that can fail: a record the normal path fails on is journaled
`bad-input` under its coordinates, and its bytes go to the dead-letter topic as they came.
The fault is injected by the trigger file's service module, which the worker imports at
start: it makes reading one document's value raise (`orjson.loads`, which the compiled core
looks up on its module at every call; the worker's own calls into the core are compiled
and cannot be replaced).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.agents.wire import Names
from onceflow.app.broker import EmbeddedBroker
from onceflow.app.kafka import Producer

from .support import outcomes, records, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = """
[[trigger]]
name = "orders"
types = ["order"]
service = "faulty:service"
"""

# Imported by the worker: reading the value of the document "boom" raises, as a bug would.
FAULTY = '''
import orjson

_loads = orjson.loads
_BOOM = orjson.dumps({"uuid": "boom"})


def _failing(data):
    if data == _BOOM:
        raise RuntimeError("injected fault for boom")
    return _loads(data)


orjson.loads = _failing


def service(document):
    return {"ok": document.get("uuid")}
'''


def send(bootstrap: str, topic: str, rows: list[tuple[bytes, list[tuple[str, Any]]]]
         ) -> list[int]:
    """Send (value, headers) rows to partition 0, in order; their offsets."""
    async def run() -> list[int]:
        offsets = []
        async with Producer(bootstrap) as producer:
            for value, headers in rows:
                metadata = await producer.send_and_wait(topic, value, key=b"k", partition=0,
                                                        headers=headers)
                offsets.append(metadata.offset)
        return offsets
    return asyncio.run(run())


def test_null_headers_and_a_failing_record_are_journaled_and_the_worker_goes_on(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    (tmp_path / "faulty.py").write_text(FAULTY)
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = Names(prefix)
    worker = start_worker(triggers, prefix, partitions=1)
    pid = worker.process.pid
    offsets = send(broker.bootstrap, names.topic("order"), [
        (orjson.dumps({"uuid": "n-1"}), [("message-id", None), ("dup-id", None),
                                         ("trace", None)]),
        (b"not json", [("trace", None), ("x", b"y")]),
        (orjson.dumps({"uuid": "boom"}), [("n", None), ("t", b"text")]),
        (orjson.dumps({"uuid": "after"}), []),
    ])
    bad, boom = (f"order/0@{offsets[1]}", f"order/0@{offsets[2]}")
    lines = wait_journal(broker.bootstrap, names, lambda lines: "processed" in outcomes(
        lines, "after"), worker)

    # (a) the null headers are no headers: n-1 is decided as any document (its identity
    # is its uuid; a null dup-id is not checked) ...
    assert outcomes(lines, "n-1") == ["processed"]
    assert outcomes(lines, bad) == ["bad-input"]
    # (b) ... and the record the normal path fails on is journaled under its coordinates.
    (failed,) = [line for line in lines if line["identity"] == boom]
    assert failed["outcome"] == "bad-input" and failed["trigger"] is None
    assert "RuntimeError: injected fault for boom" in failed["reason"]
    assert outcomes(lines, "boom") == []
    letters = {x["offset"]: x for x in (orjson.loads(r.value) for r in
                                        records(broker.bootstrap, names.dead_letter))}
    assert letters[offsets[1]]["headers"] == {"trace": None, "x": "y"}
    raw = letters[offsets[2]]
    assert raw["raw"] == '{"uuid":"boom"}'
    assert raw["headers"] == {"n": None, "t": "text"}
    out = [orjson.loads(r.value) for r in records(broker.bootstrap, names.topic("orders.out"))]
    assert out == [{"ok": "n-1"}, {"ok": "after"}]
    # The worker went on without a restart.
    assert worker.alive and worker.process.pid == pid
    assert "the worker stops" not in worker.log_path.read_text()
