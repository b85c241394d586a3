"""The synchronous runner of the core: ingress, then every trigger, record by record.

`onceflow replay` and the Spark pipeline drive it; the worker drives the same pieces
(Ingress, TriggerProcessor) asynchronously and in batches.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from .calls import Callee, load_callee
from .envelope import Document, Record, Timestamp
from .ingress import Ingress
from .journal import JournalRecord
from .partition import HeldInMemory, Partition
from .processor import DEAD_LETTER_TOPIC as DEAD_LETTER_TOPIC
from .processor import HELD, Output, Run, Sink, TriggerProcessor, _Held
from .running import AwaitRunner, run_service
from .scenario import SUSPEND, Control
from .scripted import RESOLVERS, SERVICES
from .store import Store
from .triggers import TriggerDef, TriggerSet


def keyed_dict() -> dict[str, Any]:
    """An empty dict whose table keeps each key's hash beside it.

    CPython gives a dict holding only str keys a compact table without hashes, so a lookup
    that misses must read every probed key object to compare hashes: in a store of a few
    hundred thousand keys each of those reads is a cache miss.  A dict that once held a
    non-str key keeps the general table (hash stored in the entry) through every resize,
    so the probe compares hashes in the table and touches a key only on a hash match.
    Semantics are those of any dict.
    """
    table: dict[Any, Any] = {0: None}
    del table[0]
    return table


class MemoryState:
    """Dict stores for every piece of state: replay, tests, one Spark group."""

    # Nothing here is written to a changelog, so state values may be plain objects.
    serialized = False

    def __init__(self) -> None:
        self.progress: dict[str, Any] = {}
        self.ids: dict[str, Any] = keyed_dict()
        self.volatile_ids: dict[str, Any] = keyed_dict()
        self.history: dict[str, dict[str, Any]] = {}
        self.joins: dict[str, dict[str, Any]] = {}

    def id_store(self, topic: str, persist: bool) -> Store:
        """Where a topic's duplicate-ID caches live."""
        return self.ids if persist else self.volatile_ids

    def history_store(self, trigger: str) -> Store:
        """A trigger's document history."""
        store = self.history.get(trigger)
        if store is None:
            store = self.history[trigger] = keyed_dict()
        return store

    def join_store(self, trigger: str) -> Store:
        """A trigger's open joins."""
        store = self.joins.get(trigger)
        if store is None:
            store = self.joins[trigger] = keyed_dict()
        return store


def load_callees(
    triggers: TriggerSet, base_dir: Path | None = None
) -> dict[str, tuple[Callee, Callee | None]]:
    """Load every trigger's service and resolver (ConfigError when one cannot be loaded)."""
    loaded = {}
    for trigger in triggers.triggers:
        where = f"trigger {trigger.name!r}"
        service = load_callee(trigger.service, SERVICES, source=triggers.source,
                              where=f"{where}: key 'service'", base_dir=base_dir)
        resolver = None
        if trigger.resolver is not None:
            resolver = load_callee(trigger.resolver, RESOLVERS, source=triggers.source,
                                   where=f"{where}: key 'resolver'", base_dir=base_dir)
        loaded[trigger.name] = (service, resolver)
    return loaded


def build_processors(
    triggers: TriggerSet,
    callees: dict[str, tuple[Callee, Callee | None]],
    history_store: Callable[[str], Store],
    join_store: Callable[[str], Store],
    *,
    serialize_state: bool = True,
) -> dict[str, TriggerProcessor]:
    """One processor per trigger over the given stores."""
    processors = {}
    for trigger in triggers.triggers:
        service, resolver = callees[trigger.name]
        joins = join_store(trigger.name) if trigger.needs_activation else None
        processors[trigger.name] = TriggerProcessor(
            trigger, service, resolver, history_store(trigger.name), joins,
            serialize_state=serialize_state,
        )
    return processors


