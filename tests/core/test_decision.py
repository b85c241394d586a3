"""The exactly-once decision, row by row from the seed tables (spec section 3).

Seed 000: delivery count 1 / >1 / -1 x history used or not x resolver or not.
Seed 004: what the document history holds (no entry, processing + completed, processing
only with and without resolver, completed only, identity longer than 96 characters).
Plus history unavailable and resolvers that fail.
"""

from __future__ import annotations

from typing import Any

import pytest
from onceflow.calls import CallContext, Callee
from onceflow.decision import Status, decide
from onceflow.envelope import Document, record_time
from onceflow.errors import HistoryUnavailable, TransientError
from onceflow.history import History
from onceflow.triggers import TriggerDef

NEW, DUP, REJ, DOUBT, SUSPEND = (Status.NEW, Status.DUPLICATE, Status.REJECTED,
                                 Status.IN_DOUBT, Status.SUSPEND)
TTL = 7_200_000  # ms


def make_trigger(**settings: Any) -> TriggerDef:
    return TriggerDef(name="t", types=("a",), **settings)


def make_doc(identity: str = "u-1", delivery_count: int = 1, ts: float = 100.0,
             body: Any = None) -> Document:
    return Document(type="a", identity=identity, activation=None,
                    envelope={"uuid": identity, "body": body or {}}, ts=record_time(ts), topic="a",
                    partition=0, offset=0, message_id="a/0@0",
                    delivery_count=delivery_count)


class Resolver:
    """A resolver that answers a fixed status (or raises) and remembers its calls."""

    def __init__(self, answer: Any = "DUPLICATE") -> None:
        self.answer = answer
        self.calls: list[CallContext] = []

    def __call__(self, document: Any, context: CallContext) -> Any:
        self.calls.append(context)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def callee(self) -> Callee:
        return Callee("test:resolver", self, True, False)


def history_with(entries: dict[str, list[Any]] | None = None, ttl: int = TTL) -> History:
    return History(dict(entries or {}), ttl)


# History states a test can ask for: the value History keeps is [start, flags] with
# flags 1 = processing, 2 = completed, 4 = failed.  Build them through the public API.
def seeded(*steps: tuple[str, bool], identity: str = "u-1", start: float = 50.0) -> History:
    history = history_with()
    for status, failed in steps:
        history.seed(identity, status, record_time(start), failed)
    return history


PROCESSING = ("processing", False)
COMPLETED = ("completed", False)
FAILED = ("completed", True)


# -- seed 000: step 1, the delivery count -------------------------------------------------

# (delivery count, history: None = not used / "empty" / "completed", resolver?, expected,
#  resolver consulted?).  The resolver answers DUPLICATE, so whether it decided shows.
SEED_000 = [
    # count 1: history used -> step 2; else New (the resolver is never asked).
    (1, "empty", False, NEW, False),
    (1, "empty", True, NEW, False),
    (1, "completed", False, DUP, False),
    (1, "completed", True, DUP, False),
    (1, None, False, NEW, False),
    (1, None, True, NEW, False),
    # count > 1: history used -> step 2; else resolver -> step 3; else In Doubt.
    (2, "empty", False, NEW, False),
    (2, "empty", True, NEW, False),
    (2, "completed", False, DUP, False),
    (5, "completed", True, DUP, False),
    (2, None, True, DUP, True),
    (2, None, False, DOUBT, False),
    (7, None, False, DOUBT, False),
    # count undefined (-1): history used -> step 2; else resolver -> step 3; else New.
    (-1, "empty", False, NEW, False),
    (-1, "empty", True, NEW, False),
    (-1, "completed", False, DUP, False),
    (-1, "completed", True, DUP, False),
    (-1, None, True, DUP, True),
    (-1, None, False, NEW, False),
]


@pytest.mark.parametrize("count,history_state,with_resolver,expected,asked", SEED_000)
def test_seed_000_delivery_count_table(count: int, history_state: str | None,
                                       with_resolver: bool, expected: Status,
                                       asked: bool) -> None:
    trigger = make_trigger(use_history=history_state is not None)
    history = None
    if history_state == "empty":
        history = history_with()
    elif history_state == "completed":
        history = seeded(PROCESSING, COMPLETED)
    resolver = Resolver("DUPLICATE")
    decision = decide(trigger, make_doc(delivery_count=count), history, "u-1",
                      resolver.callee() if with_resolver else None)
    assert decision.status is expected, decision.reason
    assert bool(resolver.calls) is asked
    if asked:
        assert resolver.calls[0].delivery_count == count


