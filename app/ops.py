"""Operating a running deployment: send, suspend, resume, resubmit, look up history.

`send` and `resubmit` talk to the broker (settings from ONCEFLOW_*); `suspend`, `resume`
and `history` ask a worker's web views (`--web`, default this machine's ONCEFLOW_WEB_PORT),
which route the request to the worker that owns the key.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaTimeoutError
from onceflow.agents import wire
from onceflow.envelope import Record, seconds
from onceflow.errors import OnceflowError, ScenarioError
from onceflow.history import state_keys
from onceflow.ingress import Ingress
from onceflow.journal import IN_DOUBT
from onceflow.partition import routing_key
from onceflow.scenario import InputOffsets, parse_record_line
from onceflow.store import MemoryState
from onceflow.tables.outbox import record_size
from onceflow.triggers import ALL, ONLY_ONE, TriggerDef, TriggerSet, load_triggers
from onceflow.values import decode_value, encode_value

from .kafka import Producer, read_topic
from .process import WorkerUnreachable, http_json
from .security import Cluster, started
from .settings import WorkerSettings

LATEST_MS = 253402300800000  # 10000-01-01T00:00:00Z in milliseconds
MAX_TOLD = 100  # bad lines told one by one; past that, how many more
Outgoing = tuple[int, str, int, bytes | None, bytes, list[tuple[str, bytes]], int]
Headers = list[tuple[str, bytes]]


def send_file(path: str, settings: WorkerSettings, base_time: float | None) -> int:
    """`onceflow send FILE.jsonl` (`-`: stdin): publish records in the scenario format.

    A record's timestamp is base_time + ts (base_time: now unless given), so a file of
    small ts values lands at record times a worker's clock agrees with.  Every line is
    read, measured and checked against its topic's partitions before anything is sent:
    every line that is not a record, that is larger than ONCEFLOW_MAX_RECORD_BYTES (which
    the broker would refuse after the lines before it went out), or that names a partition
    its topic lacks, is told, and nothing is sent.
    """
    name = "<stdin>" if path == "-" else path
    if base_time is not None and not (math.isfinite(base_time) and base_time >= 0):
        raise OnceflowError(f"--base-time {base_time}: expected seconds since 1970, 0 or more")
    base = time.time() if base_time is None else base_time
    outgoing, problems = _read_records(_lines(path), name, settings, base)

    async def publish() -> int:
        async with Producer(settings.cluster) as producer:
            problems.extend(await _partition_problems(producer, outgoing, name))
            if problems:
                return 0
            for _, topic, partition, key, value, headers, timestamp_ms in outgoing:
                await producer.send_and_wait(topic, value, key=key, partition=partition,
                                             timestamp_ms=timestamp_ms, headers=headers)
            return len(outgoing)

    sent = asyncio.run(publish()) if outgoing and not problems else 0
    if problems:
        shown = problems[:MAX_TOLD - 1] + problems[-1:] if len(problems) > MAX_TOLD else problems
        for problem in shown[:-1]:
            print(f"onceflow: {problem}", file=sys.stderr)
        if len(problems) > MAX_TOLD:
            print(f"onceflow: ... {len(problems) - MAX_TOLD} more bad lines not shown",
                  file=sys.stderr)
        count = f"{len(problems)} bad lines" if len(problems) > 1 else "a bad line"
        raise ScenarioError(f"{shown[-1]} ({count}; nothing was sent)")
    print(f"onceflow: sent {sent} record(s) from {name}")
    return 0


def _lines(path: str) -> list[bytes]:
    if path == "-":
        return sys.stdin.buffer.read().splitlines()
    try:
        with open(path, "rb") as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ScenarioError(f"{path}: is a folder; give a .jsonl file (or - for "
                            "standard input)") from None
    except PermissionError:
        raise ScenarioError(f"{path}: permission denied") from None


def _read_records(lines: list[bytes], name: str, settings: WorkerSettings, base: float
                  ) -> tuple[list[Outgoing], list[str]]:
    """Every line as a record to send; every bad line told (file:line: why)."""
    offsets = InputOffsets(keep_values=False)  # every line sent carries its value
    names = wire.Names(settings.topic_prefix)
    limit = settings.max_record_bytes
    outgoing: list[Outgoing] = []
    problems: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            item = orjson.loads(line)
            if not isinstance(item, dict):
                raise ScenarioError(f"{where}: expected a JSON object (a record), got "
                                    f"{type(item).__name__}")
            record = parse_record_line(item, offsets, where)
        except orjson.JSONDecodeError as exc:
            problems.append(f"{where}: not a JSON line: {exc}")
            continue
        except ScenarioError as exc:
            problems.append(str(exc))
            continue
        key = record.key.encode() if record.key is not None else None
        value = encode_value(record.value)
        headers = [(k, v.encode()) for k, v in record.headers.items()]
        size = record_size(key, value, headers)
        if size > limit:
            problems.append(f"{where}: the record for {record.topic!r} is about {size} "
                            f"bytes, more than ONCEFLOW_MAX_RECORD_BYTES ({limit}): the "
                            "broker would refuse it")
            continue
        stamp = base * 1000 + record.ts
        if not (math.isfinite(stamp) and 0 <= stamp < LATEST_MS):
            problems.append(f"{where}: base time + ts ({base:.3f} + {seconds(record.ts)}) "
                            "is not a record time Kafka takes (0 to year 9999, in seconds "
                            "since 1970)")
            continue
        outgoing.append((number, names.topic(record.topic), record.partition, key, value,
                         headers, round(stamp)))
    return outgoing, problems


async def _partition_problems(producer: Any, outgoing: list[Outgoing], name: str
                              ) -> list[str]:
    """Lines naming a partition their topic does not have."""
    counts: dict[str, int] = {}
    problems = []
    for number, topic, partition, *_ in outgoing:
        if topic not in counts:
            try:
                counts[topic] = len(await producer.partitions_for(topic))
            except KafkaTimeoutError:
                counts[topic] = 0
        if not counts[topic]:
            problems.append(f"{name}:{number}: topic {topic!r} does not exist and the broker "
                            "did not create it (create it, see `onceflow worker`)")
            continue
        if partition >= counts[topic]:
            problems.append(f"{name}:{number}: partition {partition} of topic {topic!r} does "
                            f"not exist (it has {counts[topic]}: 0 to {counts[topic] - 1})")
    return problems


WEB_HINT = "give --web URL, or set ONCEFLOW_WEB_HOST and ONCEFLOW_WEB_PORT to a worker's"


def web_address(text: str) -> str:
    """A worker's web address as `--web` or the settings give it, checked: http://HOST:PORT."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OnceflowError(f"web address {text!r}: expected http://HOST:PORT (a worker's "
                            "web views)")
    return text.strip().rstrip("/")


