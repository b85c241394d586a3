"""What every runner builds its triggers from, and the synchronous runner of triggers.

`load_callees` loads the services and resolvers a trigger file names; `build_processors`
makes one processor per trigger over a runner's stores.  `TriggerRunner` drives those
processors and their partition record by record, calling services in this thread: the
replay driver (onceflow.engine) builds on it, and the Spark pipeline runs one per task
(documents already admitted by its ingress stage).  The worker drives the same pieces
asynchronously and in batches (agents/partition_worker.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .calls import Callee, load_callee
from .envelope import Document, Timestamp
from .ingress import Ingress
from .joins import JoinFits
from .partition import HeldInMemory, Partition
from .processor import HELD, Run, Sink, TriggerProcessor, _Held
from .running import AwaitRunner, run_service
from .scripted import RESOLVERS, SERVICES
from .store import MemoryState, Store
from .triggers import TriggerDef, TriggerSet


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
    join_fits: Callable[[str], JoinFits] | None = None,
) -> dict[str, TriggerProcessor]:
    """One processor per trigger over the given stores.

    `join_fits`: each trigger's limit on what a join may store (None: no limit).
    """
    processors = {}
    for trigger in triggers.triggers:
        service, resolver = callees[trigger.name]
        joins = join_store(trigger.name) if trigger.needs_activation else None
        processors[trigger.name] = TriggerProcessor(
            trigger, service, resolver, history_store(trigger.name), joins,
            serialize_state=serialize_state,
            join_fits=join_fits(trigger.name) if join_fits is not None and joins is not None
            else None,
        )
    return processors


class TriggerRunner:
    """Every trigger of a file over one set of stores, on record time, in this thread."""

    def __init__(
        self,
        triggers: TriggerSet,
        *,
        state: MemoryState | None = None,
        callees: dict[str, tuple[Callee, Callee | None]] | None = None,
        base_dir: Path | None = None,
    ) -> None:
        """Build the processors over `state` (dicts by default)."""
        self.triggers = triggers
        self.state = state or MemoryState()
        if callees is None:
            callees = load_callees(triggers, base_dir)
        self.processors = build_processors(
            triggers, callees, self.state.history_store, self.state.join_store,
            serialize_state=getattr(self.state, "serialized", True),
        )
        # Records come in through this ingress in the replay (Engine.process); the Spark
        # pipeline admits them in a stage of its own and leaves it unused.
        self.ingress = Ingress(triggers, self.state.progress, self.state.id_store)
        self.holding = HeldInMemory([t.name for t in triggers.triggers])
        self.partition = Partition(self.processors, self.holding)
        # Async services run in an event loop of their own, made on the first one.  The
        # loop lives in a holder, not on the runner: a bound method of the runner kept on
        # the runner made a reference cycle, so all of its state (every history entry
        # and open join) waited for a full collection to be freed (Spark's reused Python
        # workers run one after each task).
        self._loop = AwaitRunner()
        self._run_coroutine = self._loop.run

    @property
    def held(self) -> dict[str, list[Document]]:
        """The documents each suspended trigger holds, oldest first."""
        return self.holding.documents

    def seed_history(self, trigger: str, identity: str, status: str, ts: Timestamp,
                     failed: bool = False, activation: str | None = None) -> None:
        """Load a history entry before the input (scenario history.jsonl)."""
        self.partition.seed(trigger, identity, status, ts, failed, activation)

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

    def run_document(self, trigger: str, document: Document, sink: Sink) -> None:
        """One admitted document through one trigger that takes it."""
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
        for document in held:  # a trigger that suspends again holds the rest (take: HELD)
            self._run_document(definition, document, out)
        return out

    def close(self) -> None:
        """Release the event loop used for async services."""
        self._loop.close()
