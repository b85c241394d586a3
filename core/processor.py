"""One trigger's path for a document: exactly-once check, join, service, history, journal.

The processor is split around the service call so that a runner can batch: `begin`
decides and writes the processing entries, the runner makes them durable and runs the
service, `finish` writes the completed entries, the journal and the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import journal as J
from .calls import CallContext, Callee
from .decision import Status, decide, decide_unavailable
from .envelope import H_DUP_ID, MAX_IDENTITY_LENGTH, Document
from .errors import HistoryUnavailable
from .history import History, history_key
from .joins import COMPLETE, DISCARDED, JoinBook, join_document
from .journal import JournalRecord
from .running import OK, SUSPEND, ServiceResult
from .store import Store
from .triggers import TriggerDef


@dataclass(slots=True)
class Output:
    """A document for an output, error, in-doubt or reply-to topic."""

    topic: str
    key: str | None
    value: Any
    headers: dict[str, str]


@dataclass(slots=True)
class Run:
    """A service call to make: its members (newest last) and the payload it receives."""

    members: list[Document]
    payload: Any
    started: float
    activation: str | None
    previous_join: Any = None
    history_keys: list[str] = field(default_factory=list)

    @property
    def newest(self) -> Document:
        """The document that started the run (for a join, the one that completed it)."""
        return self.members[-1]

    @property
    def identity(self) -> str:
        """The run's identity: the member's, or the members' joined for a join."""
        if len(self.members) == 1:
            return self.members[0].identity
        return "+".join(member.identity for member in self.members)

    def context(self, trigger: str) -> CallContext:
        """The context the service is called with (attempt 1)."""
        newest = self.newest
        return CallContext(trigger, self.identity, self.activation, newest.delivery_count,
                           1, newest.message_id)


@dataclass(slots=True)
class Step:
    """What one begin or finish produced.  `held`: the trigger is suspended."""

    journal: list[JournalRecord] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    run: Run | None = None
    held: bool = False


