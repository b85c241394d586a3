"""One trigger's path for a document: exactly-once check, join, service, history, journal.

The processor is split around the service call so that a runner can batch: `take`
decides and writes the processing entries, the runner makes them durable and runs the
service, `complete` writes the completed entries, the journal and the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from . import journal as J
from .calls import CallContext, Callee
from .decision import Decision, Status, decide, decide_unavailable, resolve
from .envelope import MAX_IDENTITY_LENGTH, Document, Timestamp
from .errors import HistoryUnavailable
from .history import History, HistoryEntry, state_keys
from .ingress import header_ignored
from .joins import COMPLETE, DISCARDED, REFUSED, JoinBook, JoinFits, join_document
from .journal import JournalRecord
from .outputs import (
    DEAD_LETTER_TOPIC,
    Output,
    document_letter,
    error_output,
    output_headers,
    refusal,
)
from .running import OK, SUSPEND, ServiceResult
from .store import Store
from .triggers import TriggerDef


@dataclass(init=False, slots=True)
class Run:
    """A service call to make: its members (newest last) and the payload it receives."""

    members: list[Document]
    payload: Any
    started: Timestamp
    activation: str | None
    previous_join: Any
    history_keys: list[str]

    # Written out, not generated: compiled, a dataclass __init__ stays interpreted.
    def __init__(self, members: list[Document], payload: Any, started: Timestamp,
                 activation: str | None, previous_join: Any = None,
                 history_keys: list[str] | None = None) -> None:
        self.members = members
        self.payload = payload
        self.started = started
        self.activation = activation
        self.previous_join = previous_join
        self.history_keys = [] if history_keys is None else history_keys

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


class Sink:
    """Where a runner collects journal records and outputs across many documents.

    `outputs=None` drops output documents (a replay that only wants the journal).
    """

    __slots__ = ("journal", "outputs")

    def __init__(self, journal: list[JournalRecord] | None = None,
                 outputs: list[Output] | None = None, *, keep_outputs: bool = True) -> None:
        self.journal: list[JournalRecord] = [] if journal is None else journal
        self.outputs: list[Output] | None = (
            ([] if outputs is None else outputs) if keep_outputs else None
        )

    def output(self, item: Output) -> None:
        """Keep an output document (unless outputs are dropped)."""
        if self.outputs is not None:
            self.outputs.append(item)


WAITING_AGAIN: Final = ("delivered again while waiting in the open join: its outcome is "
                        "journaled when the join completes or expires")
EXPIRED_AGAIN: Final = ("delivered again after its join expired: it was dropped with the "
                        "join and opens no new one")
# Where a copy of every record or document that is not decided goes (nothing is lost).


def _with_note(reason: str, note: str | None) -> str:
    return reason if note is None else f"{reason} ({note})"


class _Held:
    """The trigger is suspended: the document stays unacknowledged."""

    def __repr__(self) -> str:
        return "HELD"


HELD: Final = _Held()


class TriggerProcessor:
    """A trigger's decisions over its history and join stores."""

    def __init__(
        self,
        trigger: TriggerDef,
        service: Callee,
        resolver: Callee | None,
        history_store: Store,
        join_store: Store | None,
        *,
        serialize_state: bool = True,
        join_fits: JoinFits | None = None,
    ) -> None:
        """`serialize_state=False`: the stores live only in memory and may hold objects.

        `join_fits`: the runner's limit on what one activation's join may store (the
        worker's record limit); a document that would pass it is `bad-input`.
        """
        self.trigger = trigger
        self.service = service
        self.resolver = resolver
        self.history: History | None = None
        if trigger.detect_duplicates and trigger.use_history:
            self.history = History(history_store, trigger.history_ttl)
        self.joins: JoinBook | None = None
        if trigger.needs_activation:
            if join_store is None:
                raise ValueError(f"trigger {trigger.name!r} needs a join store")
            self.joins = JoinBook(trigger, join_store, serialize=serialize_state,
                                  fits=join_fits)
        self._join_arity = trigger.join_arity
        self.suspended = False
        self.suspended_reason = ""

    # -- the path of one document -------------------------------------------------------

    def take(self, doc: Document, sink: Sink) -> Run | _Held | None:
        """Decide a document: journal and outputs go to the sink.

        Returns the run to make, HELD when the trigger is suspended, or None when the
        document is done with.
        """
        if self.suspended:
            return HELD
        trigger = self.trigger
        joins = self.joins
        if joins is not None and doc.activation is None:
            reason = (f"trigger {trigger.name!r} joins documents by activation "
                      f"({trigger.kind}) and this {doc.type!r} document has none: add an "
                      f"'activation' field")
            sink.journal.append(self._record(doc, J.BAD_INPUT, reason))
            sink.output(self._error_output([doc], doc.identity, None, "BadInput", reason, 0))
            return None
        if doc.resubmitted:
            # The operator's decision replaces the exactly-once check (spec section 1).
            return self._admit_new(doc, sink)
        if joins is not None and joins.waiting(doc):
            # The broker delivered a waiting member again: not a second instance of its
            # type.  Its terminal record is the member's, when the join completes or
            # expires; a terminal record now would be contradicted then.
            sink.journal.append(self._record(doc, J.JOIN_PENDING, WAITING_AGAIN))
            return None
        if joins is not None and joins.expired(doc):
            sink.journal.append(self._record(doc, J.JOIN_EXPIRED, EXPIRED_AGAIN))
            return None
        limit = trigger.max_delivery_count
        if limit is not None and doc.delivery_count >= limit:
            self._too_many_deliveries(doc, limit, sink)
            return None
        if joins is not None and self.history is not None and joins.condition.holds_members:
            unit = self._interrupted_join(doc)
            if unit is not None:
                return self._settle_join_unit(doc, unit[0], unit[1], sink)
        # Join triggers keep history under the activation (their routing key); an entry
        # loaded without one (history.jsonl, imports) applies to every activation.
        if joins is None:
            decision = decide(trigger, doc, self.history, doc.identity, self.resolver)
        else:
            decision = decide(trigger, doc, self.history, self._history_key(doc),
                              self.resolver, state_keys(trigger, doc.identity, None)[0])
        status = decision.status
        if status is Status.NEW:
            return self._admit_new(doc, sink)
        reason = _with_note(decision.reason, header_ignored(doc.headers))
        if status is Status.DUPLICATE:
            sink.journal.append(self._record(doc, J.DUPLICATE, reason))
        elif status is Status.REJECTED:
            sink.journal.append(self._record(doc, J.REJECTED, reason))
        elif status is Status.IN_DOUBT:
            self._in_doubt(doc, reason, sink)
        else:
            return self._suspend(doc, reason, sink)
        return None

    def _too_many_deliveries(self, doc: Document, limit: int, sink: Sink) -> None:
        """Reject a document delivered max_delivery_count times: journal and dead letter."""
        reason = (f"delivery count {doc.delivery_count} reached max_delivery_count "
                  f"({limit}): not decided again; a copy went to {DEAD_LETTER_TOPIC}")
        sink.journal.append(self._record(doc, J.REJECTED, reason))
        sink.output(document_letter(doc, reason, trigger=self.trigger.name))

    def _interrupted_join(self, doc: Document) -> tuple[HistoryEntry, list[Document]] | None:
        """The history entry and waiting members of a join run that a crash interrupted.

        doc would complete its activation's open join, but its history already has an
        entry: the run it completed before (one start time for every member) did not get
        to close the join.  The waiting members were in that run when their own entries
        carry its start time, or when they have none and arrived no later than it
        started (a history seeded for the completing document alone).  None: not such a
        case, doc is decided alone.
        """
        joins = self.joins
        history = self.history
        activation = doc.activation
        assert joins is not None and history is not None and activation is not None
        if len(doc.identity) > MAX_IDENTITY_LENGTH:
            return None
        state = joins.get(activation)
        held = state.get("members") if state is not None else None
        if not held or doc.type in held or len(held) + 1 != self._join_arity:
            return None  # doc would not complete an open join
        try:
            entry = self._entry(doc, doc.ts)
            if entry is None:
                return None  # the usual case: doc is New and completes the join
            waiting = joins.members(activation)
            for member in waiting:
                found = self._entry(member, doc.ts)
                if found is None:
                    if member.ts > entry.started:
                        return None
                elif found.started != entry.started:
                    return None
        except HistoryUnavailable:
            return None  # decided alone, through the usual unavailable-history path
        return entry, waiting

    def _entry(self, doc: Document, now: Timestamp) -> HistoryEntry | None:
        """The live history entry of doc under its activation, else one loaded without it."""
        history = self.history
        assert history is not None
        entry = history.lookup(self._history_key(doc), now)
        if entry is None and doc.activation is not None:
            entry = history.lookup(state_keys(self.trigger, doc.identity, None)[0], now)
        return entry

    def _settle_join_unit(self, doc: Document, entry: HistoryEntry, waiting: list[Document],
                          sink: Sink) -> Run | _Held | None:
        """Decide an interrupted join run for all its members, on doc's history (spec 4).

        A completed entry: every member duplicate (rejected when the run failed).  A
        processing entry only: the resolver is asked once, with the join document; NEW
        completes the join and runs it (fresh history entries); without a resolver, or
        when it answers IN_DOUBT, every member is in-doubt and the join document goes to
        the in-doubt topic.
        """
        activation = doc.activation
        assert activation is not None and self.joins is not None
        members = waiting + [doc]
        identity = "+".join(member.identity for member in members)
        payload = join_document(activation, members)
        if entry.completed:
            outcome = J.REJECTED if entry.failed else J.DUPLICATE
            why = (f"its join already ran (started at {entry.started})"
                   + (" and it failed" if entry.failed else "")
                   + f": the history of {doc.identity}, which completed it, decides "
                   f"for every member")
            status = Status.REJECTED if entry.failed else Status.DUPLICATE
            decision = Decision(status, why)
        else:
            why = (f"its join's run (started at {entry.started}) was interrupted: "
                   f"{doc.identity}, which completed it, has a processing entry only")
            if self.resolver is None:
                decision = Decision(Status.IN_DOUBT, why)
            else:
                decision = resolve(self.trigger, doc, self.resolver, why, entry.describe(),
                                   payload, identity)
            outcome = {Status.DUPLICATE: J.DUPLICATE, Status.IN_DOUBT: J.IN_DOUBT}.get(
                decision.status, J.IN_DOUBT)
        if decision.status is Status.NEW:
            return self._admit_new(doc, sink)
        if decision.status is Status.SUSPEND:
            return self._suspend(doc, decision.reason, sink)
        self.joins.drop_members(activation, {member.type for member in waiting})
        for member in members:
            sink.journal.append(self._record(member, outcome, decision.reason))
        if outcome == J.IN_DOUBT and sink.outputs is not None:
            headers = self._output_headers(identity, activation)
            headers["reason"] = decision.reason
            sink.outputs.append(Output(self.trigger.in_doubt, doc.key or activation, payload,
                                       headers))
        return None

    def _admit_new(self, doc: Document, sink: Sink) -> Run | _Held | None:
        joins = self.joins
        if joins is None:
            run = Run([doc], doc.envelope, doc.ts, doc.activation)
        else:
            step = joins.on_document(doc)
            if step.kind == DISCARDED:
                sink.journal.append(self._record(doc, J.JOIN_DISCARDED, step.reason))
                return None
            if step.kind == REFUSED:
                record, error = refusal(self.trigger, doc, step.reason)
                sink.journal.append(record)
                sink.output(error)
                return None
            if step.kind != COMPLETE:
                sink.journal.append(self._record(doc, J.JOIN_PENDING))
                return None
            payload: Any = doc.envelope
            if self._join_arity > 1:
                payload = join_document(doc.activation, step.members)
            run = Run(step.members, payload, doc.ts, doc.activation, step.previous)
        history = self.history
        if history is not None:
            try:
                for member in run.members:
                    if len(member.identity) <= MAX_IDENTITY_LENGTH:
                        key = self._history_key(member)
                        history.mark_processing(key, run.started)
                        run.history_keys.append(key)
            except HistoryUnavailable as exc:
                return self._history_write_failed(doc, run, str(exc), sink)
        return run

    def _history_write_failed(self, doc: Document, run: Run, why: str,
                              sink: Sink) -> Run | _Held | None:
        # The processing entry cannot be written: history is unavailable (spec 3).
        self._undo(run)
        decision = decide_unavailable(self.trigger, doc, self.resolver, why)
        if decision.status is Status.NEW:
            run.history_keys.clear()
            if self.joins is not None:
                self.joins.on_document(doc)
            return run
        if decision.status is Status.DUPLICATE:
            sink.journal.append(self._record(doc, J.DUPLICATE, decision.reason))
        elif decision.status is Status.IN_DOUBT:
            self._in_doubt(doc, decision.reason, sink)
        else:
            return self._suspend(doc, decision.reason, sink)
        return None

    def complete(self, run: Run, result: ServiceResult, sink: Sink) -> None:
        """Finish a run with the service's result: journal and outputs go to the sink."""
        newest = run.newest
        journal = sink.journal
        if result.retries:
            for attempt, message in result.retries:
                journal.append(self._record(newest, J.RETRY, message, attempt))
        if result.outcome == SUSPEND:
            self._undo(run)
            reason = f"retries exhausted ({result.error_type}: {result.error_message})"
            self._suspend(newest, reason, sink)
            return
        failed = result.outcome != OK
        note = ""
        history = self.history
        if history is not None:
            try:
                for key in run.history_keys:
                    history.mark_completed(key, run.started, failed)
            except HistoryUnavailable as exc:
                note = f" (the completed entry could not be written: {exc})"
        if not failed:
            for member in run.members:
                said: str | None = note or None
                ignored = header_ignored(member.headers) if member.headers else None
                if ignored is not None:
                    said = f"{note.strip()}; {ignored}" if note else ignored
                journal.append(self._record(member, J.PROCESSED, resubmission(member, said),
                                            result.attempts))
            if result.value is not None and sink.outputs is not None:
                sink.outputs.append(Output(
                    self.trigger.output, self._output_key(run), result.value,
                    self._output_headers(run.identity, run.activation),
                ))
            return
        reason = f"{result.error_type}: {result.error_message}{note}"
        for member in run.members:
            journal.append(self._record(member, J.ERROR, resubmission(member, reason),
                                        result.attempts))
        if sink.outputs is None:
            return
        error = self._error_output(run.members, run.identity, run.activation,
                                   result.error_type, result.error_message, result.attempts)
        sink.outputs.append(error)
        for target in dict.fromkeys(m.reply_to for m in run.members if m.reply_to):
            assert target is not None
            sink.outputs.append(Output(target, error.key, error.value, dict(error.headers)))

    # -- time ---------------------------------------------------------------------------

    def expire(self, now: Timestamp) -> list[JournalRecord]:
        """Expire joins whose deadline has passed; journal each dropped document."""
        # A suspended trigger holds its documents, but its open joins still age.
        if self.joins is None:
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

    def sweep(self, now: Timestamp) -> int:
        """Remove history entries older than the TTL."""
        return 0 if self.history is None else self.history.sweep(now)

    # -- suspension ---------------------------------------------------------------------

    def resume(self, ts: Timestamp | None, reason: str = "resumed by command") -> JournalRecord:
        """Lift a suspension; the runner redelivers the documents it held."""
        self.suspended = False
        self.suspended_reason = ""
        return JournalRecord(self.trigger.name, J.RESUMED, None, None, ts, reason=reason)

    def suspend(self, reason: str) -> None:
        """Hold every document from now on, for reason (Partition.suspend records it)."""
        self.suspended = True
        self.suspended_reason = reason

    def _suspend(self, doc: Document, reason: str, sink: Sink) -> _Held:
        self.suspend(reason)
        sink.journal.append(self._record(doc, J.SUSPENDED, reason))
        return HELD

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
        return state_keys(self.trigger, doc.identity, doc.activation)[0]

    def _record(self, doc: Document, outcome: str, reason: str | None = None,
                attempt: int | None = None) -> JournalRecord:
        return JournalRecord(self.trigger.name, outcome, doc.identity, doc.activation, doc.ts,
                             doc.topic, doc.partition, doc.offset, reason, attempt,
                             doc.position)

    def _in_doubt(self, doc: Document, reason: str, sink: Sink) -> None:
        sink.journal.append(self._record(doc, J.IN_DOUBT, reason))
        if sink.outputs is not None:
            headers = self._output_headers(doc.identity, doc.activation)
            headers["reason"] = reason
            sink.outputs.append(Output(self.trigger.in_doubt, doc.key, doc.envelope, headers))

    def _error_output(self, members: list[Document], identity: str, activation: str | None,
                      error_type: str, message: str, attempts: int) -> Output:
        return error_output(self.trigger, [member.envelope for member in members],
                            members[-1].key or activation, identity, activation, error_type,
                            message, attempts)

    def _output_headers(self, identity: str, activation: str | None) -> dict[str, str]:
        return output_headers(self.trigger, identity, activation)

    def _output_key(self, run: Run) -> str | None:
        return run.activation if run.activation is not None else run.newest.key


def resubmission(doc: Document, reason: str | None) -> str | None:
    """A terminal record's reason, naming who resubmitted the document, if anyone did."""
    if not doc.resubmitted:
        return reason
    who = f"resubmitted by {doc.resubmitted_by}" if doc.resubmitted_by else \
        "resubmitted by an operator"
    return who if reason is None else f"{reason}; {who}"
