"""The operators' console: HTML pages at `/` over the worker's JSON views.

The page is static (HTML, CSS and JavaScript shipped in the package: no CDN, no build
step) and reads JSON views:

- `GET /overview`: every worker of the group, its partitions with their lag and whether
  it is ready, the group's lag summed per input topic, the triggers (counts by outcome,
  suspended, durations as in trigger files) and the open joins; this worker asks the
  others (`?local=1`: this worker only).
- `GET /journal/tail`: the newest journal records every worker wrote (each keeps its
  last RECENT_JOURNAL in memory; `?local=1`: this worker's).
- `GET /documents/{trigger}?outcome=in-doubt|error`: the newest documents on the
  trigger's in-doubt or error topic.
- `GET /dead-letters?limit=N`: the newest records of the dead-letter topic, each summed
  up (dead_letters.py).

Writes (suspend, resume, resubmit) go through the token-guarded POST views; the page asks
for the token and keeps it in the tab's sessionStorage, never in a URL.  Everything a
document carries is shown as text (the page builds DOM nodes, never HTML strings), and the
Content-Security-Policy allows no inline script and no other origin.
"""

from __future__ import annotations

import asyncio
import logging
import math
from importlib import resources
from typing import Any

import aiohttp
import orjson
from faust.web import Request, Response
from onceflow.agents.faust_app import OnceflowApp
from onceflow.agents.health import readiness
from onceflow.durations import format_duration
from onceflow.envelope import seconds
from onceflow.journal import ERROR, IN_DOUBT

from .dead_letters import DEFAULT_DEAD_LETTERS, MAX_DEAD_LETTERS, dead_letter_item
from .kafka import read_tail
from .settings import WorkerSettings

log = logging.getLogger("onceflow.web")

STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "connect-src 'self'; img-src 'self' data:; "
                                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
MAX_JOINS = 200  # open joins listed per worker
MAX_DOCUMENTS = 100  # in-doubt or error documents listed per request (the newest)
# Reads of those topics at once; more requests wait their turn (each reads the topics'
# tails only, for at most DOCUMENTS_TIMEOUT seconds, with a consumer of its own).
DOCUMENT_READS = 2
DOCUMENTS_TIMEOUT = 5.0
DURATIONS = ("join_timeout", "history_ttl", "retry_interval", "history_sweep_interval")
PEER_TIMEOUT = 10.0


def asset(name: str) -> bytes:
    """A file of the console, from the package."""
    return resources.files("onceflow.app").joinpath("console", name).read_bytes()


def wants_html(request: Request) -> bool:
    """Whether the client asked for a page rather than JSON (browsers send text/html)."""
    accept = request.headers.get("Accept") or ""
    return "text/html" in accept and "application/json" not in accept.split(",")[0]


def shown_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """A trigger definition with its durations as a trigger file writes them (1d, 10s)."""
    out = dict(definition)
    for field in DURATIONS:
        if field in out:
            value = out[field]
            out[field] = format_duration(value if value is None or math.isfinite(value)
                                         else None)
    return out


def local_joins(app: OnceflowApp) -> list[dict[str, Any]]:
    """The open joins on this worker's partitions (at most MAX_JOINS)."""
    out: list[dict[str, Any]] = []
    for partition, worker in sorted(app.runtime.workers.items()):
        for name, processor in worker.processors.items():
            joins = processor.joins
            if joins is None:
                continue
            for activation, state in joins.store.items():
                if len(out) >= MAX_JOINS:
                    return out
                members = state.get("members") if isinstance(state, dict) else None
                waiting = []
                if isinstance(members, dict):
                    for kind, member in members.items():
                        identity = member.get("identity") if isinstance(member, dict) else None
                        waiting.append({"type": kind, "identity": identity})
                deadline = state.get("deadline") if isinstance(state, dict) else None
                if isinstance(deadline, int):  # record time in ms, shown in seconds
                    deadline = seconds(deadline)
                out.append({"trigger": name, "activation": activation,
                            "partition": partition, "deadline": deadline,
                            "waiting": waiting,
                            "window_of": state.get("identity")
                            if isinstance(state, dict) and members is None else None})
    return out


def local_partitions(app: OnceflowApp) -> list[dict[str, Any]]:
    """The partitions assigned to this worker: committed offset, end, lag."""
    monitor = app.monitor
    out = []
    for tp in sorted(app.consumer.assignment()):
        end = monitor.tp_end_offsets.get(tp)
        committed = monitor.tp_committed_offsets.get(tp)
        lag = None if end is None else max(0, end - (committed or 0))
        out.append({"topic": tp.topic, "partition": tp.partition, "committed": committed,
                    "end": end, "lag": lag})
    return out


