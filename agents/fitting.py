"""Every output of a sub-batch made to fit the record limit, in the worker's compiled path.

A service result cannot go by reference (it exists nowhere else): a run whose result is
too large ends as a service error instead (refuse_oversized_results), before it is
completed, so its history entry, journal records, error document and reply-to copies are
those of any failed run.  Every other output is measured against ONCEFLOW_MAX_RECORD_BYTES
and goes out by reference when it does not fit (limits.fit); the journal records of its
document say so (fit_take).  Compiled with mypyc (setup.py, COMPILED_WORKER): both run for
every document.
"""

from __future__ import annotations

from typing import Final

import orjson
from onceflow import journal as J
from onceflow.outputs import DEAD_LETTER_TOPIC, Output, output_headers, output_headers_text
from onceflow.running import ERROR, OK, ServiceResult

from . import limits
from .batch import Take

RESULT_TOO_LARGE = "ResultTooLarge"  # the error type of a run whose result is too large
# orjson's encoder and Fragment as constants: compiled, a Final is read from a C static,
# while `orjson.dumps` looks the name up on the module each time (a few a document).
_dumps: Final = orjson.dumps
_Fragment: Final = orjson.Fragment


def refuse_oversized_results(takes: list[Take], limit: int) -> None:
    """Make a run whose service result would be a record over `limit` a service error.

    Its error document (with its input documents, by reference if they are large too)
    goes to the trigger's error topic and to reply-to topics, its journal records are
    `error`, and its completed history entry is a failed one: the result is lost only
    in the sense that the service must run again (resubmit it, `--outcome error`) after
    it returns less, or after the limit is raised.  A result that fits is kept encoded.
    """
    for take in takes:
        run, result = take.run, take.result
        if take.rolled_back or run is None or result is None or result.outcome != OK \
                or result.value is None or type(result.value) is _Fragment:
            continue
        try:
            data = _dumps(result.value)
        except TypeError:
            continue  # not JSON: limits.fit publishes a note saying so
        trigger = take.processor.trigger
        key = run.activation if run.activation is not None else run.newest.key
        # The bound limits.output_size takes first, from the lengths of the headers the
        # output will have: most results fit by far, and need no output built to say so.
        count, chars = output_headers_text(trigger, run.identity, run.activation)
        if limits.rough_size(key, chars, count, len(data)) <= limit:
            result.value = _Fragment(data)  # encoded once (limits.encode)
            continue
        output = Output(trigger.output, key, None,
                        output_headers(trigger, run.identity, run.activation))
        size = limits.output_size(output, data, limit)
        if size <= limit:
            result.value = _Fragment(data)  # encoded once (limits.encode)
            continue
        message = (f"the service result is {size} bytes, {size - limit} bytes over "
                   f"{limits.SETTING} ({limit}): it was not published on {trigger.output}")
        take.result = ServiceResult(ERROR, None, result.attempts, RESULT_TOO_LARGE, message,
                                    result.retries)


def note_terminal(take: Take, note: str) -> None:
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
        note_terminal(take, "; ".join(notes))
