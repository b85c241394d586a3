"""The worker's probes: alive (/livez), serving its views (/servingz), processing (/readyz).

Ready means processing: the worker has joined the group, no rebalance is under way, its
tables are recovered, none of its partitions is paused, and the fetch loop has come round
since the last rebalance ended (so records are being taken again).  A worker the group
gives no partition (more workers than partitions) is ready: there is nothing for it to
process, and it answers the web views.

Serving means the worker has started: it joined the group and recovered the tables of its
first assignment, so its web views (the console, /triggers, history lookups forwarded to
the owners) answer with data.  It stays true through later rebalances, which is what a
load balancer in front of the web views needs: readiness drops every worker at once while
partitions move, exactly when an operator looks.

Alive means the event loop runs (a heartbeat task came round within LOOP_STALE seconds)
and the consumer is not stuck: outside a rebalance and when it has no chunk in hand, its
fetch loop came round within `stuck_after` seconds, and when records are waiting on an
assigned partition it handed some to the runtime within that time.
"""

from __future__ import annotations

import time
from typing import Any

from onceflow.partition import caught_up

LOOP_BEAT = 1.0  # seconds between heartbeats of the event loop
LOOP_STALE = 10.0  # a heartbeat older than this: the loop is blocked or starved


class Health:
    """What the probes look at, kept up to date by the app and its consumer."""

    def __init__(self, stuck_after: float) -> None:
        self.stuck_after = stuck_after
        self.started_at = time.monotonic()
        self.beat_at = self.started_at
        self.rebalance_started_at: float | None = None
        self.rebalance_ended_at: float | None = None
        self.rebalances = 0
        self.storage_error: str | None = None  # the local store failed: the worker stops
        # Since when no broker of the cluster answers (None: one does); app/broker_loss.py.
        self.broker_lost_since: float | None = None

    def beat(self) -> None:
        """The event loop came round (called every LOOP_BEAT seconds)."""
        self.beat_at = time.monotonic()

    def on_rebalance_start(self) -> None:
        """Partitions are moving."""
        self.rebalance_started_at = time.monotonic()
        self.rebalances += 1

    def on_rebalance_end(self) -> None:
        """Partitions are assigned, recovered and resumed."""
        self.rebalance_ended_at = time.monotonic()


def _route_partitions(app: Any, tps: Any) -> list[int]:
    route = app.runtime.names.route
    return sorted(tp.partition for tp in tps if tp.topic == route)


def _stream_topics(app: Any) -> frozenset[str]:
    delivery = app.bulk_delivery
    return delivery[0] if delivery else frozenset()


def consumer_stuck(app: Any, health: Health, now: float) -> str | None:
    """Why the consumer counts as stuck, or None."""
    consumer = app.consumer
    if app.rebalancing or getattr(app, "in_recovery", False):
        return None  # a rebalance or a recovery is progress of its own (see /readyz)
    if getattr(consumer, "handling_since", None) is not None:
        return None  # a chunk in hand: its services may wait and retry
    fetched = getattr(consumer, "fetched_at", None)
    since = fetched if fetched is not None else health.rebalance_ended_at
    if since is None:
        return None  # not consuming yet: that is readiness, not liveness
    if now - since > health.stuck_after:
        return f"the fetch loop has not come round for {now - since:.0f} s"
    marks = [t for t in (getattr(consumer, "delivered_at", None), health.rebalance_ended_at)
             if t is not None]
    delivered = max(marks) if marks else since
    if now - delivered > health.stuck_after and records_waiting(app):
        return (f"records are waiting on assigned partitions and none was taken for "
                f"{now - delivered:.0f} s")
    return None


def records_waiting(app: Any, partition: int | None = None) -> bool:
    """Whether an assigned partition of onceflow's topics has records not read yet.

    With `partition`, only that partition number counts, and one whose highwater is not
    known yet (not fetched since it was assigned) counts as waiting.
    """
    consumer = app.consumer
    topics = _stream_topics(app)
    try:
        for tp in consumer.assignment():
            if tp.topic not in topics or partition is not None and tp.partition != partition:
                continue
            highwater = consumer.highwater(tp)
            if highwater is None and partition is None:
                continue  # not fetched yet: for the stuck check, nothing is waiting
            # Not fetched yet (highwater None): nothing says the partition is idle.
            if not caught_up(highwater, consumer._read_offset.get(tp)):
                return True
    except Exception:  # the client has no answer for a partition right now
        return partition is not None
    return False


def liveness(app: Any, health: Health) -> tuple[bool, dict[str, Any]]:
    """(alive, what the probe found)."""
    now = time.monotonic()
    problems = []
    beat_age = now - health.beat_at
    if beat_age > LOOP_STALE:
        problems.append(f"the event loop's heartbeat is {beat_age:.0f} s old")
    stuck = consumer_stuck(app, health, now)
    if stuck:
        problems.append(stuck)
    thread = getattr(app.consumer, "_thread", None)
    if thread is not None and getattr(thread, "_thread", None) is not None \
            and not thread._thread.is_alive():
        problems.append("the consumer thread has stopped")
    return not problems, {"alive": not problems, "problems": problems,
                          "loop_heartbeat_age": round(beat_age, 3)}


def serving(app: Any, health: Health) -> tuple[bool, dict[str, Any]]:
    """(serving, why not): the worker has started and its web views answer."""
    started = health.rebalance_ended_at is not None
    body: dict[str, Any] = {"serving": started, "reasons": [] if started else [
        "the worker has not joined the group and recovered its tables yet"]}
    if started:
        body["processing"] = not app.rebalancing and not getattr(app, "in_recovery", False)
    return started, body


def readiness(app: Any, health: Health) -> tuple[bool, dict[str, Any]]:
    """(ready, why not): ready means the worker's partitions are being processed."""
    now = time.monotonic()
    consumer = app.consumer
    reasons = []
    assigned: list[int] = []
    if health.storage_error is not None:
        reasons.append(f"the worker stops: {health.storage_error}")
    if health.rebalance_ended_at is None:
        reasons.append("the worker has not joined the group and recovered its tables yet")
    else:
        assigned = _route_partitions(app, app.assignor.assigned_actives())
    if app.rebalancing:
        reasons.append("partitions are moving (a rebalance is under way)")
    recovery = app.tables.recovery
    if getattr(app, "in_recovery", False) or not recovery.completed.is_set():
        reasons.append("tables are being recovered from their changelogs")
    topics = _stream_topics(app)
    paused = sorted({tp.partition for tp in getattr(consumer, "_paused_partitions", ())
                     if tp.topic in topics})
    if paused and assigned:
        reasons.append(f"partitions {paused} are paused")
    fetched = getattr(consumer, "fetched_at", None)
    if health.rebalance_ended_at is not None and assigned and (
            fetched is None or fetched < health.rebalance_ended_at):
        reasons.append("the consumer has not fetched since the last rebalance")
    stuck = consumer_stuck(app, health, now)
    if stuck:
        reasons.append(stuck)
    if health.broker_lost_since is not None:
        reasons.append(f"no broker has answered for {now - health.broker_lost_since:.0f} s")
    body = {"ready": not reasons, "reasons": reasons, "partitions": assigned,
            "rebalances": health.rebalances}
    if not reasons and not assigned:
        body["note"] = "no partition assigned to this worker (more workers than partitions)"
    return not reasons, body
