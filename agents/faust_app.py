"""The Faust application of a worker: tables, the two agents, the clock, the producer.

The agents stay thin: ingress (the input topics) and triggers (the repartition topic)
take the records of each fetch in bulk (see transport.py) and hand them to the runtime,
which decides, runs and makes the batch durable before it returns; only then does Faust
acknowledge the records and, later, commit their offsets.  Tables are Faust tables
(RocksDB, changelogged, assigned and recovered by Faust), written in bulk by the runtime:
one producer batch per changelog partition per flush instead of one send per write.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import faust
from aiokafka import AIOKafkaProducer
from faust.types import TP
from onceflow.calls import Callee
from onceflow.partition import SweepHorizon, caught_up
from onceflow.tables.outbox import KafkaSender, Outbox
from onceflow.tables.raw_partition import DictPartition, RawPartition, RocksPartition, StorageError
from onceflow.triggers import TriggerSet

from . import store as _store  # noqa: F401  (registers the onceflow-rocksdb:// store)
from . import wire
from .context import TABLES, StateTable, WorkerOptions
from .health import LOOP_BEAT, Health, records_waiting
from .highwaters import bootstrap_of, client_auth
from .runtime import Runtime
from .topics import KafkaTopicMaker
from .transport import Transport

log = logging.getLogger("onceflow.worker")
# The offsets of every batch, at INFO (ONCEFLOW_DEBUG_BATCHES=true); quiet otherwise.
batch_log = logging.getLogger("onceflow.batches")
batch_log.setLevel(logging.WARNING)


class OnceflowApp(faust.App):
    """A Faust app on onceflow's transport, with the raw producer the runtime writes with."""

    runtime: Runtime
    health: Health
    bulk_delivery: Any = None
    route_topics: frozenset[str] = frozenset()
    onceflow_producer: AIOKafkaProducer | None = None
    # (monotonic time, the input partitions' end offsets then), newest last: what the
    # idle timer compares the group's committed offsets with (group_caught_up).
    input_ends: deque[tuple[float, dict[Any, int]]]
    storage_failure: StorageError | None = None  # the local store failed: it stops

    def _new_transport(self) -> Any:
        return Transport(self.conf.broker_consumer, self)

    async def on_start(self) -> None:
        """Start the producer the runtime flushes batches with."""
        await super().on_start()
        self.consumer.bulk_delivery = self.bulk_delivery
        self.consumer.route_topics = self.route_topics
        if self.onceflow_producer is None:
            bootstrap = bootstrap_of(self.conf.broker_producer)
            auth = client_auth(self.conf)
            options = self.runtime.options
            limit = options.max_record_bytes
            # A producer batch never exceeds what the broker takes (a record that does not
            # fit beside others goes in a batch of its own, within the limit: limits.py).
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                linger_ms=0, max_batch_size=min(1024 * 1024, limit),
                max_request_size=max(8 * 1024 * 1024, limit + 1024), **auth)
            await producer.start()
            self.onceflow_producer = producer
            self.runtime.sender = KafkaSender(producer, max_record_bytes=limit)
            self.runtime.topics = KafkaTopicMaker(
                bootstrap, options.partitions, auth=auth,
                replication=options.replication_factor, config=dict(options.topic_config),
                create=options.create_topics)

    def on_rebalance_start(self) -> None:
        """Partitions start moving (called from the consumer's thread)."""
        super().on_rebalance_start()
        self.health.on_rebalance_start()

    def on_rebalance_end(self) -> None:
        """Partitions are assigned, recovered and resumed."""
        super().on_rebalance_end()
        self.health.on_rebalance_end()

    async def on_stop(self) -> None:
        """Stop the producer after Faust stopped consuming."""
        await super().on_stop()
        if self.onceflow_producer is not None:
            await self.onceflow_producer.stop()
            self.onceflow_producer = None
            await self.runtime.topics.close()


def raw_partitions(table: Any) -> Callable[[int], RawPartition]:
    """Local partitions of a Faust table: its RocksDB databases, or dicts in memory."""
    store = table.data
    if hasattr(store, "_db_for_partition"):
        return lambda partition: RocksPartition(store, partition)
    memory: dict[int, DictPartition] = {}
    return lambda partition: memory.setdefault(partition, DictPartition())


# Faust's own web views: `/table/...` serves raw table contents (history entries, the
# duplicate-ID cache, the documents of open joins, partition time), `/router/...` the
# cluster's addresses and key owners, `/`, `/assignment/`, `/graph` and `/performance/`
# internals.  None is guarded, and onceflow uses none of them (its views ask Faust's router
# directly), so all are off.  Set after the app is built, because Faust lets environment
# variables (APP_WEB_TABLES_ENABLED, ...) override what the app is given.
FAUST_VIEWS_OFF = ("web_tables_enabled", "web_router_enabled", "web_stats_enabled",
                   "web_graph_enabled", "web_metrics_enabled")


