"""The audit journal: one record per decision (spec section 5)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from .envelope import Timestamp, seconds
from .pickling import by_fields

# Terminal outcomes: exactly one per (trigger, document).
PROCESSED: Final = "processed"
ERROR: Final = "error"
DUPLICATE: Final = "duplicate"
REJECTED: Final = "rejected"
IN_DOUBT: Final = "in-doubt"
JOIN_EXPIRED: Final = "join-expired"
JOIN_DISCARDED: Final = "join-discarded"
BAD_INPUT: Final = "bad-input"
# Terminal at ingress (trigger null).
DUPLICATE_ID: Final = "duplicate-id"
# Not terminal.
JOIN_PENDING: Final = "join-pending"
RETRY: Final = "retry"
SUSPENDED: Final = "suspended"
RESUMED: Final = "resumed"

TERMINAL: Final = frozenset(
    {PROCESSED, ERROR, DUPLICATE, REJECTED, IN_DOUBT, JOIN_EXPIRED, JOIN_DISCARDED, BAD_INPUT,
     DUPLICATE_ID}
)
OUTCOMES: Final = TERMINAL | {JOIN_PENDING, RETRY, SUSPENDED, RESUMED}
# The order in which tables and reports list outcomes.
OUTCOME_ORDER: Final = (
    PROCESSED, ERROR, DUPLICATE, REJECTED, IN_DOUBT, JOIN_PENDING, JOIN_EXPIRED,
    JOIN_DISCARDED, BAD_INPUT, DUPLICATE_ID, RETRY, SUSPENDED, RESUMED,
)


@dataclass(init=False, slots=True)
class JournalRecord:
    """One decision.  The first five fields are the contract of `onceflow replay`.

    `ts` is record time in whole milliseconds, as everywhere in the core; the written
    record (as_dict) gives it in seconds.
    """

    trigger: str | None
    outcome: str
    identity: str | None
    activation: str | None
    ts: Timestamp | None
    topic: str | None
    partition: int | None
    offset: int | None
    reason: str | None
    attempt: int | None
    position: int

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    # Written out, not generated: compiled, a dataclass __init__ stays interpreted.
    def __init__(self, trigger: str | None, outcome: str, identity: str | None,
                 activation: str | None, ts: Timestamp | None, topic: str | None = None,
                 partition: int | None = None, offset: int | None = None,
                 reason: str | None = None, attempt: int | None = None,
                 position: int = -1) -> None:
        self.trigger = trigger
        self.outcome = outcome
        self.identity = identity
        self.activation = activation
        self.ts = ts
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason
        self.attempt = attempt
        self.position = position

    def as_dict(self) -> dict[str, Any]:
        """The record as written to stdout or the journal topic."""
        data: dict[str, Any] = {
            "trigger": self.trigger,
            "outcome": self.outcome,
            "identity": self.identity,
            "activation": self.activation,
            "ts": None if self.ts is None else seconds(self.ts),
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
        }
        if self.reason is not None:
            data["reason"] = self.reason
        if self.attempt is not None:
            data["attempt"] = self.attempt
        return data

    @property
    def terminal(self) -> bool:
        """Whether this record ends the story of its document for its trigger."""
        return self.outcome in TERMINAL


def bad_input(trigger: str | None, identity: str | None, activation: str | None,
              ts: Timestamp | None, topic: str | None, partition: int | None,
              offset: int | None, reason: str, position: int = -1) -> JournalRecord:
    """The `bad-input` record of what was not decided (trigger None: at ingress)."""
    return JournalRecord(trigger, BAD_INPUT, identity, activation, ts, topic, partition,
                         offset, reason, None, position)


# The fields of a journal record that `onceflow replay`'s output is compared on (spec
# section 7), in that order.
CONTRACT_FIELDS: Final = ("trigger", "outcome", "identity", "activation", "ts")


def contract_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """A journal record (as a dict) as the contract compares it: a hashable tuple.

    The five contract fields, then the type of ts: an integer ts stays an integer, so 5
    and 5.0 are different journal lines though Python finds them equal.  Every runner's
    journal is held to the replay's as a multiset of these keys (tests, benches).
    """
    ts = record.get("ts")
    return (record.get("trigger"), record.get("outcome"), record.get("identity"),
            record.get("activation"), ts, type(ts).__name__)


def contract_multiset(lines: Iterable[bytes]) -> Counter[tuple[Any, ...]]:
    """Journal lines (JSON, blank lines skipped) as the multiset of their contract keys."""
    return Counter(contract_key(orjson.loads(line)) for line in lines if line.strip())


def summary_table(records: Iterable[dict[str, Any]]) -> str:
    """Counts of outcomes per trigger (journal records as dicts), as a readable table."""
    counts: Counter[tuple[str, str]] = Counter()
    for record in records:
        counts[(record.get("trigger") or "(ingress)", record["outcome"])] += 1
    triggers = sorted({t for t, _ in counts}, key=lambda t: (t == "(ingress)", t))
    outcomes = [o for o in OUTCOME_ORDER if any(counts[(t, o)] for t in triggers)]
    if not triggers:
        return "no journal records\n"
    width = max(len("trigger"), *(len(t) for t in triggers))
    columns = [max(len(o), 5) for o in outcomes]
    lines = ["trigger".ljust(width) + "  " + "  ".join(
        o.rjust(w) for o, w in zip(outcomes, columns, strict=True))]
    lines.append("-" * len(lines[0]))
    for trigger in triggers:
        lines.append(trigger.ljust(width) + "  " + "  ".join(
            str(counts[(trigger, o)] or "").rjust(w)
            for o, w in zip(outcomes, columns, strict=True)))
    return "\n".join(lines) + "\n"
