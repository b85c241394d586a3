"""What the worker writes when a record would be too large for the broker.

The integration tests show the common cases on a real broker; these show, in process,
service results and journal records over the limit.
"""

from __future__ import annotations

from typing import Any

import orjson
from onceflow.agents import wire
from onceflow.tables.outbox import record_size
from onceflow.triggers import parse_triggers

from .cluster import LocalCluster


def cluster(*triggers: dict[str, Any], **options: Any) -> LocalCluster:
    return LocalCluster(parse_triggers({"trigger": list(triggers)}), partitions=1, **options)


def values(c: LocalCluster, topic: str) -> list[Any]:
    return [orjson.loads(r.value) for r in c.broker.records(c.names.topic(topic))]


async def test_a_service_result_over_the_limit_is_replaced_by_a_note() -> None:
    c = cluster({"name": "copy", "types": ["doc"], "service": "echo"}, max_record_bytes=20_000)
    value = orjson.dumps({"uuid": "d-1", "body": "x" * 19_950})
    await c.runtime.handle([wire.Delivery("doc", 0, 0, 1, b"d-1", value, [])])
    ((line),) = [orjson.loads(r.value) for r in c.broker.records(c.names.journal)]
    assert line["outcome"] == "processed"
    assert "the service result is" in line["reason"] and "not published" in line["reason"]
    (out,) = values(c, "copy.out")
    assert out["oversized"]["limit"] == 20_000 and out["identity"] == "d-1"
    assert out["documents"] == [{"topic": "doc", "partition": 0, "offset": 0,
                                 "identity": "d-1", "type": "doc"}]


async def test_a_huge_identity_is_clipped_in_the_journal_and_outputs() -> None:
    c = cluster({"name": "bill", "types": ["inv"]}, max_record_bytes=50_000)
    uuid = "u" * 30_000  # longer than 96: in doubt, with the identity in every record
    await c.runtime.handle([wire.Delivery("inv", 0, 0, 1, None,
                                          orjson.dumps({"uuid": uuid}), [])])
    for record in c.broker.records(c.names.journal) + c.broker.records(
            c.names.topic("bill.in-doubt")):
        assert record_size(record.key, record.value, record.headers) <= 50_000
    (line,) = [orjson.loads(r.value) for r in c.broker.records(c.names.journal)]
    assert line["outcome"] == "in-doubt" and line["identity"].endswith("(30000 characters)")
    (doubt,) = values(c, "bill.in-doubt")
    assert doubt["documents"][0]["offset"] == 0