def build_app(triggers: TriggerSet, callees: dict[str, tuple[Callee, Callee | None]],
              options: WorkerOptions, faust_settings: dict[str, Any]) -> OnceflowApp:
    """The Faust app of a worker (not started)."""
    names = wire.Names(options.prefix)
    app = OnceflowApp(names.app_id, **faust_settings)
    for setting in FAUST_VIEWS_OFF:
        setattr(app.conf, setting, False)
    partitions = options.partitions
    tables = {}
    for name in TABLES:
        table = app.Table(name, partitions=partitions, key_type=bytes, value_type=bytes,
                          help=f"onceflow {name} state")
        tables[name] = StateTable(name, table.changelog_topic.get_topic_name(),
                                  raw_partitions(table))
    runtime = Runtime(triggers, callees, options, tables, sender=_NotStarted())
    if not runtime.signer.enabled:
        log.warning("onceflow: ONCEFLOW_ADMIN_TOKEN is not set: records on %s are neither "
                    "signed nor checked, so anyone who can write to that topic can suspend "
                    "triggers, remove history entries and route documents past the "
                    "duplicate-ID cache (see the trust model in docs/operations.md)",
                    runtime.names.route)
    app.runtime = runtime
    app.health = Health(stuck_after=options.stuck_after)
    runtime.ownership = lambda: ownership_doubt(app)
    uncommitted = SweepHorizon()  # the records handed, until Faust commits their offsets
    if options.history_sweeps:
        runtime.horizon = lambda: uncommitted.oldest(app.consumer._committed_offset)

    async def consume(deliveries: list[wire.Delivery]) -> bool:
        """The two agents' work: ingress (input topics) and triggers (repartition topic).

        False when the records were not decided (the worker may have lost its partitions).
        """
        if batch_log.isEnabledFor(logging.INFO):
            spans: dict[tuple[str, int], list[int]] = {}
            for delivery in deliveries:
                spans.setdefault((delivery.topic, delivery.partition), []).append(
                    delivery.offset)
            batch_log.info("batch %s", {f"{topic}/{partition}": (min(o), max(o), len(o))
                                        for (topic, partition), o in spans.items()})
        if app.storage_failure is not None:
            # The local store failed: nothing more is decided or acknowledged.
            await asyncio.Event().wait()
        if options.history_sweeps:
            for delivery in deliveries:
                uncommitted.handed(delivery.handle, delivery.offset, delivery.ts)
        try:
            return await runtime.handle(deliveries)
        except StorageError as exc:
            # Not a record's fault: nothing is dead-lettered or acknowledged; one line for
            # the operator (however many partitions and tables fail), and /readyz says so.
            if app.storage_failure is None:
                app.storage_failure = exc
                app.health.storage_error = str(exc)
                log.critical("onceflow: %s; the worker stops (exit code 4): free space or "
                             "fix the disk under ONCEFLOW_DATA_DIR and restart it; nothing "
                             "is lost", exc)
                # Stopped as by SIGTERM (it leaves the group at once), not crashed: a crash
                # adds a traceback from each of Faust's services to the one line above.
                os.kill(os.getpid(), signal.SIGTERM)
            # Never returns: this batch is not acknowledged, nor any after it.
            await asyncio.Event().wait()
            raise  # not reached: the wait above never ends
        except Exception as exc:
            # Fail-stop: the batch is not acknowledged, so after a restart it is
            # delivered again and decided on what is durable.
            log.critical("onceflow: a batch failed; the worker stops: %r", exc)
            await app.crash(exc)
            raise

    # Raw bytes: ingress decides what a value is (Faust would drop what is not JSON).
    raw = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
           "value_serializer": "raw", "partitions": partitions}
    inputs = app.topic(*runtime.input_topics, **raw)
    route = app.topic(names.route, **raw)
    app.topics.add(inputs)
    app.topics.add(route)
    app.bulk_delivery = (frozenset((*runtime.input_topics, names.route)), consume)
    app.route_topics = frozenset((names.route,))

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: set[Any], **_: Any) -> None:
        runtime.forget_partitions(sorted({tp.partition for tp in revoked}))

    @app.timer(LOOP_BEAT)
    async def heartbeat() -> None:
        app.health.beat()

    @app.timer(options.tick_interval)
    async def clock() -> None:
        await tick_idle_partitions(app, runtime, options)

    return app


def ownership_doubt(app: OnceflowApp) -> str | None:
    """Why the group may have given this worker's partitions to another, or None.

    aiokafka leaves the group once its consumer has not fetched for the max poll interval
    (a chunk whose services run longer), and the group goes on without a member that has
    not rejoined within the rebalance timeout (a revocation waiting for such a chunk); the
    partitions' next owners may then decide the same documents.  A margin of a heartbeat
    interval: the consumer's clock and the group's do not start at the same instant.
    """
    consumer = app.consumer
    conf = app.conf
    now = time.monotonic()
    margin = conf.broker_heartbeat_interval
    fetched = getattr(consumer, "fetched_at", None)
    poll = conf.broker_max_poll_interval
    if fetched is not None and now - fetched >= poll - margin:
        return (f"its consumer has not fetched for {now - fetched:.1f} s, "
                f"ONCEFLOW_MAX_POLL_INTERVAL is {poll:g} s")
    since = getattr(consumer, "revoking_since", None)
    rebalance = conf.broker_rebalance_timeout
    if since is not None and now - since >= rebalance - margin:
        return (f"a rebalance has waited {now - since:.1f} s for it, the group's "
                f"rebalance timeout is {rebalance:g} s")
    return None