@pytest.mark.parametrize("answer,expected", [("NEW", NEW), ("DUPLICATE", DUP),
                                             ("IN_DOUBT", DOUBT)])
def test_seed_000_step_3_resolver_answers(answer: str, expected: Status) -> None:
    resolver = Resolver(answer)
    decision = decide(make_trigger(use_history=False), make_doc(delivery_count=2), None,
                      "u-1", resolver.callee())
    assert decision.status is expected
    assert len(resolver.calls) == 1
    assert resolver.calls[0].identity == "u-1"


def test_detect_duplicates_false_is_always_new_and_reads_nothing() -> None:
    resolver = Resolver("DUPLICATE")
    broken = History(BrokenStore(), TTL)
    for count in (1, 2, -1):
        decision = decide(make_trigger(detect_duplicates=False),
                          make_doc(delivery_count=count), broken, "u-1", resolver.callee())
        assert decision.status is NEW
    assert resolver.calls == []


# -- seed 004: step 2, the document history ----------------------------------------------

SEED_004 = [
    # (history steps, resolver answer or None, expected, resolver consulted?)
    ((), None, NEW, False),
    ((), "DUPLICATE", NEW, False),
    ((PROCESSING, COMPLETED), None, DUP, False),
    ((PROCESSING, COMPLETED), "NEW", DUP, False),
    ((COMPLETED,), None, DUP, False),
    ((COMPLETED,), "NEW", DUP, False),
    ((PROCESSING,), None, DOUBT, False),
    ((PROCESSING,), "NEW", NEW, True),
    ((PROCESSING,), "DUPLICATE", DUP, True),
    ((PROCESSING,), "IN_DOUBT", DOUBT, True),
    # a completed entry of a run that ended in a service error -> rejected (spec 3)
    ((FAILED,), None, REJ, False),
    ((PROCESSING, FAILED), None, REJ, False),
    ((PROCESSING, FAILED), "NEW", REJ, False),
]


@pytest.mark.parametrize("count", [1, 2, -1])
@pytest.mark.parametrize("steps,answer,expected,asked", SEED_004)
def test_seed_004_history_table(steps: tuple, answer: str | None, expected: Status,
                                asked: bool, count: int) -> None:
    history = seeded(*steps)
    resolver = Resolver(answer) if answer else None
    decision = decide(make_trigger(), make_doc(delivery_count=count), history, "u-1",
                      resolver.callee() if resolver else None)
    assert decision.status is expected, decision.reason
    if resolver is not None:
        assert bool(resolver.calls) is asked


def test_processing_only_resolver_is_told_what_history_holds() -> None:
    resolver = Resolver("NEW")
    decide(make_trigger(), make_doc(), seeded(PROCESSING, start=42.0), "u-1",
           resolver.callee())
    (context,) = resolver.calls
    assert context.history is not None
    assert context.history["processing"] is True
    assert context.history["completed"] is False
    assert context.history["started"] == 42.0


def test_history_is_keyed_by_identity() -> None:
    history = seeded(COMPLETED, identity="other")
    assert decide(make_trigger(), make_doc("u-1"), history, "u-1", None).status is NEW
    assert decide(make_trigger(), make_doc("other"), history, "other", None).status is DUP


def test_join_history_key_falls_back_to_the_plain_identity() -> None:
    # Design 2: a join trigger looks under (activation, identity) first, then under the
    # identity alone (a history.jsonl seed without activation).
    history = seeded(COMPLETED, identity="u-1")
    decision = decide(make_trigger(), make_doc("u-1"), history, "act\x1fu-1", None, "u-1")
    assert decision.status is DUP
    decision = decide(make_trigger(), make_doc("u-1"), history, "act\x1fu-1", None, None)
    assert decision.status is NEW


# identity length: 96 is checked, 97 cannot be ----------------------------------------------

@pytest.mark.parametrize("count", [1, 2, -1])
def test_identity_longer_than_96_without_resolver_is_in_doubt(count: int) -> None:
    long = "x" * 97
    decision = decide(make_trigger(), make_doc(long, delivery_count=count), history_with(),
                      long, None)
    assert decision.status is DOUBT
    assert "96" in decision.reason


@pytest.mark.parametrize("answer,expected", [("NEW", NEW), ("DUPLICATE", DUP),
                                             ("IN_DOUBT", DOUBT)])
