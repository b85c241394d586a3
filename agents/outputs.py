"""What a sub-batch writes besides state: the reply-to copies of its failed runs.

A run that fails sends its error document to the trigger's error topic and a copy to each
reply-to topic its documents name.  The reply-to topic comes from the publisher, so the
worker does not let it fail the batch: a name that is not a legal Kafka topic name, or one
of onceflow's own topics, is not used; a legal one is created when missing
(agents/topics.py) and the copies are written on their own, before the rest of the batch,
waiting at most REPLY_WAIT seconds.  A copy that cannot go where it was asked goes to the
dead-letter topic with the reason.  The error document always goes to the error topic and
lists what became of each copy (`reply_to`); the journal's `error` records say when a copy
did not reach its topic.

Every output, the copies included, is then made to fit the record limit
(agents/fitting.py).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from onceflow.envelope import Document
from onceflow.outputs import DEAD_LETTER_TOPIC, Output, output_letter
from onceflow.tables.outbox import Outbox

from . import limits, wire
from .batch import Take, failed_with_outputs
from .context import Shared
from .fitting import note_terminal
from .topics import illegal_topic_name

log = logging.getLogger("onceflow.worker")

REPLY_WAIT = 10.0  # seconds a reply-to topic has to take its copies


@dataclass(slots=True)
class ReplyCopy:
    """One reply-to copy of a failed run's error document."""

    take: Take
    output: Output
    member: Document  # the document that named the topic
    fate: dict[str, Any]


def reply_copies(take: Take) -> list[ReplyCopy]:
    """The reply-to copies among a failed run's outputs (after its error document).

    For the takes `failed_with_outputs` chose: a failed run that left outputs.
    """
    run, outputs = take.run, take.sink.outputs
    assert run is not None and outputs
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
    # Only a failed run that left outputs has copies (failed_with_outputs, compiled).
    copies = [copy for take in failed_with_outputs(takes) for copy in reply_copies(take)]
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
        note_terminal(take, "; ".join(failed))
