"""What a sub-batch writes besides state: reply-to copies first, then every output made to fit.

Reply-to copies.  A run that fails sends its error document to the trigger's error topic
and a copy to each reply-to topic its documents name.  The reply-to topic comes from the
publisher, so the worker does not let it fail the batch: a name that is not a legal Kafka
topic name, or one of onceflow's own topics, is not used; a legal one is created when
missing (agents/topics.py) and the copies are written on their own, before the rest of the
batch, waiting at most REPLY_WAIT seconds.  A copy that cannot go where it was asked goes
to the dead-letter topic with the reason.  The error document always goes to the error
topic and lists what became of each copy (`reply_to`); the journal's `error` records say
when a copy did not reach its topic.

Record size.  Every output is measured against ONCEFLOW_MAX_RECORD_BYTES and goes out by
reference when it does not fit (agents/limits.py); the journal records of its document say
so.  A service result cannot go by reference (it exists nowhere else): a run whose result
is too large ends as a service error instead (refuse_oversized_results), before it is
completed, so its history entry, journal records, error document and reply-to copies are
those of any failed run.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from onceflow import journal as J
from onceflow.envelope import Document
from onceflow.outputs import DEAD_LETTER_TOPIC, Output, output_headers, output_letter
from onceflow.running import ERROR, OK, SUSPEND, ServiceResult
from onceflow.tables.outbox import Outbox

from . import limits, wire
from .batch import Take
from .context import Shared
from .topics import illegal_topic_name

log = logging.getLogger("onceflow.worker")

REPLY_WAIT = 10.0  # seconds a reply-to topic has to take its copies
RESULT_TOO_LARGE = "ResultTooLarge"  # the error type of a run whose result is too large


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
                or result.value is None or type(result.value) is orjson.Fragment:
            continue
        try:
            data = orjson.dumps(result.value)
        except TypeError:
            continue  # not JSON: limits.fit publishes a note saying so
        trigger = take.processor.trigger
        key = run.activation if run.activation is not None else run.newest.key
        output = Output(trigger.output, key, None,
                        output_headers(trigger, run.identity, run.activation))
        size = limits.output_size(output, data, limit)
        if size <= limit:
            result.value = orjson.Fragment(data)  # encoded once (limits.encode)
            continue
        message = (f"the service result is {size} bytes, {size - limit} bytes over "
                   f"{limits.SETTING} ({limit}): it was not published on {trigger.output}")
        take.result = ServiceResult(ERROR, None, result.attempts, RESULT_TOO_LARGE, message,
                                    result.retries)


@dataclass(slots=True)
class ReplyCopy:
    """One reply-to copy of a failed run's error document."""

    take: Take
    output: Output
    member: Document  # the document that named the topic
    fate: dict[str, Any]


def reply_copies(take: Take) -> list[ReplyCopy]:
    """The reply-to copies among a take's outputs (after its error document)."""
    run, result, outputs = take.run, take.result, take.sink.outputs
    if run is None or result is None or result.outcome in (OK, SUSPEND) or not outputs:
        return []
    error = outputs[0]
    copies = []
    for output in outputs[1:]:
        if output.value is error.value:
            member = next((m for m in run.members if m.reply_to == output.topic), run.newest)
            copies.append(ReplyCopy(take, output, member, {"topic": output.topic}))
    return copies


def own_topic(rt: Shared, topic: str) -> str | None:
    """Why a topic may not take reply-to copies: it is one of onceflow's own."""
    names = rt.names
    own = {names.route, names.journal, names.acks, names.dead_letter,
           *(table.changelog for table in rt.tables.values())}
    if topic in own:
        return f"{topic!r} is one of onceflow's own topics"
    return None


async def deliver_replies(rt: Shared, takes: list[Take]) -> None:
    """Write the reply-to copies of these takes, or send them to the dead-letter topic."""
    copies = [copy for take in takes for copy in reply_copies(take)]
    if not copies:
        return
    by_topic: dict[str, list[ReplyCopy]] = {}
    for copy in copies:
        by_topic.setdefault(copy.output.topic, []).append(copy)
    limit = rt.options.max_record_bytes
    for target, group in by_topic.items():
        real = rt.names.topic(target)
        problem = illegal_topic_name(real) or own_topic(rt, real)
        if problem is None:
            problem = await rt.topics.ensure(real)
        if problem is None:
            outbox = Outbox()
            for copy in group:
                run = copy.take.run
                limits.fit(copy.output, "reply", run.members if run else [copy.member], limit)
            wire.add_outputs(outbox, rt.names, [copy.output for copy in group])
            try:
                await asyncio.wait_for(rt.sender.send(outbox), REPLY_WAIT)
            except Exception as exc:  # whatever the failure, the copies are kept elsewhere
                why = (f"no answer in {REPLY_WAIT:g} s" if isinstance(exc, TimeoutError)
                       else repr(exc))
                problem = f"{target!r} could not be written ({why})"
                rt.topics.broken(real, problem)
                log.warning("reply-to topic %s: %s", real, problem)
            else:
                rt.topics.written(real)
                for copy in group:
                    copy.fate["sent"] = True
                    _drop(copy)
                continue
        for copy in group:
            copy.fate.update(sent=False, reason=problem)
            _to_dead_letter(copy, target, problem)
    for take in {id(copy.take): copy.take for copy in copies}.values():
        _tell(take, [copy for copy in copies if copy.take is take])


def _drop(copy: ReplyCopy) -> None:
    outputs = copy.take.sink.outputs
    assert outputs is not None
    outputs[:] = [o for o in outputs if o is not copy.output]


def _to_dead_letter(copy: ReplyCopy, target: str, problem: str) -> None:
    output = copy.output
    letter = output_letter(output, copy.member, f"reply-to {problem}", reply_to=target)
    # In place: the take's outputs hold this object.
    output.topic, output.value = letter.topic, letter.value
    output.headers = {"reason": limits.clip(letter.headers["reason"])}


def _tell(take: Take, copies: list[ReplyCopy]) -> None:
    """The error document lists each copy's fate; the journal tells the failed ones."""
    outputs = take.sink.outputs
    assert outputs
    error = outputs[0]
    error.value = {**error.value, "reply_to": [copy.fate for copy in copies]}
    failed = [f"reply-to {copy.fate['reason']}: the copy went to {DEAD_LETTER_TOPIC}"
              for copy in copies if not copy.fate.get("sent")]
    if failed:
        _note(take, "; ".join(failed))


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
