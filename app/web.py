"""The web views of a worker, on Faust's web server.

Views about one key (a history entry, a join) answer from the worker that owns the key's
partition: any worker takes the request and forwards it there.  /triggers gathers the
counts of every worker.  POST views need the admin token (header `Authorization: Bearer
TOKEN` or `X-Onceflow-Token: TOKEN`).
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
from typing import Any

import aiohttp
import orjson
from faust.web import Request, Response, View
from onceflow.agents import wire
from onceflow.agents.faust_app import OnceflowApp
from onceflow.agents.health import liveness, readiness, serving
from onceflow.agents.metrics import Gauges, exposition, worker_registry
from onceflow.durations import format_duration
from onceflow.envelope import seconds
from onceflow.errors import HistoryUnavailable, OnceflowError
from onceflow.history import HistoryEntry, state_keys
from onceflow.joins import current_state, open_join
from onceflow.journal import ERROR, IN_DOUBT
from onceflow.keys import key_prefix
from onceflow.partition import route_of
from onceflow.tables.outbox import Outbox
from onceflow.tables.state import PartitionStore, TableBuffer

from .console import add_console
from .ops import resubmit_documents
from .settings import WorkerSettings

log = logging.getLogger("onceflow.web")
# How long a forwarded request may take at the owning worker.
FORWARD_TIMEOUT = 10.0
RESUBMIT = "resubmit"


def retry_after(app: OnceflowApp) -> dict[str, str]:
    """The Retry-After header of a 503: about one group session.

    A dead worker's partitions move to the others after it.
    """
    seconds = max(1, math.ceil(app.conf.broker_session_timeout))
    return {"Retry-After": str(seconds)}


def unavailable(app: OnceflowApp, view: Any, reason: str, **fields: Any) -> Response:
    """503 with Retry-After: the answer is elsewhere, or not known while partitions move."""
    return view.error(503, reason, headers=retry_after(app), **fields)


def durable_store(app: OnceflowApp, table: str, partition: int, prefix: str) -> PartitionStore:
    """Read-only view of what is durable in one table partition."""
    state = app.runtime.tables[table]
    return PartitionStore(TableBuffer(state.raw(partition), state.changelog, partition), prefix)


def owner_url(app: OnceflowApp, partition: int) -> str | None:
    """The web address of the worker that owns a partition (None: unknown right now)."""
    changelog = app.runtime.tables["history"].changelog
    for url, topics in app.router.table_metadata("history").items():
        if partition in topics.get(changelog, ()):
            return str(url).rstrip("/")
    return None


async def forward(app: OnceflowApp, view: View, request: Request, partition: int
                  ) -> Response | None:
    """Forward to the owner of a partition; None when this worker owns it, recovered.

    503 with Retry-After while the owner is unknown or does not answer, or while
    partitions are moving.
    """
    owner = owner_url(app, partition)
    if owner is None:
        return unavailable(app, view, f"partition {partition} has no owner right now; "
                           "retry shortly", partition=partition)
    if owner == str(app.conf.canonical_url).rstrip("/"):
        if app.rebalancing or getattr(app, "in_recovery", False):
            return unavailable(app, view, f"partitions are moving (partition {partition} "
                               "is being assigned or recovered); retry shortly",
                               partition=partition)
        return None
    try:
        timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT)
        async with app.http_client.get(owner + request.path_qs, timeout=timeout) as response:
            body = await response.read()
            headers = {}
            if response.status == 503 and "Retry-After" in response.headers:
                headers["Retry-After"] = response.headers["Retry-After"]
            return view.bytes(body, content_type=response.content_type,
                              status=response.status, headers=headers)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        log.info("forwarding %s to %s failed: %r", request.path_qs, owner, exc)
        return unavailable(app, view, f"the worker that owns partition {partition} "
                           f"({owner}) does not answer; it may be down, and its partitions "
                           "move to the other workers after the group session; retry "
                           "shortly", partition=partition, owner=owner)


def token_name(settings: WorkerSettings, request: Request) -> str | None:
    """The name of the admin token the request carries (None: no token the workers take).

    ONCEFLOW_ADMIN_TOKEN is ONCEFLOW_ADMIN_TOKEN_NAME, ONCEFLOW_SECOND_ADMIN_TOKEN is
    ONCEFLOW_SECOND_ADMIN_TOKEN_NAME: what the request asks for is journaled under that
    name, never under the token.  Header values are compared as the bytes that came over
    the wire (the server decodes them with surrogateescape): a token that is not UTF-8 is
    simply a wrong token.  Every accepted token is compared, so the time taken does not
    tell which one matched.
    """
    given = request.headers.get("X-Onceflow-Token") or ""
    bearer = request.headers.get("Authorization") or ""
    if bearer.startswith("Bearer "):
        given = given or bearer[len("Bearer "):]
    if not given:
        return None
    accepted = [(token.get_secret_value(), name) for token, name in (
        (settings.admin_token, settings.admin_token_name),
        (settings.second_admin_token, settings.second_admin_token_name))
        if token is not None and token.get_secret_value()]
    try:
        data = given.encode("utf-8", "surrogateescape")
        matches = [name for token, name in accepted
                   if hmac.compare_digest(data, token.encode("utf-8", "surrogateescape"))]
    except UnicodeError:  # a lone surrogate that did not come from undecodable bytes
        return None
    return matches[0] if matches else None


def local_triggers(app: OnceflowApp) -> dict[str, Any]:
    """Every trigger as this worker sees it."""
    runtime = app.runtime
    facts = runtime.snapshot()
    out = {}
    for trigger in runtime.triggers.triggers:
        definition = dataclasses.asdict(trigger)
        out[trigger.name] = {"definition": definition,
                             "counts": runtime.metrics.by_trigger(trigger.name),
                             **facts[trigger.name]}
    return out


def merge_triggers(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's view summed up."""
    merged: dict[str, Any] = {}
    for part in parts:
        for name, facts in part.items():
            into = merged.setdefault(name, {"definition": facts["definition"], "counts": {},
                                            "suspended": False, "reason": "",
                                            "open_joins": 0, "history_entries": 0,
                                            "held": 0})
            for outcome, n in facts["counts"].items():
                into["counts"][outcome] = into["counts"].get(outcome, 0) + n
            if facts["suspended"]:
                into["suspended"], into["reason"] = True, facts["reason"]
            for field in ("open_joins", "history_entries", "held"):
                into[field] += facts[field]
    return merged


