"""A sub-batch of one partition: the takes decided together and the services run together.

Documents are decided (`TriggerProcessor.take`) one after another; their runs collect
here.  A document that touches a history key or an activation that a run of this
sub-batch holds must be decided on the state that run leaves, exactly as a
record-by-record replay would decide it.  For a trigger without joins that cannot
suspend, such a document waits in its place (a `waiting` take) and is decided once the
runs are complete (`decide_waiting`): only its own history key decides it, and any
document decided meanwhile that touched that key waited too, behind it.  For any other
trigger the sub-batch is settled first.  (A resend soon after its original is common;
settling for each one cost the worker about an eighth of its rate on bench/peers.py.)

Settling: the processing entries become durable (one flush), the services run
concurrently, then each run is completed in take order.  Runs of a trigger that suspends
when its retries are exhausted (`on_retry_failure = "suspend"`) run one after another; when
one suspends, the later takes of that trigger are rolled back (their store writes undone,
their journal records dropped) and held with it, as a replay would have held them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from onceflow.calls import CallContext
from onceflow.envelope import Document
from onceflow.history import state_keys
from onceflow.processor import Run, Sink, TriggerProcessor
from onceflow.running import OK, SUSPEND, ServiceResult, run_service_async
from onceflow.tables.state import UndoLog
from onceflow.triggers import ON_FAILURE_SUSPEND


@dataclass(init=False, slots=True, eq=False)
class Take:
    """One document decided for one trigger, and what it produced."""

    processor: TriggerProcessor
    doc: Document
    sink: Sink
    run: Run | None
    undo: UndoLog | None
    result: ServiceResult | None
    rolled_back: bool
    waiting: bool  # not decided yet: it waits for a run of its sub-batch

    # Written out (not the dataclass's): mypyc compiles this one, while it leaves the
    # generated __init__ interpreted (one Take a document).
    def __init__(self, processor: TriggerProcessor, doc: Document, sink: Sink,
                 run: Run | None = None, undo: UndoLog | None = None,
                 result: ServiceResult | None = None, rolled_back: bool = False,
                 waiting: bool = False) -> None:
        self.processor = processor
        self.doc = doc
        self.sink = sink
        self.run = run
        self.undo = undo
        self.result = result
        self.rolled_back = rolled_back
        self.waiting = waiting


def doc_keys(processor: TriggerProcessor, doc: Document) -> list[tuple[str, str, str]]:
    """The state a document's decision reads: its history key and its join."""
    trigger = processor.trigger
    name = trigger.name
    history, join = state_keys(trigger, doc.identity, doc.activation)
    if join is None:
        return [(name, "history", history)]
    return [(name, "history", history), (name, "join", join)]


def run_keys(processor: TriggerProcessor, run: Run) -> list[tuple[str, str, str]]:
    """The state a run holds until it completes."""
    keys = []
    for member in run.members:
        keys.extend(doc_keys(processor, member))
    return keys


def suspends(processor: TriggerProcessor) -> bool:
    """Whether the trigger's runs can end in a suspension (and so must be rolled back)."""
    return processor.trigger.on_retry_failure == ON_FAILURE_SUSPEND


@dataclass(slots=True)
class SubBatch:
    """The takes of one sub-batch, in order, and the keys its runs hold."""

    takes: list[Take] = field(default_factory=list)
    busy: set[tuple[str, str, str]] = field(default_factory=set)
    runs: int = 0
    suspending_runs: int = 0

    def conflicts(self, processor: TriggerProcessor, doc: Document) -> bool:
        """Whether deciding this document now would read state a pending run holds."""
        busy = self.busy
        if not busy:
            return False
        if processor.joins is None:  # its only key: the identity (state_keys)
            return (processor.trigger.name, "history", doc.identity) in busy
        return any(key in busy for key in doc_keys(processor, doc))

    def can_wait(self, processor: TriggerProcessor) -> bool:
        """Whether a conflicting document of this trigger may wait in its place.

        Its decision must read nothing but its own history key (no join) and nothing
        decided after it may be undone (no suspension): then deciding it once the runs
        are complete gives what settling the sub-batch first would.
        """
        return processor.joins is None and not suspends(processor)

    def add(self, take: Take) -> None:
        """Record a take (and the keys of its run)."""
        self.takes.append(take)
        run = take.run
        if run is not None:
            self.runs += 1
            busy = self.busy
            processor = take.processor
            for member in run.members:  # run_keys, without the list of them
                for key in doc_keys(processor, member):
                    busy.add(key)
            if take.undo is not None:
                self.suspending_runs += 1

    def clear(self) -> None:
        """Start a new sub-batch."""
        self.takes.clear()
        self.busy.clear()
        self.runs = 0
        self.suspending_runs = 0


Offload = Callable[[Callable[[], Any]], Awaitable[Any]]