class TriggerProcessor:
    """A trigger's decisions over its history and join stores."""

    def __init__(
        self,
        trigger: TriggerDef,
        service: Callee,
        resolver: Callee | None,
        history_store: Store,
        join_store: Store | None,
    ) -> None:
        self.trigger = trigger
        self.service = service
        self.resolver = resolver
        self.history: History | None = None
        if trigger.detect_duplicates and trigger.use_history:
            self.history = History(history_store, trigger.history_ttl)
        self.joins = JoinBook(trigger, join_store) if trigger.needs_activation else None
        assert self.joins is not None or join_store is None or not trigger.needs_activation
        self.suspended = False
        self.suspended_reason = ""

    # -- the path of one document -------------------------------------------------------

    def begin(self, doc: Document) -> Step:
        """Check, join and prepare the run of one document routed to this trigger."""
        if self.suspended:
            return Step(held=True)
        trigger = self.trigger
        name = trigger.name
        if self.joins is not None and doc.activation is None:
            reason = (f"trigger {name!r} joins documents by activation ({trigger.kind}) and "
                      f"this {doc.type!r} document has none: add an 'activation' field")
            return Step(
                [self._record(doc, J.BAD_INPUT, reason)],
                [self._error_output([doc], doc.identity, doc.activation, "BadInput", reason, 0)],
            )
        # Join triggers keep history under the activation (their routing key); an entry
        # loaded without one (history.jsonl, imports) applies to every activation.
        fallback = doc.identity if self.joins is not None else None
        decision = decide(trigger, doc, self.history, self._history_key(doc), self.resolver,
                          fallback)
        status = decision.status
        if status is Status.NEW:
            return self._admit_new(doc)
        if status is Status.DUPLICATE:
            return Step([self._record(doc, J.DUPLICATE, decision.reason)])
        if status is Status.REJECTED:
            return Step([self._record(doc, J.REJECTED, decision.reason)])
        if status is Status.IN_DOUBT:
            return self._in_doubt(doc, decision.reason)
        return self._suspend(doc, decision.reason)

    def _admit_new(self, doc: Document) -> Step:
        if self.joins is None:
            run = Run([doc], doc.envelope, doc.ts, doc.activation)
        else:
            step = self.joins.on_document(doc)
            if step.kind == DISCARDED:
                return Step([self._record(doc, J.JOIN_DISCARDED, step.reason)])
            if step.kind != COMPLETE:
                return Step([self._record(doc, J.JOIN_PENDING)])
            payload: Any = doc.envelope
            if len(self.trigger.join_types) > 1 or len(step.members) > 1:
                payload = join_document(doc.activation, step.members)
            run = Run(step.members, payload, doc.ts, doc.activation, step.previous)
        if self.history is not None:
            try:
                for member in run.members:
                    if len(member.identity) <= MAX_IDENTITY_LENGTH:
                        key = self._history_key(member)
                        self.history.mark_processing(key, run.started)
                        run.history_keys.append(key)
            except HistoryUnavailable as exc:
                return self._history_write_failed(doc, run, str(exc))
        return Step(run=run)

    def _history_write_failed(self, doc: Document, run: Run, why: str) -> Step:
        # The processing entry cannot be written: history is unavailable (spec 3).
        self._undo(run)
        decision = decide_unavailable(self.trigger, doc, self.resolver, why)
        if decision.status is Status.NEW:
            run.history_keys.clear()
            if self.joins is not None:
                self.joins.on_document(doc)
            return Step(run=run)
        if decision.status is Status.DUPLICATE:
            return Step([self._record(doc, J.DUPLICATE, decision.reason)])
        if decision.status is Status.IN_DOUBT:
            return self._in_doubt(doc, decision.reason)
        return self._suspend(doc, decision.reason)

    def finish(self, run: Run, result: ServiceResult) -> Step:
        """Record how the run ended: completed entries, journal, outputs."""
        newest = run.newest
        step = Step()
        for attempt, message in result.retries:
            step.journal.append(self._record(newest, J.RETRY, message, attempt))
        if result.outcome == SUSPEND:
            self._undo(run)
            reason = f"retries exhausted ({result.error_type}: {result.error_message})"
            suspended = self._suspend(newest, reason)
            step.journal.extend(suspended.journal)
            return step
        failed = result.outcome != OK
        note = ""
        if self.history is not None:
            try:
                for key in run.history_keys:
                    self.history.mark_completed(key, run.started, failed)
            except HistoryUnavailable as exc:
                note = f" (the completed entry could not be written: {exc})"
        if not failed:
            for member in run.members:
                step.journal.append(self._record(member, J.PROCESSED, note or None,
                                                 result.attempts))
            if result.value is not None:
                step.outputs.append(Output(
                    self.trigger.output, self._output_key(run), result.value,
                    self._output_headers(run.identity, run.activation),
                ))
            return step
        reason = f"{result.error_type}: {result.error_message}{note}"
        for member in run.members:
            step.journal.append(self._record(member, J.ERROR, reason, result.attempts))
        step.outputs.append(self._error_output(
            run.members, run.identity, run.activation, result.error_type,
            result.error_message, result.attempts,
        ))
        for target in dict.fromkeys(m.reply_to for m in run.members if m.reply_to):
            error = self._error_output(run.members, run.identity, run.activation,
                                       result.error_type, result.error_message,
                                       result.attempts)
            error.topic = target
            step.outputs.append(error)
        return step

    # -- time ---------------------------------------------------------------------------

    def expire(self, now: float) -> list[JournalRecord]:
        """Expire joins whose deadline has passed; journal each dropped document."""
        if self.joins is None or self.suspended:
            return []
        records = []
        for activation, dropped in self.joins.expire(now):
            for doc in dropped:
                records.append(self._record(
                    doc, J.JOIN_EXPIRED,
                    f"the join for activation {activation!r} timed out before every "
                    f"document arrived",
                ))
        return records

    def next_deadline(self) -> float | None:
        """The earliest join deadline known (may be stale)."""
        return None if self.joins is None else self.joins.next_deadline()

    def sweep(self, now: float) -> int:
        """Remove history entries older than the TTL."""
        return 0 if self.history is None else self.history.sweep(now)

    # -- suspension ---------------------------------------------------------------------

    def resume(self, ts: float | None, reason: str = "resumed by command") -> JournalRecord:
        """Lift a suspension; the runner redelivers the documents it held."""
        self.suspended = False
        self.suspended_reason = ""
        return JournalRecord(self.trigger.name, J.RESUMED, None, None, ts, reason=reason)

    def _suspend(self, doc: Document, reason: str) -> Step:
        self.suspended = True
        self.suspended_reason = reason
        return Step([self._record(doc, J.SUSPENDED, reason)], held=True)

    def _undo(self, run: Run) -> None:
        if self.history is not None:
            for key in run.history_keys:
                try:
                    self.history.remove(key)
                except HistoryUnavailable:
                    pass  # nothing more can be done; the entry expires with its TTL
        if self.joins is not None and run.activation is not None:
            self.joins.restore(run.activation, run.previous_join)

    # -- building records ---------------------------------------------------------------

    def _history_key(self, doc: Document) -> str:
        if self.joins is not None:
            return history_key(doc.identity, doc.activation)
        return doc.identity

    def _record(self, doc: Document, outcome: str, reason: str | None = None,
                attempt: int | None = None) -> JournalRecord:
        return JournalRecord(self.trigger.name, outcome, doc.identity, doc.activation, doc.ts,
                             doc.topic, doc.partition, doc.offset, reason, attempt,
                             doc.position)

    def _in_doubt(self, doc: Document, reason: str) -> Step:
        headers = self._output_headers(doc.identity, doc.activation)
        headers["reason"] = reason
        return Step(
            [self._record(doc, J.IN_DOUBT, reason)],
            [Output(self.trigger.in_doubt, doc.key, doc.envelope, headers)],
        )

    def _error_output(self, members: list[Document], identity: str, activation: str | None,
                      error_type: str, message: str, attempts: int) -> Output:
        value = {
            "trigger": self.trigger.name,
            "identity": identity,
            "activation": activation,
            "error": {"type": error_type, "message": message},
            "attempts": attempts,
            "documents": [member.envelope for member in members],
        }
        return Output(self.trigger.error, members[-1].key or activation, value,
                      self._output_headers(identity, activation))

    def _output_headers(self, identity: str, activation: str | None) -> dict[str, str]:
        headers = {H_DUP_ID: f"{self.trigger.name}:{identity}", "trigger": self.trigger.name,
                   "identity": identity}
        if activation is not None:
            headers["activation"] = activation
        return headers

    def _output_key(self, run: Run) -> str | None:
        return run.activation if run.activation is not None else run.newest.key