def add_web_views(app: OnceflowApp, settings: WorkerSettings) -> None:
    """Register the views on the app's web server."""
    runtime = app.runtime
    partitions = settings.partitions
    by_name = {trigger.name: trigger for trigger in runtime.triggers.triggers}

    @app.page("/ready")
    async def ready(web: Any, request: Request) -> Response:
        ok, body = readiness(app, app.health)
        return web.json(body, status=200 if ok else 503)

    @app.page("/readyz")
    async def readyz(web: Any, request: Request) -> Response:
        ok, body = readiness(app, app.health)
        return web.json(body, status=200 if ok else 503)

    @app.page("/servingz")
    async def servingz(web: Any, request: Request) -> Response:
        ok, body = serving(app, app.health)
        return web.json(body, status=200 if ok else 503)

    @app.page("/livez")
    async def livez(web: Any, request: Request) -> Response:
        ok, body = liveness(app, app.health)
        return web.json(body, status=200 if ok else 503)

    @app.page("/triggers")
    async def triggers(web: Any, request: Request) -> Response:
        mine = local_triggers(app)
        if request.query.get("local"):
            return web.json(mine)
        parts = [mine]
        me = str(app.conf.canonical_url).rstrip("/")
        timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT)
        for url in app.router.tables_metadata():
            peer = str(url).rstrip("/")
            if peer != me:
                try:
                    async with app.http_client.get(peer + "/triggers?local=1",
                                                   timeout=timeout) as response:
                        if response.status != 200:
                            raise aiohttp.ClientError(f"HTTP {response.status}")
                        parts.append(orjson.loads(await response.read()))
                except (aiohttp.ClientError, TimeoutError, OSError,
                        orjson.JSONDecodeError) as exc:
                    log.info("asking %s for its triggers failed: %r", peer, exc)
                    return unavailable(app, web, f"the worker at {peer} does not answer; "
                                       "it may be down, and its partitions move to the "
                                       "other workers after the group session; retry "
                                       "shortly", worker=peer)
        return web.json({"workers": len(parts), "triggers": merge_triggers(parts)})

    class HistoryView(View):
        async def get(self, request: Request, trigger: str, identity: str) -> Response:
            definition = by_name.get(trigger)
            if definition is None:
                return self.error(404, f"no trigger named {trigger!r}")
            activation = request.query.get("activation")
            partition = wire.route_partition(route_of(definition, identity, activation),
                                             partitions)
            forwarded = await forward(app, self, request, partition)
            if forwarded is not None:
                return forwarded
            key = state_keys(definition, identity, activation)[0]
            value = durable_store(app, "history", partition, key_prefix(trigger)).get(key)
            entry: dict[str, Any] | None = None
            if value is not None:
                try:
                    entry = HistoryEntry.stored(value).describe()
                except HistoryUnavailable as exc:
                    # Written by a version this one cannot read (or damaged): said, not
                    # guessed at.  Its documents are In Doubt until it is resubmitted.
                    entry = {"unreadable": str(exc)}
            return self.json({"trigger": trigger, "identity": identity,
                              "activation": activation, "entry": entry,
                              "history_ttl": definition.history_ttl / 1000,  # seconds
                              "history_ttl_text": format_duration(definition.history_ttl),
                              "partition": partition, "worker": str(app.conf.canonical_url)})

    class JoinView(View):
        async def get(self, request: Request, trigger: str, activation: str) -> Response:
            if trigger not in by_name:
                return self.error(404, f"no trigger named {trigger!r}")
            partition = wire.route_partition(activation, partitions)
            forwarded = await forward(app, self, request, partition)
            if forwarded is not None:
                return forwarded
            stored = durable_store(app, "joins", partition, key_prefix(trigger)).get(activation)
            # Members of expired joins that the activation remembers (their redelivery is
            # join-expired again) are not an open join.
            state = open_join(current_state(stored))
            if isinstance(state, dict) and isinstance(state.get("deadline"), int):
                state = {**state, "deadline": seconds(state["deadline"])}  # shown in seconds
            return self.json({"trigger": trigger, "activation": activation,
                              "open": state, "partition": partition,
                              "worker": str(app.conf.canonical_url)})

    class CommandView(View):
        async def post(self, request: Request, name: str, action: str) -> Response:
            by = token_name(settings, request)
            if by is None:
                return self.error(403, "this needs the admin token (ONCEFLOW_ADMIN_TOKEN)")
            if name not in by_name:
                return self.error(404, f"no trigger named {name!r}")
            if action == RESUBMIT:
                return await self.resubmit(request, name, by)
            if action not in (wire.SUSPEND, wire.RESUME):
                return self.error(404, f"unknown action {action!r}: suspend, resume or "
                                  "resubmit")
            outbox = Outbox()
            done = "suspended" if action == wire.SUSPEND else "resumed"
            reason = f"{done} by command ({by})"
            for partition in range(partitions):
                wire.add_control(outbox, runtime.names, partition, action,
                                 signer=runtime.signer, trigger=name,
                                 reason=reason, journal=partition == 0, by=by)
            await runtime.sender.send(outbox)
            log.info("%s of trigger %r asked by %s", action, name, by)
            return self.json({"trigger": name, "action": action, "partitions": partitions,
                              "by": by}, status=202)

        async def resubmit(self, request: Request, name: str, by: str) -> Response:
            """Body {"outcome": "in-doubt" or "error", "identities": [...] (none: all)}."""
            try:
                body = orjson.loads(await request.read())
            except (orjson.JSONDecodeError, UnicodeError):
                return self.error(400, "the body must be a JSON object")
            outcome = body.get("outcome") if isinstance(body, dict) else None
            identities = body.get("identities", []) if isinstance(body, dict) else None
            if outcome not in (IN_DOUBT, ERROR):
                return self.error(400, f'"outcome" must be "{IN_DOUBT}" or "{ERROR}"')
            if not (isinstance(identities, list) and len(identities) <= 1000
                    and all(isinstance(i, str) and len(i) <= 1000 for i in identities)):
                return self.error(400, '"identities" must be a list of at most 1000 '
                                  "strings (none: every document of that outcome)")
            skipped: list[str] = []
            try:
                done = await resubmit_documents(
                    runtime.triggers, by_name[name], settings, outcome=outcome,
                    identities=identities, dry_run=False, tell=skipped.append, by=by)
            except OnceflowError as exc:
                return self.error(409, str(exc))
            except Exception as exc:  # the broker's failure: the worker goes on
                log.warning("resubmit of %s failed: %r", name, exc)
                return unavailable(app, self, f"resubmit failed: {exc}; retry shortly")
            log.info("resubmit of %d %s document(s) of trigger %r asked by %s", len(done),
                     outcome, name, by)
            return self.json({"trigger": name, "outcome": outcome, "resubmitted": done,
                              "skipped": skipped, "by": by}, status=202)

    inputs = {trigger.name: tuple(dict.fromkeys(
        [*(runtime.names.topic(topic) for topic in trigger.topics), runtime.names.route]))
        for trigger in runtime.triggers.triggers}

    def gauges() -> Gauges:
        facts = runtime.snapshot()
        lag = {}
        monitor = app.monitor
        for tp in app.consumer.assignment():
            end = monitor.tp_end_offsets.get(tp)
            if end is not None:
                lag[(tp.topic, tp.partition)] = max(
                    0, end - (monitor.tp_committed_offsets.get(tp) or 0))
        return Gauges(open_joins={n: f["open_joins"] for n, f in facts.items()},
                      history_entries={n: f["history_entries"] for n, f in facts.items()},
                      lag=lag, suspended={n: f["suspended"] for n, f in facts.items()},
                      held={n: f["held"] for n, f in facts.items()},
                      ready=readiness(app, app.health)[0], inputs=inputs)

    registry = worker_registry(runtime.metrics, gauges)

    @app.page("/metrics")
    async def metrics(web: Any, request: Request) -> Response:
        body, content_type = exposition(registry, request.headers.get("Accept"))
        return web.bytes(body, headers={"Content-Type": content_type})

    add_console(app, settings, local_triggers, merge_triggers)
    app.page("/history/{trigger}/{identity}")(HistoryView)
    app.page("/joins/{trigger}/{activation}")(JoinView)
    app.page("/triggers/{name}/{action}")(CommandView)
