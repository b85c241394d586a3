"""A runner's limit on join state: the core refuses a document before changing anything."""

from __future__ import annotations

from typing import Any

from onceflow import journal as J
from onceflow.calls import Callee
from onceflow.envelope import Document
from onceflow.joins import PENDING, REFUSED, JoinBook
from onceflow.processor import Sink, TriggerProcessor
from onceflow.triggers import TriggerDef


def doc(identity: str, type_: str, offset: int, activation: str = "act") -> Document:
    return Document(type=type_, identity=identity, activation=activation,
                    envelope={"uuid": identity, "activation": activation}, ts=offset * 1000,
                    topic=type_, partition=0, offset=offset,
                    message_id=f"{type_}/0@{offset}", delivery_count=1)


def at_most_one_waiting(activation: str, state: Any) -> str | None:
    """A limit that fits the state of one waiting member, not two."""
    members = state["members"]
    return None if len(members) <= 1 else f"holds {len(members)} members, more than 1"


TRIGGER = TriggerDef(name="j", types=("a", "b", "c"), condition="all", join_timeout=60_000)


def never_called(document: Any) -> Any:
    raise AssertionError("a refused document runs no service")


def test_a_document_the_join_cannot_keep_is_bad_input_and_the_join_stays_as_it_was() -> None:
    history: dict[str, Any] = {}
    joins: dict[str, Any] = {}
    processor = TriggerProcessor(TRIGGER, Callee("never", never_called, False, False), None,
                                 history, joins, join_fits=at_most_one_waiting)
    sink = Sink()
    assert processor.take(doc("a-1", "a", 0), sink) is None
    before = {key: dict(value) for key, value in joins.items()}
    kept = dict(history)

    refused = doc("b-1", "b", 1)
    assert processor.take(refused, sink) is None

    assert [(r.trigger, r.outcome, r.identity) for r in sink.journal] == [
        ("j", J.JOIN_PENDING, "a-1"), ("j", J.BAD_INPUT, "b-1")]
    reason = sink.journal[-1].reason
    assert reason == ("the open join of activation 'act' with this document holds 2 "
                      "members, more than 1: trigger 'j' does not take it; the record "
                      "stays on its topic")
    (error,) = sink.outputs or []
    assert error.topic == TRIGGER.error
    assert error.value["error"] == {"type": "BadInput", "message": reason}
    assert error.value["documents"] == [
        {"topic": "b", "partition": 0, "offset": 1, "identity": "b-1", "type": "b"}]
    # Nothing changed: the join still waits for its first member alone, no history.
    assert joins == before and history == kept
    assert [m.identity for m in processor.joins.members("act")] == ["a-1"]  # type: ignore[union-attr]


def test_without_a_limit_the_join_book_takes_every_document() -> None:
    book = JoinBook(TRIGGER, {})
    assert book.on_document(doc("a-1", "a", 0)).kind == PENDING
    assert book.on_document(doc("b-1", "b", 1)).kind == PENDING
    limited = JoinBook(TRIGGER, {}, fits=at_most_one_waiting)
    assert limited.on_document(doc("a-1", "a", 0)).kind == PENDING
    assert limited.on_document(doc("b-1", "b", 1)).kind == REFUSED
