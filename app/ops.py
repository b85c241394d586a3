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
from onceflow.tables.outbox import record_size
from onceflow.triggers import load_triggers

from .kafka import Producer, read_topic
from .process import http_json
from .security import Cluster, started
from .settings import WorkerSettings


def send_file(path: str, settings: WorkerSettings, base_time: float | None) -> int:
    """`onceflow send FILE.jsonl`: publish records in the scenario record format.

    A record's timestamp is base_time + ts (base_time: now unless given), so a file of
    small ts values lands at record times a worker's clock agrees with.  Every line is
    read and measured before anything is sent: a line that is not a record, or a record
    larger than ONCEFLOW_MAX_RECORD_BYTES (which the broker would refuse after the lines
    before it went out), stops the command with nothing sent.
    """
    base = time.time() if base_time is None else base_time
    highest: dict[tuple[str, int], int] = {}
    names = wire.Names(settings.topic_prefix)
    limit = settings.max_record_bytes
    outgoing: list[tuple[str, int, bytes | None, bytes, list[tuple[str, bytes]], int]] = []
    too_large: list[str] = []
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = parse_record_line(orjson.loads(line), highest, {},
                                           f"{path}:{number}")
            except orjson.JSONDecodeError as exc:
                raise ScenarioError(f"{path}:{number}: not a JSON line: {exc}") from None
            key = record.key.encode() if record.key is not None else None
            value = encode_value(record.value)
            headers = [(k, v.encode()) for k, v in record.headers.items()]
            size = record_size(key, value, headers)
            if size > limit:
                too_large.append(f"{path}:{number}: the record for {record.topic!r} is about "
                                 f"{size} bytes, more than ONCEFLOW_MAX_RECORD_BYTES ({limit})")
            outgoing.append((names.topic(record.topic), record.partition, key, value, headers,
                             round((base + record.ts) * 1000)))
    if too_large:
        them = "it" if len(too_large) == 1 else "them"
        raise ScenarioError("; ".join(too_large) +
                            f": the broker would refuse {them}; nothing was sent")

    async def publish() -> None:
        async with Producer(settings.cluster) as producer:
            for topic, partition, key, value, headers, timestamp_ms in outgoing:
                await producer.send_and_wait(topic, value, key=key, partition=partition,
                                             timestamp_ms=timestamp_ms, headers=headers)

    asyncio.run(publish())
    print(f"onceflow: sent {len(outgoing)} record(s) from {path}")
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


async def _original(cluster: Cluster, topic: str, partition: int, offset: int) -> Any:
    consumer = await started(AIOKafkaConsumer(
        enable_auto_commit=False, max_partition_fetch_bytes=8 << 20,
        **cluster.client_kwargs()), cluster)
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

    Every record is built and measured before anything is sent: a routed document larger
    than ONCEFLOW_MAX_RECORD_BYTES (an original near the limit, with its routing data)
    stops the command with nothing resubmitted, naming each such document.
    """
    triggers = load_triggers(Path(triggers_path))
    trigger = triggers.by_name(trigger_name)
    names = wire.Names(settings.topic_prefix)
    wanted = set(identities)
    kind = "processing" if outcome == IN_DOUBT else "failed"
    limit = settings.max_record_bytes

    async def run() -> int:
        journal = await read_topic(settings.cluster, names.journal)
        chosen: dict[tuple[str, int, int], None] = {}
        for record in journal:
            line = _journal_line(record)
            if line is None:
                continue
            if line.get("trigger") == trigger.name and line.get("outcome") == outcome and (
                    not wanted or line.get("identity") in wanted):
                topic, partition, offset = (line.get("topic"), line.get("partition"),
                                            line.get("offset"))
                if not (isinstance(topic, str) and isinstance(partition, int)
                        and isinstance(offset, int)):
                    print(f"onceflow: journal record {record.partition}@{record.offset} has "
                          f"no record coordinates; skipped", file=sys.stderr)
                    continue
                chosen[(topic, partition, offset)] = None
        shadow = Ingress(triggers, {}, MemoryState().id_store)
        planned: list[tuple[str, int, bytes, bytes, bytes]] = []
        too_large: list[str] = []
        for topic, partition, offset in chosen:
            original = await _original(settings.cluster, names.topic(topic),
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
            entry = (history_key(doc.identity, doc.activation)
                     if trigger.routes_by_activation and doc.activation else doc.identity)
            forget = wire.control_message(wire.FORGET, trigger=trigger.name, key=entry,
                                          only=kind)
            routed = wire.doc_message([trigger.name], doc)
            size = max(record_size(key.encode(), forget), record_size(key.encode(), routed))
            where = f"{doc.identity} ({topic}/{partition}@{offset})"
            if size > limit:
                too_large.append(f"document {where}: with its routing data it is "
                                 f"about {size} bytes, more than ONCEFLOW_MAX_RECORD_BYTES "
                                 f"({limit})")
                continue
            planned.append((where, wire.route_partition(key, settings.partitions),
                            key.encode(), forget, routed))
        if too_large:
            raise OnceflowError(
                f"resubmit of {trigger.name!r}: the broker would refuse "
                + "; ".join(too_large) + ". Nothing was resubmitted; resubmit the others "
                "with --identity")
        for where, _, _, _, _ in planned:
            print(f"onceflow: resubmit {trigger.name} {where}")
        if dry_run or not planned:
            return len(planned)
        async with Producer(settings.cluster) as producer:
            for _, target, key, forget, routed in planned:
                await producer.send(names.route, forget, key=key, partition=target)
                await producer.send(names.route, routed, key=key, partition=target)
            await producer.flush()
        return len(planned)

    count = asyncio.run(run())
    print(f"onceflow: {count} {outcome} document(s) of {trigger.name!r} "
          f"{'would be ' if dry_run else ''}resubmitted")
    return 0


def _journal_line(record: Any) -> dict[str, Any] | None:
    """A journal record as a dict, or None (told on stderr) when it is not one."""
    try:
        line = orjson.loads(record.value)
    except orjson.JSONDecodeError:
        line = None
    if not isinstance(line, dict):
        print(f"onceflow: journal record {record.partition}@{record.offset} is not a JSON "
              f"object; skipped", file=sys.stderr)
        return None
    return line