def dead_letter(record: Record, reason: str) -> Output:
    """The dead-letter copy of a record rejected at ingress: nothing is lost."""
    from .envelope import (
        MAX_DEPTH,
        NotJson,
        deep_json,
        nested_deeper_than,
        safe_headers,
        seconds,
    )

    value = record.value
    body: dict[str, Any] = {"reason": reason, "topic": record.topic,
                            "partition": record.partition, "offset": record.offset,
                            "ts": seconds(record.ts)}
    body.update(safe_headers(record.headers))
    if isinstance(value, NotJson):
        body["raw"] = value.text
        if value.data is not None:
            body["raw_base64"] = base64.b64encode(value.data).decode("ascii")
    elif nested_deeper_than(value, MAX_DEPTH):
        body["raw"] = deep_json(value)  # deeper than a JSON writer takes inside a record
    else:
        body["value"] = value
    return Output(DEAD_LETTER_TOPIC, record.key, body, {"reason": reason})


class Engine:
    """Ingress and every trigger over one set of stores, on record time."""

    def __init__(
        self,
        triggers: TriggerSet,
        *,
        state: MemoryState | None = None,
        callees: dict[str, tuple[Callee, Callee | None]] | None = None,
        base_dir: Path | None = None,
        run_coroutine: Callable[[Awaitable[Any]], Any] | None = None,
        sweep_history: bool = False,
    ) -> None:
        """Build the engine over `state` (dicts by default).

        `sweep_history`: remove history entries older than the TTL on partition time,
        every history_sweep_interval.  Off by default: a record arriving later than the
        TTL behind partition time (a late record, a redelivery after a long lag) is judged
        on its own record time, which a sweep on partition time could not honour.
        """
        self.triggers = triggers
        self.sweep_history = sweep_history
        self.state = state or MemoryState()
        if callees is None:
            callees = load_callees(triggers, base_dir)
        self.ingress = Ingress(triggers, self.state.progress, self.state.id_store)
        self.processors = build_processors(
            triggers, callees, self.state.history_store, self.state.join_store,
            serialize_state=getattr(self.state, "serialized", True),
        )
        self.holding = HeldInMemory([t.name for t in triggers.triggers])
        self.partition = Partition(self.processors, self.holding)
        # Async services run in an event loop of their own, made on the first one.  The
        # loop lives in a holder, not on the engine: a bound method of the engine kept on
        # the engine made a reference cycle, so all of its state (every history entry
        # and open join) waited for a full collection to be freed (Spark's reused Python
        # workers run one after each task).
        self._loop = AwaitRunner()
        self._run_coroutine = run_coroutine or self._loop.run

    @property
    def now(self) -> Timestamp | None:
        """Partition time: the latest record time seen, in ms."""
        return self.partition.now

    @property
    def held(self) -> dict[str, list[Document]]:
        """The documents each suspended trigger holds, oldest first."""
        return self.holding.documents

    def seed_history(self, trigger: str, identity: str, status: str, ts: Timestamp,
                     failed: bool = False, activation: str | None = None) -> None:
        """Load a history entry before the input (scenario history.jsonl)."""
        self.partition.seed(trigger, identity, status, ts, failed, activation)

    def advance(self, ts: Timestamp) -> list[JournalRecord]:
        """Move record time forward to ts: expire joins, sweep history when due."""
        records: list[JournalRecord] = []
        self._advance(ts, records)
        return records

    def _advance(self, ts: Timestamp, journal: list[JournalRecord]) -> None:
        partition = self.partition
        if partition.advance(ts, journal) and self.sweep_history:
            partition.sweep_due(ts)

    def expire_due(self, now: Timestamp, sink: Sink) -> None:
        """Expire every open join whose deadline is before `now`; record time does not move.

        For a runner that knows partition time from elsewhere (the Spark pipeline).
        """
        self.partition.expire_at(now, sink.journal)

    def end_of_input(self, sink: Sink | None = None) -> Sink:
        """Expire every open join whose deadline has passed by the end of the input."""
        if sink is None:
            sink = Sink()
        now = self.partition.now
        if now is not None:
            self.partition.expire_at(now, sink.journal)
        return sink

    def process(self, record: Record, position: int = 0,
                sink: Sink | None = None) -> Sink:
        """Run one record through ingress and every trigger that takes it."""
        if sink is None:
            sink = Sink()
        journal = sink.journal
        self._advance(record.ts, journal)
        document, targets, rejected = self.ingress.admit_into(record, position, journal)
        if document is not None:
            processors = self.processors
            for trigger in targets:
                processor = processors[trigger.name]
                run = processor.take(document, sink)
                if run is not None:
                    self._run(processor, document, run, sink)
        elif rejected is not None:
            sink.output(dead_letter(record, rejected))
        return sink

    def process_all(self, records: Iterable[Record | Control], sink: Sink,
                    on_journal: Callable[[list[JournalRecord]], None] | None = None,
                    chunk: int = 4096) -> None:
        """Every line in order, positions counted from 0, then the end of the input.

        A Control (an operator's command) is applied between the records around it.

        With `on_journal`, the journal is handed over (and not kept) every `chunk` records
        made and once at the end.  One compiled loop: the replay's per-record glue.
        """
        position = 0
        for record in records:
            if isinstance(record, Control):
                self.command(record, sink)
            else:
                self.process(record, position, sink)
            position += 1
            if on_journal is not None and len(sink.journal) >= chunk:
                on_journal(sink.journal)
                sink.journal = []
        self.end_of_input(sink)
        if on_journal is not None:
            on_journal(sink.journal)
            sink.journal = []

    def run_document(self, trigger: str, document: Document, sink: Sink) -> None:
        """One admitted document through one trigger that takes it, as process() does.

        For runners that route documents to triggers themselves (the Spark pipeline).
        """
        self._run_document(self.processors[trigger].trigger, document, sink)

    def _run_document(self, trigger: TriggerDef, document: Document, sink: Sink) -> None:
        processor = self.processors[trigger.name]
        run = processor.take(document, sink)
        if run is not None:
            self._run(processor, document, run, sink)

    def _run(self, processor: TriggerProcessor, document: Document, run: Run | _Held,
             sink: Sink) -> None:
        trigger = processor.trigger
        if run is HELD:
            self.partition.hold(processor, [document])
            return
        assert isinstance(run, Run)
        result = run_service(trigger, processor.service, run.payload,
                             run.context(trigger.name), run_coroutine=self._run_coroutine)
        processor.complete(run, result, sink)
        if processor.suspended:
            self.partition.hold(processor, [run.newest])

    def command(self, control: Control, sink: Sink) -> None:
        """An operator's suspend or resume at its time (a scenario's control line).

        Time moves to the control's ts first, as a record's would (expiring what is due);
        then the trigger is suspended, or resumed and what it held decided again.
        """
        self._advance(control.ts, sink.journal)
        if control.action == SUSPEND:
            self.suspend(control.trigger, sink=sink)
        else:
            self.resume(control.trigger, sink=sink)

    def suspend(self, trigger: str, reason: str = "suspended by command",
                sink: Sink | None = None) -> Sink:
        """Suspend a trigger by command: its documents are held until it is resumed."""
        out = Sink() if sink is None else sink
        record = self.partition.suspend_by_command(self.processors[trigger], reason)
        if record is not None:
            out.journal.append(record)
        return out

    def resume(self, trigger: str, reason: str = "resumed by command",
               sink: Sink | None = None) -> Sink:
        """Resume a suspended trigger and redeliver what it held, in order."""
        processor = self.processors[trigger]
        record, held = self.partition.resume(processor, reason)
        out = Sink() if sink is None else sink
        if record is not None:
            out.journal.append(record)
        definition = processor.trigger
        for document in held:
            if processor.suspended:
                self.partition.hold(processor, [document])
            else:
                self._run_document(definition, document, out)
        return out

    def close(self) -> None:
        """Release the event loop used for async services."""
        self._loop.close()

