"""What every partition of a worker shares: triggers, options, tables, the producer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from onceflow.calls import Callee
from onceflow.tables.outbox import Sender
from onceflow.tables.raw_partition import RawPartition
from onceflow.triggers import TriggerSet

from .metrics import Metrics
from .signing import RouteSigner
from .topics import AnyTopic, TopicMaker
from .wire import Names

TABLES = ("ingress", "history", "joins", "control")


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs (the app's settings, in the terms the agents need)."""

    partitions: int = 4
    prefix: str = ""
    service_concurrency: int = 64
    tick_interval: float = 1.0
    idle_ticks: bool = True
    idle_after: float = 2.0
    history_sweeps: bool = True
    max_document_bytes: int = 1_000_000
    # The largest record batch the broker takes (Kafka's message.max.bytes): nothing the
    # worker writes may be larger (see limits.py).
    max_record_bytes: int = 1_048_588
    # How far ahead of the wall clock partition time may run (agents/clock.py), seconds.
    max_clock_skew: float = 300.0
    # Topics read although no trigger takes documents from them: every record on them is
    # bad input (a live replay reads every topic its scenario writes).
    extra_topics: tuple[str, ...] = ()
    # Topics the worker creates on the fly (reply-to topics): replicas (-1: the broker's
    # default), topic configs, and whether it may create topics at all.
    replication_factor: int = -1
    topic_config: tuple[tuple[str, str], ...] = ()
    create_topics: bool = True
    # The most records of a fetch handed to the runtime at once (agents/transport.py): each
    # chunk is decided and made durable together, and a rebalance waits for the one in hand.
    chunk_size: int = 1000
    # Seconds the consumer may go without coming round (or without taking waiting records)
    # before /livez reports it stuck (health.py).
    stuck_after: float = 120.0
    # Keys of route-topic signatures (agents/signing.py): the one records are signed with,
    # then any other accepted; none: route records are neither signed nor checked.
    route_keys: tuple[bytes, ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True)
class StateTable:
    """One table as onceflow uses it: its changelog topic and its local partitions."""

    name: str
    changelog: str
    raw: Callable[[int], RawPartition]


class Shared:
    """The triggers, options, tables and producer that a worker's partitions share."""

    def __init__(
        self,
        triggers: TriggerSet,
        callees: dict[str, tuple[Callee, Callee | None]],
        options: WorkerOptions,
        tables: dict[str, StateTable],
        sender: Sender,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Share what a worker's partitions share.

        `sleep` waits between service attempts: real time in a worker; a harness that runs
        a worker's partitions on simulated time (tests/agents) hands in its own.
        """
        self.triggers = triggers
        self.callees = callees
        self.options = options
        self.names = Names(options.prefix)
        self.signer = RouteSigner(options.route_keys)
        self.tables = tables
        self.sender = sender
        # Creates reply-to topics that do not exist (the Faust app sets a Kafka one).
        self.topics: TopicMaker = AnyTopic()
        self.monotonic = monotonic
        self.wall_clock = wall_clock  # what partition time may not run far ahead of
        self.metrics = Metrics()
        self._slots: asyncio.Semaphore | None = None
        self.retry_sleep = sleep
        # Plain (`def`) services run here, never on the event loop (see batch.py).
        self._service_threads: ThreadPoolExecutor | None = None
        # The history sweeps' horizon (onceflow.partition.SweepHorizon); the Faust app
        # sets it, from the records it hands over and their commits.
        self.horizon: Callable[[], int | None] = lambda: None
        # Why this worker can no longer be sure it owns its partitions (the group may have
        # given them to another worker), or None; the Faust app sets the consumer's check.
        self.ownership: Callable[[], str | None] = lambda: None
        # Partitions whose results were dropped since the current batch began (ownership),
        # with the object that dropped them.
        self.dropped: dict[int, object] = {}

    @property
    def slots(self) -> asyncio.Semaphore:
        """Bounds how many services run at once on this worker."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.options.service_concurrency)
        return self._slots

    async def offload(self, function: Callable[[], Any]) -> Any:
        """Run a plain function in a service thread and wait for it (the loop goes on).

        Up to service_concurrency threads, made as needed: partitions settle side by side.
        """
        if self._service_threads is None:
            self._service_threads = ThreadPoolExecutor(
                max_workers=self.options.service_concurrency,
                thread_name_prefix="onceflow-service")
        return await asyncio.get_running_loop().run_in_executor(self._service_threads,
                                                                 function)

    def sweep_horizon(self) -> int | None:
        """History sweeps judge entries on no later time than this, in ms (None: no limit).

        What it is and why: onceflow.partition.SweepHorizon.
        """
        return self.horizon()

    def forget_partitions(self, partitions: list[int]) -> None:
        """Drop the in-memory state of partitions (revoked, or not to be trusted)."""