async def tick_idle_partitions(app: OnceflowApp, runtime: Runtime,
                               options: WorkerOptions) -> None:
    """Send wall-clock ticks to idle partitions; resume triggers whose resources are back.

    Idle: nothing taken on the partition for `idle_after` seconds and nothing waiting on
    it.  A partition with a backlog (a worker catching up after a rebalance, a restart or
    a stall) is not idle: a tick at wall-clock time there would expire its joins before
    their members, still in the backlog, arrive.
    """
    if app.onceflow_producer is None:
        return
    outbox = Outbox()
    names = runtime.names
    if options.idle_ticks:
        now = runtime.wall_clock()  # seconds, as ticks carry time on the wire
        started = runtime.monotonic()
        idle = []
        for tp in app.assignor.assigned_actives():
            if tp.topic != names.route:
                continue
            worker = runtime.workers.get(tp.partition)
            if (worker is None or started - worker.last_record_at >= options.idle_after) \
                    and not records_waiting(app, tp.partition):
                idle.append(tp.partition)
        if idle and await group_caught_up(app, runtime):
            for partition in idle:
                wire.add_control(outbox, names, partition, wire.TICK,
                                 signer=runtime.signer, ts=now)
    suspended = {name for worker in list(runtime.workers.values())
                 for name, processor in worker.processors.items() if processor.suspended}
    for name in sorted(suspended):
        check = runtime.triggers.by_name(name).resource_check
        if check and await resource_available(check, runtime):
            for partition in range(options.partitions):
                wire.add_control(outbox, names, partition, wire.RESUME,
                                 signer=runtime.signer, trigger=name,
                                 reason="resource check reports available",
                                 journal=partition == 0)
    if outbox.count:
        await runtime.sender.send(outbox)


# How long the idle timer waits for the group's offsets before it skips a tick.
GROUP_OFFSETS_TIMEOUT = 5.0


async def group_caught_up(app: OnceflowApp, runtime: Runtime) -> bool:
    """Whether the whole group has read every input record (no worker has a backlog).

    A partition's own records are not all that feeds it: documents of any input partition
    are routed to the partition of their routing key.  While another worker still works
    through a backlog (after a failover, a restart, a stall), a member of an open join
    here may be in it; a wall-clock tick now would expire that join before the member
    arrives.  So a worker ticks its idle partitions only when every input partition's
    committed offset has reached its end.  Any doubt (no answer in time) is no tick.
    """
    partitions = runtime.options.partitions
    wanted = [TP(topic, p) for topic in runtime.input_topics for p in range(partitions)]
    if not wanted:
        return True
    thread = app.consumer._thread
    try:
        ends, committed = await asyncio.wait_for(
            asyncio.gather(app.consumer.highwaters(*wanted), thread.group_committed(wanted)),
            GROUP_OFFSETS_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - no answer: no tick this time
        log.debug("onceflow: the group's offsets could not be read (%r): no idle tick", exc)
        return False
    # Offsets are committed a little after their records are decided (Faust commits every
    # few seconds), so on a deployment that keeps up with steady traffic the committed
    # offsets are always a little behind the ends.  What counts is that the group has
    # committed every record that was there one commit interval ago: a worker with a
    # backlog has not.
    now = runtime.monotonic()
    history = getattr(app, "input_ends", None)
    if history is None:
        history = app.input_ends = deque()
    history.append((now, dict(ends)))
    window = float(app.conf.broker_commit_interval) + runtime.options.tick_interval
    while len(history) > 1 and now - history[1][0] >= window:
        history.popleft()
    then, old_ends = history[0]
    if now - then < window:
        old_ends = ends  # no snapshot that old yet: every record must be committed
    for tp in wanted:
        end = old_ends.get(tp)
        done = committed.get((tp.topic, tp.partition))
        if not caught_up(end, None if done is None else done - 1):
            return False
    return True


async def resource_available(spec: str, runtime: Runtime) -> bool:
    """Ask a trigger's resource check (a "package.module:function" returning true)."""
    from onceflow.calls import load_callee

    try:
        check = load_callee(spec, {}, source=runtime.triggers.source, where="resource_check")
        answer = check.function()
        if asyncio.iscoroutine(answer):
            answer = await answer
        return bool(answer)
    except Exception as exc:
        log.warning("resource check %s failed: %r", spec, exc)
        return False


class _NotStarted:
    """The sender before the app has started its producer."""

    async def send(self, outbox: Outbox) -> dict[tuple[str, int], int]:
        raise RuntimeError("the worker's producer is not started yet")
