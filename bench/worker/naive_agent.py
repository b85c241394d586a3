"""The baseline of bench/worker.py: a naive Faust agent, one table get and put a document.

It reads the same documents as the onceflow worker, one event at a time through Faust's
stream, looks the document's uuid up in a RocksDB table and puts it there: the least an
exactly-once check over a Faust table can do.  Settings come from the environment:
NAIVE_BROKER, NAIVE_TOPIC, NAIVE_DATADIR, NAIVE_WEB_PORT, NAIVE_APP_ID, and
NAIVE_BATCH_SIZE_1=1 for producer_max_batch_size=1 (the setting that makes Faust's
recovery right on the embedded broker without onceflow's Fetch highwaters).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import faust
import orjson

settings: dict[str, Any] = {}
if os.environ.get("NAIVE_BATCH_SIZE_1") == "1":
    settings["producer_max_batch_size"] = 1

app = faust.App(
    os.environ.get("NAIVE_APP_ID", "naive"), broker=os.environ["NAIVE_BROKER"],
    store="rocksdb://", datadir=os.environ["NAIVE_DATADIR"], topic_partitions=4,
    topic_replication_factor=1, topic_disable_leader=True, table_standby_replicas=0,
    consumer_auto_offset_reset="earliest", broker_session_timeout=2.0,
    broker_heartbeat_interval=0.3, producer_acks=-1, web_host="127.0.0.1",
    web_port=int(os.environ["NAIVE_WEB_PORT"]), **settings)
documents = app.topic(os.environ["NAIVE_TOPIC"], key_type=bytes, value_type=bytes,
                      key_serializer="raw", value_serializer="raw", partitions=4)
seen = app.Table("seen", partitions=4, key_type=bytes, value_type=bytes)
processed = [0]


@app.agent(documents)
async def check(stream: Any) -> None:
    """Skip a uuid seen before, remember a new one."""
    async for event in stream.events():
        uuid = orjson.loads(event.value)["uuid"].encode()
        if seen.get(uuid) is None:
            seen[uuid] = b"1"
        processed[0] += 1


@app.page("/progress")
async def progress(web: Any, request: Any) -> Any:
    """How many documents the agent has taken."""
    return web.json({"processed": processed[0]})


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    app.main()