def test_identity_longer_than_96_goes_to_the_resolver(answer: str, expected: Status) -> None:
    long = "x" * 97
    resolver = Resolver(answer)
    # Even a completed entry under that identity is not consulted.
    history = seeded(COMPLETED, identity=long)
    decision = decide(make_trigger(), make_doc(long), history, long, resolver.callee())
    assert decision.status is expected
    assert len(resolver.calls) == 1


def test_identity_of_exactly_96_is_checked_against_history() -> None:
    ident = "x" * 96
    assert decide(make_trigger(), make_doc(ident), history_with(), ident,
                  None).status is NEW
    assert decide(make_trigger(), make_doc(ident), seeded(COMPLETED, identity=ident), ident,
                  None).status is DUP


def test_long_identity_without_history_is_judged_on_delivery_count_only() -> None:
    long = "x" * 200
    trigger = make_trigger(use_history=False)
    assert decide(trigger, make_doc(long), None, long, None).status is NEW
    assert decide(trigger, make_doc(long, delivery_count=2), None, long, None).status is DOUBT


# TTL ------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc_ts,expected", [(50.0, DUP), (60.0, DUP), (60.001, NEW),
                                             (1000.0, NEW)])
def test_entry_older_than_ttl_is_ignored(doc_ts: float, expected: Status) -> None:
    history = History({}, ttl=10_000)
    history.seed("u-1", "completed", 50_000)
    decision = decide(make_trigger(), make_doc(ts=doc_ts), history, "u-1", None)
    assert decision.status is expected


def test_expired_processing_entry_does_not_make_in_doubt() -> None:
    history = History({}, ttl=10_000)
    history.seed("u-1", "processing", 0)
    assert decide(make_trigger(), make_doc(ts=5.0), history, "u-1", None).status is DOUBT
    assert decide(make_trigger(), make_doc(ts=11.0), history, "u-1", None).status is NEW


# -- resolvers that fail -------------------------------------------------------------------

def test_resolver_raising_a_non_transient_error_is_in_doubt() -> None:
    resolver = Resolver(RuntimeError("resolver bug"))
    decision = decide(make_trigger(use_history=False), make_doc(delivery_count=2), None,
                      "u-1", resolver.callee())
    assert decision.status is DOUBT
    assert "resolver bug" in decision.reason


def test_resolver_answer_that_is_not_a_status_is_in_doubt() -> None:
    decision = decide(make_trigger(use_history=False), make_doc(delivery_count=2), None,
                      "u-1", Resolver("MAYBE").callee())
    assert decision.status is DOUBT


@pytest.mark.parametrize("on_failure,expected", [("suspend", SUSPEND), ("error", DOUBT)])
def test_resolver_raising_transient_is_like_history_unavailable(on_failure: str,
                                                                expected: Status) -> None:
    # Spec 3: handled like an unavailable history: suspend, else (the resolver being the
    # thing that failed) In Doubt.  It is asked once, not again.
    resolver = Resolver(TransientError("resolver's database is down"))
    decision = decide(make_trigger(use_history=False, on_retry_failure=on_failure),
                      make_doc(delivery_count=2), None, "u-1", resolver.callee())
    assert decision.status is expected
    assert len(resolver.calls) == 1


def test_resolver_raising_transient_on_a_processing_entry() -> None:
    resolver = Resolver(TransientError("down"))
    decision = decide(make_trigger(on_retry_failure="suspend"), make_doc(),
                      seeded(PROCESSING), "u-1", resolver.callee())
    assert decision.status is SUSPEND
    decision = decide(make_trigger(), make_doc(), seeded(PROCESSING), "u-1",
                      resolver.callee())
    assert decision.status is DOUBT


# -- history unavailable -------------------------------------------------------------------

class BrokenStore(dict):
    """A history store that can be neither read nor written."""

    def get(self, key: Any, default: Any = None) -> Any:
        raise ConnectionError("history database is down")

    def __getitem__(self, key: Any) -> Any:
        raise ConnectionError("history database is down")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise ConnectionError("history database is down")

    def __contains__(self, key: object) -> bool:
        raise ConnectionError("history database is down")


def test_broken_store_makes_history_raise_history_unavailable() -> None:
    history = History(BrokenStore(), TTL)
    with pytest.raises(HistoryUnavailable):
        history.lookup("u-1", 0)
    with pytest.raises(HistoryUnavailable):
        history.mark_processing("u-1", 0)
    with pytest.raises(HistoryUnavailable):
        history.remove("u-1")
    assert issubclass(HistoryUnavailable, TransientError)


