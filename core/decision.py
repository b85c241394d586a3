"""The exactly-once check of a trigger (seed 000, spec section 3).

Step 1 reads the delivery count, step 2 the document history, step 3 the resolver.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from .calls import DUPLICATE, IN_DOUBT, NEW, CallContext, Callee
from .envelope import MAX_IDENTITY_LENGTH, Document, iso_time
from .errors import HistoryUnavailable, TransientError
from .history import History
from .triggers import ON_FAILURE_SUSPEND, TriggerDef


class Status(enum.Enum):
    """What the check concluded."""

    NEW = "new"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"  # a duplicate of a document whose run ended in a service error
    IN_DOUBT = "in-doubt"
    SUSPEND = "suspend"  # history (or resolver) unavailable and the trigger suspends


@dataclass(frozen=True, slots=True)
class Decision:
    """A status and why."""

    status: Status
    reason: str


_NEW: Final = Decision(Status.NEW, "new")


def decide(
    trigger: TriggerDef,
    document: Document,
    history: History | None,
    history_key: str,
    resolver: Callee | None,
    fallback_key: str | None = None,
) -> Decision:
    """Classify a document as New, Duplicate (or Rejected), In Doubt, or Suspend."""
    if not trigger.detect_duplicates:
        return _NEW
    count = document.delivery_count
    if history is not None:
        try:
            return _check_history(trigger, document, history, history_key, resolver,
                                  fallback_key)
        except HistoryUnavailable as exc:
            return decide_unavailable(trigger, document, resolver, str(exc))
    if count == 1:
        return _NEW
    if resolver is not None:
        return resolve(trigger, document, resolver, f"delivery count {count}")
    if count > 1:
        return Decision(Status.IN_DOUBT,
                        f"delivery count {count} and neither history nor resolver")
    return _NEW


def _check_history(
    trigger: TriggerDef,
    document: Document,
    history: History,
    history_key: str,
    resolver: Callee | None,
    fallback_key: str | None,
) -> Decision:
    identity = document.identity
    if len(identity) > MAX_IDENTITY_LENGTH:
        why = f"identity is longer than {MAX_IDENTITY_LENGTH} characters"
        if resolver is not None:
            return resolve(trigger, document, resolver, why)
        return Decision(Status.IN_DOUBT, why + ": history cannot check it")
    entry = history.lookup(history_key, document.ts)
    if entry is None and fallback_key is not None:
        entry = history.lookup(fallback_key, document.ts)
    if entry is None:
        return _NEW
    if entry.completed:
        if entry.failed:
            return Decision(Status.REJECTED, f"already processed (started at "
                            f"{iso_time(entry.started)}) and it failed")
        return Decision(Status.DUPLICATE,
                        f"already processed (started at {iso_time(entry.started)})")
    why = f"history has a processing entry only (started at {iso_time(entry.started)})"
    if resolver is not None:
        return resolve(trigger, document, resolver, why, entry.describe())
    return Decision(Status.IN_DOUBT, why)


def resolve(
    trigger: TriggerDef,
    document: Document,
    resolver: Callee,
    why: str,
    entry: dict[str, object] | None = None,
    payload: Any = None,
    identity: str | None = None,
) -> Decision:
    """Ask the resolver (step 3) about a document, or about `payload` for it.

    A join's interrupted run asks once with the join document (`payload`) and the run's
    `identity`.
    """
    context = CallContext(
        trigger=trigger.name,
        identity=document.identity if identity is None else identity,
        activation=document.activation,
        delivery_count=document.delivery_count,
        message_id=document.message_id,
        history=entry,
    )
    try:
        answer = resolver.call(document.envelope if payload is None else payload, context)
    except TransientError as exc:
        return decide_unavailable(trigger, document, None, f"resolver unavailable: {exc}")
    except Exception as exc:
        return Decision(Status.IN_DOUBT,
                        f"{why}; resolver failed: {type(exc).__name__}: {exc}")
    answer = getattr(answer, "value", answer)  # an Enum answer reads as its value
    if answer == NEW:
        return Decision(Status.NEW, f"{why}; resolver returned NEW")
    if answer == DUPLICATE:
        return Decision(Status.DUPLICATE, f"{why}; resolver returned DUPLICATE")
    if answer == IN_DOUBT:
        return Decision(Status.IN_DOUBT, f"{why}; resolver returned IN_DOUBT")
    return Decision(Status.IN_DOUBT,
                    f"{why}; resolver returned {answer!r}, not NEW, DUPLICATE or IN_DOUBT")


def decide_unavailable(
    trigger: TriggerDef, document: Document, resolver: Callee | None, why: str
) -> Decision:
    """History (or the resolver) is unavailable: suspend, let the resolver decide, or doubt."""
    if trigger.on_retry_failure == ON_FAILURE_SUSPEND:
        return Decision(Status.SUSPEND, why)
    if resolver is not None:
        return resolve(trigger, document, resolver, why)
    return Decision(Status.IN_DOUBT, why)