async def run_services(
    takes: list[Take],
    slots: asyncio.Semaphore,
    sleep: Callable[[float], Awaitable[None]],
    observe: Callable[[str, float], None],
    offload: Offload,
) -> None:
    """Run every take's service concurrently; chains for triggers that may suspend.

    Every run is an asyncio task, owned by the event loop.  A plain (`def`) service never
    runs on the event loop, which must go on heartbeating and answering the web views
    while it works: `offload(function)` runs a function in a thread and awaits it.  The
    first attempts of a sub-batch's plain services go out together, one after another in
    one thread (one hand-over for the lot, not one a document); a run that must wait
    before a retry goes on as a task of its own.  `observe(trigger, seconds)` is told how
    long each service call took.
    """
    async def attempt_in_thread(take: Take, payload: Any, context: CallContext) -> Any:
        service = take.processor.service
        return await offload(lambda: service.call(payload, context))

    async def run_one(take: Take, first_failure: Exception | None = None,
                      started: float | None = None) -> None:
        run = take.run
        assert run is not None
        processor = take.processor
        trigger = processor.trigger
        attempt: Callable[[Any, CallContext], Awaitable[Any]] | None = None
        if not processor.service.is_async:
            attempt = functools.partial(attempt_in_thread, take)
        async with slots:
            if started is None:
                started = time.monotonic()
            take.result = await run_service_async(
                trigger, processor.service, run.payload, run.context(trigger.name),
                sleep=sleep, attempt=attempt, first_failure=first_failure)
            observe(trigger.name, time.monotonic() - started)

    async def run_chain(chain: list[Take]) -> None:
        for take in chain:
            await run_one(take)
            assert take.result is not None
            if take.result.outcome == SUSPEND:
                return

    singles: list[Take] = []
    plain: list[Take] = []
    chains: dict[str, list[Take]] = {}
    for take in takes:
        if take.run is None or take.rolled_back:
            continue
        if take.undo is not None:
            chains.setdefault(take.processor.trigger.name, []).append(take)
        elif take.processor.service.is_async:
            singles.append(take)
        else:
            plain.append(take)
    async def run_plain(group: list[Take]) -> None:
        async with slots:
            firsts = await offload(lambda: first_attempts(group))
        later = []
        for take, (value, failure, started, seconds) in zip(group, firsts, strict=True):
            if failure is None:
                take.result = ServiceResult(OK, value, 1)
                observe(take.processor.trigger.name, seconds)
            else:
                later.append(run_one(take, failure, started))
        if later:
            await asyncio.gather(*later)

    if singles or chains or plain:
        await asyncio.gather(*(run_one(t) for t in singles),
                             *([run_plain(plain)] if plain else []),
                             *(run_chain(chain) for chain in chains.values()))


def first_attempts(takes: list[Take]) -> list[tuple[Any, Exception | None, float, float]]:
    """Attempt 1 of each take's plain service, one after another (in a worker thread).

    For each: (its value, the exception it raised or None, when it started, seconds).
    """
    out: list[tuple[Any, Exception | None, float, float]] = []
    monotonic = time.monotonic
    for take in takes:
        run = take.run
        assert run is not None
        service = take.processor.service
        started = monotonic()
        try:
            # Callee.call, with the context made only for a service that takes it (its
            # message id is the record's coordinates, a string made for the purpose).
            if service.takes_context:
                value = service.call(run.payload, run.context(take.processor.trigger.name))
            else:
                value = service.function(run.payload)
        except Exception as exc:  # noqa: BLE001 - the retry policy decides what follows
            out.append((None, exc, started, monotonic() - started))
        else:
            out.append((value, None, started, monotonic() - started))
    return out


def decide_waiting(takes: list[Take], hold: Callable[[Take, list[Document]], None]
                   ) -> list[Take]:
    """Decide waiting takes in order, up to one that a run decided here would hold.

    Returns the takes that got a run (they must run before the rest is decided).
    `hold(take, docs)` is told of a take whose trigger holds its document, as by
    complete_runs.
    """
    fresh: list[Take] = []
    held: set[tuple[str, str, str]] = set()
    for take in takes:
        if not take.waiting or take.rolled_back:
            continue
        processor = take.processor
        if held and any(key in held for key in doc_keys(processor, take.doc)):
            break
        take.waiting = False
        result = processor.take(take.doc, take.sink)
        if isinstance(result, Run):
            take.run = result
            fresh.append(take)
            held.update(run_keys(processor, result))
        elif result is not None:
            hold(take, [take.doc])
    return fresh


def failed_with_outputs(takes: list[Take]) -> list[Take]:
    """The takes whose run failed (neither OK nor suspended) and left outputs.

    Only their outputs can hold reply-to copies (agents/outputs.py, reply_copies): the
    interpreted reply-to step looks at these alone instead of at every take.
    """
    return [take for take in takes
            if take.run is not None and take.result is not None
            and take.result.outcome != OK and take.result.outcome != SUSPEND
            and take.sink.outputs]


def complete_runs(batch: SubBatch, hold: Callable[[Take, list[Document]], None]) -> None:
    """Complete every run in take order; roll back what follows a suspension.

    `hold(take, docs)` is told which documents a suspended trigger now holds, oldest first.
    """
    takes = batch.takes
    for index, take in enumerate(takes):
        if take.rolled_back or take.run is None:
            continue
        result = take.result
        assert result is not None, "a run that was not rolled back has a result"
        if result.outcome != SUSPEND:
            take.processor.complete(take.run, result, take.sink)
            continue
        later = [t for t in takes[index + 1:]
                 if t.processor is take.processor and not t.rolled_back]
        for other in reversed(later):
            if other.undo is not None:
                other.undo.roll_back()
            other.rolled_back = True
        take.processor.complete(take.run, result, take.sink)
        hold(take, [take.run.newest] + [t.doc for t in later])