def ask_worker(url: str, **request: Any) -> tuple[int, Any]:
    """http_json, with what to do when no worker answers."""
    try:
        return http_json(url, **request)
    except WorkerUnreachable as exc:
        raise WorkerUnreachable(f"{exc} (is the worker running? {WEB_HINT})") from None


def trigger_command(web: str, trigger: str, action: str, token: str | None) -> int:
    """`onceflow suspend|resume TRIGGER` through a worker's web views."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, body = ask_worker(f"{web}/triggers/{quote(trigger, safe='')}/{action}",
                              method="POST", headers=headers)
    if status == 403:
        why = body.get("error") if isinstance(body, dict) else body
        raise OnceflowError(f"{action} refused: set ONCEFLOW_ADMIN_TOKEN to the workers' "
                            f"admin token ({why})")
    if status >= 300 or not isinstance(body, dict):
        raise OnceflowError(f"{action} failed ({status}): {_said(body)}")
    print(f"onceflow: {action} of trigger {trigger!r} sent to {body.get('partitions')} "
          "partition(s)")
    return 0


def show_history(web: str, trigger: str, identity: str, activation: str | None,
                 settings: WorkerSettings | None = None) -> int:
    """`onceflow history TRIGGER IDENTITY`: the entry, from the worker that owns it.

    A join trigger keeps history per activation.  Without `activation`, the activations
    of the identity are taken from the journal and every one of them is looked up.
    """
    url = f"{web}/history/{quote(trigger, safe='')}/{quote(identity, safe='')}"
    if activation is None and settings is not None and _joins(web, trigger):
        activations = _journal_activations(settings, trigger, identity)
        if not activations:
            raise OnceflowError(
                f"trigger {trigger!r} keeps history per activation (an all or only_one "
                f"join) and no journal record of it names identity {identity!r}, so its "
                "activations are unknown: give --activation")
        entries = []
        for each in activations:
            status, body = ask_worker(f"{url}?activation={quote(each, safe='')}")
            if status >= 300:
                raise OnceflowError(f"history lookup failed ({status}): {_said(body)}")
            entries.append(body)
        print(json.dumps(entries, indent=2))
        if all(isinstance(e, dict) and e.get("entry", True) is None for e in entries):
            print(f"onceflow: trigger {trigger!r} has no history entry for identity "
                  f"{identity!r} in any of its activations", file=sys.stderr)
            return 1
        return 0
    if activation is not None:
        url += f"?activation={quote(activation, safe='')}"
    status, body = ask_worker(url)
    if status >= 300:
        raise OnceflowError(f"history lookup failed ({status}): {_said(body)}")
    print(json.dumps(body, indent=2))
    if isinstance(body, dict) and body.get("entry", True) is None:
        print(f"onceflow: trigger {trigger!r} has no history entry for identity "
              f"{identity!r}" + (f" in activation {activation!r}" if activation else ""),
              file=sys.stderr)
        return 1
    return 0


def _joins(web: str, trigger: str) -> bool:
    """Whether a worker defines `trigger` as a join keyed by activation (all, only_one)."""
    status, body = ask_worker(f"{web}/triggers?local=1")
    if status >= 300 or not isinstance(body, dict):
        raise OnceflowError(f"the worker's trigger list failed ({status}): {_said(body)}")
    facts = body.get(trigger)
    if not isinstance(facts, dict):
        known = ", ".join(sorted(body)) or "none"
        raise OnceflowError(f"no trigger named {trigger!r} on the worker at {web} "
                            f"(known: {known})")
    definition = facts.get("definition") or {}
    types = definition.get("types") or ()
    return len(types) > 1 and definition.get("condition") in (ALL, ONLY_ONE)


def _journal_activations(settings: WorkerSettings, trigger: str, identity: str
                         ) -> list[str]:
    names = wire.Names(settings.topic_prefix)
    records = asyncio.run(read_topic(settings.cluster, names.journal))
    found: dict[str, None] = {}
    for record in records:
        line = _journal_line(record, quiet=True)
        if (line is not None and line.get("trigger") == trigger
                and line.get("identity") == identity
                and isinstance(line.get("activation"), str)):
            found[line["activation"]] = None
    return list(found)


def _said(body: Any) -> str:
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    text = body if isinstance(body, str) else json.dumps(body)
    return " ".join(text.split())[:300]


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

    See resubmit_documents; each resubmitted document is told on stdout, each skipped
    one on stderr.
    """
    triggers = load_triggers(Path(triggers_path))
    try:
        trigger = triggers.by_name(trigger_name)
    except KeyError as exc:
        raise OnceflowError(f"{triggers_path}: {exc.args[0]}") from None
    if not dry_run and not settings.route_signer().enabled:
        # Unsigned records on onceflow.route: every worker with an admin token refuses them.
        raise OnceflowError("ONCEFLOW_ADMIN_TOKEN is not set: the records resubmit writes "
                            "to onceflow.route would not be signed, and workers with an admin "
                            "token refuse unsigned ones; set it to the deployment's admin "
                            "token (workers without one accept any; --dry-run lists the "
                            "documents without it)")

    def tell(line: str) -> None:
        print(f"onceflow: {line}", file=sys.stderr)

    by = settings.admin_token_name if settings.route_signer().enabled else None
    done = asyncio.run(resubmit_documents(triggers, trigger, settings, outcome=outcome,
                                          identities=identities, dry_run=dry_run, tell=tell,
                                          by=by))
    for where in done:
        print(f"onceflow: resubmit {trigger.name} {where}")
    count = len(done)
    if not count and identities:
        tell(f"nothing matched: no {outcome} document of {trigger.name!r} has the identity "
             f"{', '.join(repr(i) for i in identities)} in the journal")
        return 1
    print(f"onceflow: {count} {outcome} document(s) of {trigger.name!r} "
          f"{'would be ' if dry_run else ''}resubmitted")
    return 0


