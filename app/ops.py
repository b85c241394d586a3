"""Operating a running deployment: send, suspend, resume, resubmit, look up history.

`send` and `resubmit` talk to the broker (settings from ONCEFLOW_*); `suspend`, `resume`
and `history` ask a worker's web views (`--web`, default this machine's ONCEFLOW_WEB_PORT),
which route the request to the worker that owns the key.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from onceflow.agents import wire
from onceflow.engine import MemoryState
from onceflow.envelope import Record, decode_value, encode_value
from onceflow.errors import OnceflowError, ScenarioError
from onceflow.history import history_key
from onceflow.ingress import Ingress
from onceflow.journal import IN_DOUBT
from onceflow.scenario import parse_record_line
from onceflow.triggers import load_triggers

from .kafka import Producer, read_topic
from .process import http_json
from .settings import WorkerSettings


def send_file(path: str, settings: WorkerSettings, base_time: float | None) -> int:
    """`onceflow send FILE.jsonl`: publish records in the scenario record format.

    A record's timestamp is base_time + ts (base_time: now unless given), so a file of
    small ts values lands at record times a worker's clock agrees with.
    """
    base = time.time() if base_time is None else base_time
    highest: dict[tuple[str, int], int] = {}
    records = []
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                records.append(parse_record_line(orjson.loads(line), highest, {},
                                                 f"{path}:{number}"))
            except orjson.JSONDecodeError as exc:
                raise ScenarioError(f"{path}:{number}: not a JSON line: {exc}") from None
    names = wire.Names(settings.topic_prefix)

    async def publish() -> None:
        async with Producer(settings.bootstrap_servers) as producer:
            for record in records:
                await producer.send_and_wait(
                    names.topic(record.topic), encode_value(record.value),
                    key=record.key.encode() if record.key is not None else None,
                    partition=record.partition, timestamp_ms=round((base + record.ts) * 1000),
                    headers=[(k, v.encode()) for k, v in record.headers.items()])

    asyncio.run(publish())
    print(f"onceflow: sent {len(records)} record(s) from {path}")
    return 0


def trigger_command(web: str, trigger: str, action: str, token: str | None) -> int:
    """`onceflow suspend|resume TRIGGER` through a worker's web views."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, body = http_json(f"{web}/triggers/{quote(trigger, safe='')}/{action}",
                             method="POST", headers=headers)
    if status == 403:
        why = body.get("error") if isinstance(body, dict) else body
        raise OnceflowError(f"{action} refused: set ONCEFLOW_ADMIN_TOKEN to the workers' "
                            f"admin token ({why})")
    if status >= 300:
        raise OnceflowError(f"{action} failed ({status}): {body}")
    print(f"onceflow: {action} of trigger {trigger!r} sent to {body['partitions']} partition(s)")
    return 0


def show_history(web: str, trigger: str, identity: str, activation: str | None) -> int:
    """`onceflow history TRIGGER IDENTITY`: the entry, from the worker that owns it."""
    url = f"{web}/history/{quote(trigger, safe='')}/{quote(identity, safe='')}"
    if activation is not None:
        url += f"?activation={quote(activation, safe='')}"
    status, body = http_json(url)
    if status >= 300:
        raise OnceflowError(f"history lookup failed ({status}): {body}")
    print(json.dumps(body, indent=2))
    return 0


async def _original(bootstrap: str, topic: str, partition: int, offset: int) -> Any:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        for _ in range(50):
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=1)
            for record in batch.get(tp, []):
                if record.offset == offset:
                    return record
        return None
    finally:
        await consumer.stop()


def resubmit(triggers_path: str, trigger_name: str, settings: WorkerSettings, *,
             outcome: str, identities: list[str], dry_run: bool) -> int:
    """`onceflow resubmit`: decide in-doubt or error documents of a trigger again.

    For each journal record of that outcome (optionally only some identities) the original
    record is read back from its input topic and routed to the trigger alone with its
    delivery count raised, right after a control message that removes its history entry:
    the processing-only entry of an in-doubt document, the failed entry of an error
    document.  So the document is New again; a document that completed in the meantime
    keeps its completed entry and comes out Duplicate.
    """
    triggers = load_triggers(Path(triggers_path))
    trigger = triggers.by_name(trigger_name)
    names = wire.Names(settings.topic_prefix)
    wanted = set(identities)
    kind = "processing" if outcome == IN_DOUBT else "failed"

    async def run() -> int:
        journal = await read_topic(settings.bootstrap_servers, names.journal)
        chosen: dict[tuple[str, int, int], None] = {}
        for line in (orjson.loads(r.value) for r in journal):
            if line.get("trigger") == trigger.name and line.get("outcome") == outcome and (
                    not wanted or line.get("identity") in wanted):
                chosen[(line["topic"], line["partition"], line["offset"])] = None
        shadow = Ingress(triggers, {}, MemoryState().id_store)
        count = 0
        async with Producer(settings.bootstrap_servers) as producer:
            for topic, partition, offset in chosen:
                original = await _original(settings.bootstrap_servers, names.topic(topic),
                                           partition, offset)
                if original is None:
                    print(f"onceflow: {topic}/{partition}@{offset} is no longer on its topic; "
                          f"skipped", file=sys.stderr)
                    continue
                record = Record(topic, partition, offset, original.timestamp / 1000,
                                decode_value(original.value),
                                original.key.decode() if original.key else None,
                                wire.header_dict(list(original.headers or ())))
                doc, _, _ = shadow.admit_into(record, 0, [])
                if doc is None:
                    continue
                doc.delivery_count = max(2, doc.delivery_count + 1)
                key = wire.routing_key(trigger, doc)
                target = wire.route_partition(key, settings.partitions)
                entry = (history_key(doc.identity, doc.activation)
                         if trigger.routes_by_activation and doc.activation else doc.identity)
                print(f"onceflow: resubmit {trigger.name} {doc.identity} "
                      f"({topic}/{partition}@{offset})")
                count += 1
                if dry_run:
                    continue
                await producer.send(names.route, wire.control_message(
                    wire.FORGET, trigger=trigger.name, key=entry, only=kind),
                    key=key.encode(), partition=target)
                await producer.send(names.route, wire.doc_message([trigger.name], doc),
                                    key=key.encode(), partition=target)
            await producer.flush()
        return count

    count = asyncio.run(run())
    print(f"onceflow: {count} {outcome} document(s) of {trigger.name!r} "
          f"{'would be ' if dry_run else ''}resubmitted")
    return 0

