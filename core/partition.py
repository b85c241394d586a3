"""The rules of one partition, the same for every runner.

A partition's triggers share one partition time.  `Partition` holds the rules that depend
on it, and on nothing a runner owns: time moves only forward (to a limit, when the runner
has one), joins whose deadline is behind it expire, history is swept on a schedule kept per
trigger, suspended triggers hold their documents and redeliver them in order on resume, and
history entries are loaded (seeded) or forgotten by key.

`onceflow replay` drives it through `Engine`, the Spark pipeline through `Engine` per group
of a routing key, and the worker once per fetched batch of a partition (agents/partition_worker.py),
which keeps the held documents in its control table (a `Holding` of its own) instead of
memory.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Protocol

from .envelope import Document, Timestamp
from .errors import HistoryUnavailable
from .history import state_keys
from .journal import SUSPENDED, JournalRecord
from .processor import TriggerProcessor
from .triggers import TriggerDef


def route_of(trigger: TriggerDef, identity: str, activation: str | None) -> str:
    """Where a trigger keeps a document's state: its activation for joins, else identity.

    A join trigger's document without an activation is bad input for that trigger and keeps
    no state, so any key will do: its identity spreads them out.  Every runner routes by
    this key (the worker's repartition topic, the Spark stage's groups, the web views).
    """
    if activation is not None and trigger.routes_by_activation:
        return activation
    return identity


def routing_key(trigger: TriggerDef, doc: Document) -> str:
    """The routing key of a document (route_of its identity and activation)."""
    return route_of(trigger, doc.identity, doc.activation)


def seed_route(trigger: TriggerDef, identity: str, activation: str | None) -> str | None:
    """The routing key of a history seed; None: it applies to every routing key.

    A join trigger's seed without an activation applies to every activation.
    """
    if activation is None and trigger.routes_by_activation:
        return None
    return route_of(trigger, identity, activation)


def caught_up(highwater: int | None, last_read: int | None) -> bool:
    """Whether a consumer has read every record of a topic partition (it has no lag).

    `highwater`: the offset the broker gives the next record (None: not known yet, as
    before the first fetch); `last_read`: the offset of the last record read (None: none).
    Only a caught-up partition is idle: the wall clock may move its time then, and only
    then, so that a worker restarting after an outage expires joins on the record times
    of its backlog, as a replay would, not all at once on the wall clock.
    """
    if highwater is None:
        return False
    return highwater - 1 <= (-1 if last_read is None else last_read)


def _clock_time(ts: Timestamp) -> str:
    """A record time in ms for a message: ISO 8601 in UTC, with the seconds it stands for."""
    try:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts / 1000))
    except (OverflowError, OSError, ValueError):
        return f"{ts!r} ms"
    return f"{stamp} ({ts / 1000:.3f})"


class ClockLimit:
    """How far partition time may run ahead of a runner's wall clock (the worker's).

    Partition time is the newest record time seen on the partition, and it is stored: one
    record stamped in year 9999 would expire every join opened on that partition afterwards,
    after every restart too.  So a partition with a clock limit never moves its time past
    the wall clock plus the skew:

    - a time beyond it is refused where it comes in (`Partition.time_refused`): the worker
      makes an input record `bad-input` at ingress, and a tick `bad-input` on the
      repartition topic;
    - a time that comes in all the same (a routed document whose ingress worker's clock is
      ahead of this one's) is decided on its own time, and moves partition time only up to
      the limit (`Partition.advance`);
    - a stored partition time beyond it (written before this limit existed, or this
      machine's clock went back) starts again from the wall clock (`Partition.start_at`).

    Replay and the Spark pipeline run on the scenario's time, which has no wall clock to be
    ahead of: their partitions have no limit.  `wall_clock` reads the clock in ms, `skew`
    is in ms, and `name` is how a message names the setting (with its value).
    """

    __slots__ = ("wall_clock", "skew", "name")

    def __init__(self, wall_clock: Callable[[], Timestamp], skew: Timestamp,
                 name: str) -> None:
        self.wall_clock = wall_clock
        self.skew = skew
        self.name = name

    def latest(self, wall: Timestamp) -> Timestamp:
        """The latest partition time allowed when the wall clock reads `wall`."""
        return wall + self.skew

    def ahead(self, ts: Timestamp, wall: Timestamp) -> str | None:
        """Why ts is too far ahead of the wall clock at `wall`, or None."""
        if ts <= self.latest(wall):
            return None
        return (f"its time {_clock_time(ts)} is {(ts - wall) / 1000:.6g} s ahead of this "
                f"worker's clock, more than {self.name}: it would move partition time "
                f"forward and expire every open join of the partition")


class SweepHorizon:
    """The time as of which a runner that may be handed records again sweeps history.

    A history entry may only be swept once no record the runner may still be handed
    again could see it: a record is judged on its own record time, and after a crash every
    record whose offset was not committed is handed again.  So the horizon is the oldest
    record time among the records handed whose offsets are not committed yet (None: there
    are none), and `Partition.sweep_due` removes entries as of no later than it.  The
    worker keeps one (agents/faust_app.py: Faust hands it the records and their commits);
    replay and the Spark pipeline never sweep.
    """

    __slots__ = ("_handed",)

    def __init__(self) -> None:
        # Per topic partition (the runner's handle for it): (offset, record time), in order.
        self._handed: dict[Hashable, deque[tuple[int, Timestamp]]] = {}

    def handed(self, source: Hashable, offset: int, ts: Timestamp) -> None:
        """A record handed to the runner: at `offset` of `source`, stamped ts."""
        queue = self._handed.get(source)
        if queue is None:
            queue = self._handed[source] = deque()
        queue.append((offset, ts))

    def oldest(self, committed: Mapping[Hashable, int]) -> Timestamp | None:
        """The horizon, given each source's committed offset (the next one to read).

        The records before their source's committed offset are forgotten: they are never
        handed again.
        """
        oldest: Timestamp | None = None
        for source, queue in self._handed.items():
            done = committed.get(source)
            while queue and done is not None and queue[0][0] < done:
                queue.popleft()
            for _, ts in queue:
                if oldest is None or ts < oldest:
                    oldest = ts
        return oldest


class Holding(Protocol):
    """Where a partition keeps the documents of its suspended triggers."""

    def add(self, trigger: str, doc: Document) -> str | None:
        """Keep doc; None when kept, else why it cannot be kept."""

    def drain(self, trigger: str) -> list[Document]:
        """Every document kept for trigger, oldest first; none stay kept."""

    def mark(self, trigger: str, reason: str | None) -> None:
        """Record that trigger is suspended for reason (None: no longer suspended)."""

    def suspensions(self) -> dict[str, str]:
        """The suspensions recorded (by mark) before this run: {trigger: reason}."""


class HeldInMemory:
    """Held documents in lists (replay, tests, one Spark group): nothing is refused."""

    def __init__(self, triggers: list[str]) -> None:
        self.documents: dict[str, list[Document]] = {name: [] for name in triggers}

    def add(self, trigger: str, doc: Document) -> str | None:
        """Keep doc (always kept)."""
        self.documents[trigger].append(doc)
        return None

    def drain(self, trigger: str) -> list[Document]:
        """Every document kept for trigger, oldest first."""
        docs = self.documents[trigger]
        self.documents[trigger] = []
        return docs

    def mark(self, trigger: str, reason: str | None) -> None:
        """Nothing to record: a suspension lives as long as the processor."""

    def suspensions(self) -> dict[str, str]:
        """None: nothing outlives the run."""
        return {}


class Partition:
    """Partition time and the state rules that follow it, for a partition's triggers.

    The suspensions its holding recorded before (a worker's restart) hold again from the
    start.
    """

    def __init__(self, processors: dict[str, TriggerProcessor], holding: Holding,
                 clock: ClockLimit | None = None) -> None:
        self.processors = processors
        self.holding = holding
        self.clock = clock
        self.now: Timestamp | None = None  # partition time, in ms
        self._joins = [(p, p.joins) for p in processors.values() if p.joins is not None]
        self._history_processors = [p for p in processors.values() if p.history is not None]
        self._next_sweep: dict[str, int] = {}
        self._sweep_due = float("-inf")
        for name, reason in holding.suspensions().items():
            # Suspended before a restart (the worker's control table): suspended again,
            # with no record (the suspension had its own) and nothing marked again.
            processors[name].suspend(reason)

    # -- time -----------------------------------------------------------------------------

    def start_at(self, stored: Timestamp | None) -> str | None:
        """Partition time as stored; None: it was, else why it starts from the wall clock.

        A stored time beyond the clock limit starts again from the wall clock.
        """
        self.now = stored
        clock = self.clock
        if stored is None or clock is None:
            return None
        wall = clock.wall_clock()
        why = clock.ahead(stored, wall)
        if why is not None:
            self.now = wall
        return why

    def time_refused(self, ts: Timestamp, tick: bool = False) -> str | None:
        """Why a record's time (or a tick's) may not come in, or None: it may.

        Only a time beyond the clock limit is refused.  A record at or behind partition
        time moves nothing and always comes in; a tick is checked whatever partition time.
        """
        clock = self.clock
        if clock is None:
            return None
        now = self.now
        if not tick and now is not None and ts <= now:
            return None
        return clock.ahead(ts, clock.wall_clock())

    def advance(self, ts: Timestamp, journal: list[JournalRecord]) -> bool:
        """Move partition time to ts (never back, never past the clock limit); expire what is due.

        A record at or behind partition time (a late record) moves nothing, but may have
        opened a join whose deadline is already behind it: that join expires here too.
        Returns whether time moved.
        """
        now = self.now
        moved = now is None or ts > now
        if moved:
            clock = self.clock
            if clock is not None:
                limit = clock.latest(clock.wall_clock())
                if ts > limit:
                    ts = limit
                    moved = now is None or ts > now
        if moved:
            self.now = now = ts
        if now is not None:
            self.expire_at(now, journal)
        return moved

    def expire_at(self, now: Timestamp, journal: list[JournalRecord]) -> None:
        """Expire every open join whose deadline is before now (time does not move)."""
        for processor, joins in self._joins:
            deadlines = joins.deadlines
            if deadlines and deadlines[0][0] < now:
                journal.extend(processor.expire(now))

    def sweep_is_due(self, now: Timestamp) -> bool:
        """Whether some trigger's sweep is due at now (so sweep_due would sweep)."""
        return now >= self._sweep_due

    def sweep_due(self, now: Timestamp, horizon: Timestamp | None = None,
                  force: str | None = None) -> int:
        """Sweep the history of each trigger whose sweep is due at now (or `force`: that one).

        A trigger's first sweep is due one history_sweep_interval after the first call.
        Entries are removed as of `horizon` when it is earlier than now (the oldest record
        time the runner may still be handed again: see SweepHorizon, where the horizon is
        described once).  Returns how many entries were removed.
        """
        if force is None and now < self._sweep_due:
            return 0
        at = now if horizon is None or horizon > now else horizon
        removed = 0
        due = float("inf")
        for processor in self._history_processors:
            trigger = processor.trigger
            name = trigger.name
            next_due = self._next_sweep.get(name)
            due_now = force == name or (next_due is not None and now >= next_due)
            if due_now:
                removed += processor.sweep(at)
            if next_due is None or due_now:  # first call, or swept: schedule the next one
                next_due = self._next_sweep[name] = now + trigger.history_sweep_interval
            if next_due < due:
                due = float(next_due)  # compiled: a float variable takes no int
        self._sweep_due = due
        return removed

    # -- suspension -----------------------------------------------------------------------

    def hold(self, processor: TriggerProcessor,
             docs: list[Document]) -> list[tuple[Document, str]]:
        """Keep documents of a suspended trigger; returns those refused, with the reason."""
        name = processor.trigger.name
        refused = []
        for doc in docs:
            why = self.holding.add(name, doc)
            if why is not None:
                refused.append((doc, why))
        return refused

    def suspend(self, processor: TriggerProcessor, reason: str) -> None:
        """Suspend a trigger (a command, or a run that asked for it) and record why."""
        processor.suspend(reason)
        self.holding.mark(processor.trigger.name, reason)

    def suspend_by_command(self, processor: TriggerProcessor,
                           reason: str) -> JournalRecord | None:
        """The operator's suspend: its `suspended` record (at partition time), or None.

        A trigger that is already suspended stays as it is and gets no record.
        """
        if processor.suspended:
            return None
        self.suspend(processor, reason)
        return JournalRecord(processor.trigger.name, SUSPENDED, None, None, self.now,
                             reason=reason)

    def resume(self, processor: TriggerProcessor,
               reason: str) -> tuple[JournalRecord | None, list[Document]]:
        """Lift a suspension: its `resumed` record and the held documents, oldest first.

        The runner decides them again in that order; a trigger that suspends again on one
        of them holds the rest.  A trigger that is not suspended: (None, []).
        """
        if not processor.suspended:
            return None, []
        name = processor.trigger.name
        record = processor.resume(self.now, reason)
        self.holding.mark(name, None)
        return record, self.holding.drain(name)

    # -- history --------------------------------------------------------------------------

    def seed(self, trigger: str, identity: str, status: str, ts: Timestamp,
             failed: bool = False, activation: str | None = None) -> bool:
        """Load a history entry (scenario history.jsonl, imports); False: no such history.

        Only join triggers keep history under the activation; any other trigger looks its
        documents up by identity alone, so a seed's activation does not apply to them.
        """
        processor = self.processors.get(trigger)
        if processor is None or processor.history is None:
            return False
        key = state_keys(processor.trigger, identity, activation)[0]
        processor.history.seed(key, status, ts, failed)
        return True

    def forget(self, trigger: str, key: str, only: str) -> bool:
        """Remove an entry so that a resubmitted document is decided again.

        only="processing": just a processing-only entry (an in-doubt document);
        only="failed": just an entry whose run failed (an error document).
        """
        processor = self.processors.get(trigger)
        if processor is None or processor.history is None:
            return False
        history = processor.history
        try:
            entry = history.entry(key)
        except HistoryUnavailable:
            # A value no known version describes made its documents In Doubt; resubmitting
            # them (only="processing") removes it so that they are decided again.
            if only == "processing":
                history.remove(key)
                return True
            return False
        if entry is None:
            return False
        if (only == "processing" and entry.processing and not entry.completed) or \
                (only == "failed" and entry.failed):
            history.remove(key)
            return True
        return False