def input_topics(app: OnceflowApp) -> dict[str, list[str]]:
    """The topics whose records reach a trigger (real name -> the triggers they reach).

    The trigger files' input topics and the repartition topic, which every trigger reads.
    """
    runtime = app.runtime
    names = runtime.names
    topics: dict[str, list[str]] = {}
    for trigger in runtime.triggers.triggers:
        for topic in trigger.topics:
            topics.setdefault(names.topic(topic), []).append(trigger.name)
    topics[names.route] = [trigger.name for trigger in runtime.triggers.triggers]
    return topics


def lag_by_topic(app: OnceflowApp, workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The consumer group's lag summed per input topic, each topic's partitions beside it.

    Only the topics that reach triggers count (`input_topics`): the table changelogs a
    worker also consumes (recovery, standbys) are not the group's backlog.  A partition
    that two workers report (a rebalance in between) counts once, the further one.
    `unknown` counts the partitions whose end the worker has not seen yet (no fetch has
    answered for them).
    """
    names = app.runtime.names
    inputs = input_topics(app)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for worker in workers:
        for p in worker.get("partitions", ()):
            if p.get("topic") not in inputs:
                continue
            key = (p["topic"], p["partition"])
            seen = found.get(key)
            if seen is None or (p.get("committed") or 0) > (seen.get("committed") or 0):
                found[key] = {**p, "worker": worker.get("url")}
    topics = []
    for real, triggers in inputs.items():
        partitions = [found[key] for key in sorted(found) if key[0] == real]
        lags = [p["lag"] for p in partitions if p.get("lag") is not None]
        topics.append({"topic": names.logical(real), "name": real, "triggers": triggers,
                       "route": real == names.route,
                       "lag": sum(lags) if lags else None,
                       "unknown": len(partitions) - len(lags),
                       "partitions": [{key: p.get(key) for key in
                                       ("partition", "committed", "end", "lag", "worker")}
                                      for p in partitions]})
    return {"group": str(app.conf.id), "topics": topics}


async def ask_peers(app: OnceflowApp, path: str) -> tuple[list[Any], list[str]]:
    """The JSON answers of every other worker of the group to `path`, and who failed."""
    me = str(app.conf.canonical_url).rstrip("/")
    peers = [str(url).rstrip("/") for url in app.router.tables_metadata()]
    peers = [peer for peer in dict.fromkeys(peers) if peer != me]
    timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT)

    async def one(peer: str) -> Any:
        async with app.http_client.get(peer + path, timeout=timeout,
                                       headers={"Accept": "application/json"}) as response:
            if response.status != 200:
                raise aiohttp.ClientError(f"HTTP {response.status}")
            return orjson.loads(await response.read())

    answers = await asyncio.gather(*(one(peer) for peer in peers), return_exceptions=True)
    parts, failed = [], []
    for peer, answer in zip(peers, answers, strict=True):
        if isinstance(answer, BaseException):
            log.info("asking %s for %s failed: %r", peer, path, answer)
            failed.append(peer)
        else:
            parts.append(answer)
    return parts, failed


def add_console(app: OnceflowApp, settings: WorkerSettings,
                local_triggers: Any, merge_triggers: Any) -> None:
    """Register the console's page, its files and its JSON views."""
    runtime = app.runtime
    by_name = {trigger.name: trigger for trigger in runtime.triggers.triggers}
    document_reads = asyncio.Semaphore(DOCUMENT_READS)

    async def nosniff(request: Any, response: Any) -> None:
        response.headers.setdefault("X-Content-Type-Options", "nosniff")

    web_app = getattr(app.web, "web_app", None)  # aiohttp's application under Faust's
    if web_app is not None:
        web_app.on_response_prepare.append(nosniff)

    @app.page("/")
    async def index(web: Any, request: Request) -> Response:
        if not wants_html(request):
            return web.json({"status": "OK"})
        return web.bytes(asset("index.html"), content_type="text/html",
                         headers=SECURITY_HEADERS)

    @app.page("/console/{name}")
    async def files(web: Any, request: Request, name: str) -> Response:
        kind = STATIC.get(name)
        if kind is None:
            return web.json({"error": "not found"}, status=404)
        return web.bytes(asset(name), content_type=kind, headers=SECURITY_HEADERS)

    def me() -> dict[str, Any]:
        ok, ready = readiness(app, app.health)
        return {"url": str(app.conf.canonical_url).rstrip("/"), "ready": ok,
                "reasons": ready.get("reasons", []), "partitions": local_partitions(app),
                "triggers": local_triggers(app), "joins": local_joins(app)}

    @app.page("/overview")
    async def overview(web: Any, request: Request) -> Response:
        mine = me()
        if request.query.get("local"):
            return web.json(mine)
        parts, failed = await ask_peers(app, "/overview?local=1")
        workers = [mine, *parts]
        triggers = merge_triggers([w["triggers"] for w in workers])
        for facts in triggers.values():
            facts["definition"] = shown_definition(facts["definition"])
        joins = [join for w in workers for join in w["joins"]]
        for join in joins:
            join["trigger_timeout"] = format_duration(
                by_name[join["trigger"]].join_timeout) if join["trigger"] in by_name else None
        return web.json({
            "worker": mine["url"],
            "workers": [{key: w[key] for key in ("url", "ready", "reasons", "partitions")}
                        for w in workers],
            "unreachable": failed,
            "lag": lag_by_topic(app, workers),
            "triggers": triggers,
            "joins": joins,
        })

    @app.page("/journal/tail")
    async def tail(web: Any, request: Request) -> Response:
        mine = [record.as_dict() for record in runtime.metrics.recent]
        if request.query.get("local"):
            return web.json({"records": mine})
        parts, failed = await ask_peers(app, "/journal/tail?local=1")
        records = [*mine, *(r for part in parts for r in part.get("records", []))]
        records.sort(key=lambda r: (r.get("ts") is None, r.get("ts") or 0))
        return web.json({"records": records[-200:], "unreachable": failed})

    @app.page("/documents/{trigger}")
    async def documents(web: Any, request: Request, trigger: str) -> Response:
        definition = by_name.get(trigger)
        if definition is None:
            return web.json({"error": f"no trigger named {trigger!r}"}, status=404)
        outcome = request.query.get("outcome", IN_DOUBT)
        if outcome not in (IN_DOUBT, ERROR):
            return web.json({"error": f"outcome must be {IN_DOUBT} or {ERROR}"}, status=400)
        topic = definition.in_doubt if outcome == IN_DOUBT else definition.error
        real = runtime.names.topic(topic)
        try:
            async with document_reads:
                found = await read_tail(settings.cluster, real, MAX_DOCUMENTS,
                                        timeout=DOCUMENTS_TIMEOUT)
        except Exception as exc:  # the broker's failure: say so, the worker goes on
            log.info("reading %s failed: %r", real, exc)
            return web.json({"error": f"{real} cannot be read right now: {exc}"}, status=503,
                            headers={"Retry-After": "5"})
        items = []
        for record in found:
            headers: dict[str, str | None] = {}
            for name, value in record.headers or ():  # a header's value may be null
                headers[name] = None if value is None else value.decode("utf-8", "replace")
            try:
                value: Any = orjson.loads(record.value) if record.value is not None else None
            except orjson.JSONDecodeError:
                value = (record.value or b"").decode("utf-8", "replace")
            items.append({"partition": record.partition, "offset": record.offset,
                          "ts": record.timestamp / 1000,
                          "identity": headers.get("identity"),
                          "activation": headers.get("activation"),
                          "reason": headers.get("reason"), "value": value})
        return web.json({"trigger": trigger, "outcome": outcome, "topic": real,
                         "documents": items})

    @app.page("/dead-letters")
    async def dead_letters(web: Any, request: Request) -> Response:
        asked = request.query.get("limit", str(DEFAULT_DEAD_LETTERS))
        if not (asked.isascii() and asked.isdigit() and len(asked) <= 6
                and 1 <= int(asked) <= MAX_DEAD_LETTERS):
            return web.json({"error": f"limit must be a whole number from 1 to "
                                      f"{MAX_DEAD_LETTERS}"}, status=400)
        real = runtime.names.dead_letter
        try:
            async with document_reads:
                found = await read_tail(settings.cluster, real, int(asked),
                                        timeout=DOCUMENTS_TIMEOUT)
        except Exception as exc:  # the broker's failure: say so, the worker goes on
            log.info("reading %s failed: %r", real, exc)
            return web.json({"error": f"{real} cannot be read right now: {exc}"}, status=503,
                            headers={"Retry-After": "5"})
        return web.json({"topic": real, "limit": int(asked),
                         "records": [dead_letter_item(record) for record in found]})