async def resubmit_documents(triggers: TriggerSet, trigger: TriggerDef,
                             settings: WorkerSettings, *, outcome: str,
                             identities: list[str], dry_run: bool,
                             tell: Callable[[str], None], by: str | None = None
                             ) -> list[str]:
    """Decide in-doubt or error documents of a trigger again; where each one came from.

    For each journal record of that outcome (optionally only some identities) the original
    record is read back from its input topic and routed to the trigger alone, marked
    resubmitted, with its delivery count raised, right after a control message that
    removes its history entry (the processing-only entry of an in-doubt document, the
    failed entry of an error document: for workers before 0.10, which do not read the
    mark).  A resubmitted document is New for the trigger whatever its count, history or
    resolver (the operator's decision replaces the exactly-once check), and its run
    writes fresh history entries.  `tell` hears what is skipped; `by`, the name of the
    admin token that asked, goes into each removal message.

    Every record is built and measured before anything is sent: a routed document larger
    than ONCEFLOW_MAX_RECORD_BYTES (an original near the limit, with its routing data)
    stops with nothing resubmitted (OnceflowError), naming each such document.
    """
    names = wire.Names(settings.topic_prefix)
    wanted = set(identities)
    kind = "processing" if outcome == IN_DOUBT else "failed"
    limit = settings.max_record_bytes
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
                tell(f"journal record {record.partition}@{record.offset} has no record "
                     f"coordinates; skipped")
                continue
            chosen[(topic, partition, offset)] = None
    shadow = Ingress(triggers, {}, MemoryState().id_store)
    signer = settings.route_signer()
    planned: list[tuple[str, int, bytes, list[tuple[bytes, Headers]]]] = []
    too_large: list[str] = []
    for topic, partition, offset in chosen:
        original = await _original(settings.cluster, names.topic(topic), partition, offset)
        if original is None:
            tell(f"{topic}/{partition}@{offset} is no longer on its topic; skipped")
            continue
        record = Record(topic, partition, offset, original.timestamp,
                        decode_value(original.value),
                        original.key.decode() if original.key else None,
                        wire.header_dict(list(original.headers or ())))
        doc, _, _ = shadow.admit_into(record, 0, [])
        if doc is None:
            continue
        doc.delivery_count = max(2, doc.delivery_count + 1)
        doc.resubmitted = True  # New for the trigger, whatever its count or history
        doc.resubmitted_by = by
        key = routing_key(trigger, doc)
        entry = state_keys(trigger, doc.identity, doc.activation)[0]
        forget = wire.control_message(wire.FORGET, trigger=trigger.name, key=entry,
                                      only=kind, **({"by": by} if by is not None else {}))
        routed = wire.doc_message([trigger.name], doc)
        target = wire.route_partition(key, settings.partitions)
        values = [(value, signer.headers(names.route, target, value))
                  for value in (forget, routed)]
        size = max(record_size(key.encode(), value, headers) for value, headers in values)
        where = f"{doc.identity} ({topic}/{partition}@{offset})"
        if size > limit:
            too_large.append(f"document {where}: with its routing data it is "
                             f"about {size} bytes, more than ONCEFLOW_MAX_RECORD_BYTES "
                             f"({limit})")
            continue
        planned.append((where, target, key.encode(), values))
    if too_large:
        raise OnceflowError(
            f"resubmit of {trigger.name!r}: the broker would refuse "
            + "; ".join(too_large) + ". Nothing was resubmitted; resubmit the others "
            "with --identity")
    if dry_run or not planned:
        return [where for where, _, _, _ in planned]
    async with Producer(settings.cluster) as producer:
        for _, target, key, values in planned:
            for value, headers in values:
                await producer.send(names.route, value, key=key, partition=target,
                                    headers=headers)
        await producer.flush()
    return [where for where, _, _, _ in planned]


def _journal_line(record: Any, *, quiet: bool = False) -> dict[str, Any] | None:
    """A journal record as a dict, or None (told on stderr) when it is not one."""
    try:
        line = orjson.loads(record.value)
    except orjson.JSONDecodeError:
        line = None
    if not isinstance(line, dict):
        if quiet:
            return None
        print(f"onceflow: journal record {record.partition}@{record.offset} is not a JSON "
              f"object; skipped", file=sys.stderr)
        return None
    return line
