"""What a sub-batch writes besides state: every output made to fit the record limit.

Every output is measured against ONCEFLOW_MAX_RECORD_BYTES and goes out by reference when
it does not fit (agents/limits.py); the journal records of its document say so.
"""

from __future__ import annotations

from onceflow import journal as J
from onceflow.engine import DEAD_LETTER_TOPIC

from . import limits
from .batch import Take


def _note(take: Take, note: str) -> None:
    """Add to the reason of the take's terminal journal records."""
    for record in take.sink.journal:
        if record.outcome in J.TERMINAL:
            record.reason = f"{record.reason}; {note}" if record.reason else note


def fit_take(take: Take, limit: int) -> None:
    """Make every output of a take fit the record limit (by reference if it must)."""
    outputs = take.sink.outputs
    if not outputs:
        return
    trigger = take.processor.trigger
    members = take.run.members if take.run is not None else [take.doc]
    notes = []
    for output in outputs:
        topic = output.topic
        if topic == trigger.output:
            kind = "output"
        elif topic == trigger.error:
            kind = "error"
        elif topic == trigger.in_doubt:
            kind = "in-doubt"
        elif topic == DEAD_LETTER_TOPIC:
            kind = "dead-letter"
        else:
            kind = "reply"
        note = limits.fit(output, kind, members, limit)
        if note is not None:
            notes.append(note)
    if notes:
        _note(take, "; ".join(notes))