@pytest.mark.parametrize("count", [1, 2, -1])
def test_history_unavailable_with_suspend_suspends_without_asking_the_resolver(
        count: int) -> None:
    resolver = Resolver("NEW")
    decision = decide(make_trigger(on_retry_failure="suspend"),
                      make_doc(delivery_count=count), History(BrokenStore(), TTL), "u-1",
                      resolver.callee())
    assert decision.status is SUSPEND
    assert "history" in decision.reason
    assert resolver.calls == []


@pytest.mark.parametrize("answer,expected", [("NEW", NEW), ("DUPLICATE", DUP),
                                             ("IN_DOUBT", DOUBT)])
def test_history_unavailable_lets_the_resolver_decide(answer: str, expected: Status) -> None:
    resolver = Resolver(answer)
    decision = decide(make_trigger(), make_doc(), History(BrokenStore(), TTL), "u-1",
                      resolver.callee())
    assert decision.status is expected
    assert len(resolver.calls) == 1


@pytest.mark.parametrize("count", [1, 2, -1])
def test_history_unavailable_without_resolver_is_in_doubt(count: int) -> None:
    decision = decide(make_trigger(), make_doc(delivery_count=count),
                      History(BrokenStore(), TTL), "u-1", None)
    assert decision.status is DOUBT


def test_history_unavailable_and_resolver_transient_is_in_doubt() -> None:
    resolver = Resolver(TransientError("also down"))
    decision = decide(make_trigger(), make_doc(), History(BrokenStore(), TTL), "u-1",
                      resolver.callee())
    assert decision.status is DOUBT


# -- the history itself (seed 004: both entries share the start time) ----------------------

def test_history_entries_share_the_start_time_and_go_together() -> None:
    store: dict[str, Any] = {}
    history = History(store, ttl=100_000)  # times in ms
    history.mark_processing("u-1", 10_000)
    entry = history.lookup("u-1", 20_000)
    assert entry is not None and entry.processing and not entry.completed
    history.mark_completed("u-1", 10_000, failed=False)
    entry = history.lookup("u-1", 20_000)
    assert entry is not None and entry.processing and entry.completed and not entry.failed
    assert entry.started == 10_000
    history.mark_processing("u-2", 200_000)
    history.mark_completed("u-2", 200_000, failed=True)
    # The sweep at 150 removes u-1 (older than 100 s) but not u-2, and removes both
    # entries of u-1 at once.
    assert history.sweep(150_000) == 1
    assert history.lookup("u-1", 20_000) is None
    entry = history.lookup("u-2", 250_000)
    assert entry is not None and entry.failed
    history.remove("u-2")
    assert history.lookup("u-2", 250_000) is None
    assert len(history) == 0


def test_history_seed_rejects_unknown_status() -> None:
    with pytest.raises(ValueError):
        History({}, TTL).seed("u-1", "started", 0)


@pytest.mark.parametrize(("steps", "says"), [
    ((PROCESSING,), "history has a processing entry only (started at "
                    "2026-11-27T01:24:11.786Z)"),
    ((PROCESSING, COMPLETED), "already processed (started at 2026-11-27T01:24:11.786Z)"),
    ((PROCESSING, FAILED), "already processed (started at 2026-11-27T01:24:11.786Z) and "
                           "it failed"),
])
def test_reasons_give_the_start_time_as_an_iso_time(steps: Any, says: str) -> None:
    """Not the epoch seconds the entry keeps ("started at 1795742651.786", issue 28 §6)."""
    history = seeded(*steps, start=1795742651.786)
    decision = decide(make_trigger(), make_doc(ts=1795742652.0), history, "u-1", None)
    assert decision.reason == says


@pytest.mark.parametrize("ms", [0, 1, 999, -1, -1_001, 1_795_742_651_786, 1_795_742_651_000,
                                -62_135_596_800_000, 253_402_300_799_999, 951_782_400_123,
                                10**20, -(10**20)])
def test_iso_time_is_isoformat_to_the_millisecond_with_z(ms: int) -> None:
    """The written-out format is datetime's isoformat, years before 1000 and errors alike."""
    from datetime import UTC, datetime

    from onceflow.envelope import iso_time, seconds
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        expected = repr(seconds(ms))
    else:
        expected = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert iso_time(ms) == expected
