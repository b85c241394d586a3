"""What a partition does with a record it cannot decide: journal it, keep a copy, go on.

Bad input at ingress (a value too large, a time too far ahead of the clock, a document a
trigger cannot take whole), repartition-topic records that cannot be applied, documents
routed for a trigger this worker does not have, and the last resort: a record the worker
itself failed on.  Each gets a `bad-input` (or `error`) journal record and a dead-letter
copy; the record's offset is committed like any other.  The dead-letter document is the
core's (onceflow.outputs), but for the last resort, which must read nothing that can fail.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from abc import abstractmethod
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from mypy_extensions import trait
from onceflow import journal as J
from onceflow.envelope import Document, Record, coordinates, envelope_fields, seconds
from onceflow.journal import JournalRecord
from onceflow.outputs import (
    DEAD_LETTER_TOPIC,
    Output,
    document_letter,
    refusal,
    rejection,
)
from onceflow.processor import Sink, TriggerProcessor
from onceflow.tables.raw_partition import StorageError
from onceflow.tables.state import StateCorrupt
from onceflow.values import decode_value

from . import limits, wire
from .context import Shared

log = logging.getLogger("onceflow.worker")


class RecordFault(Exception):
    """Handling some records failed in a way one record can cause.

    `durable`: how many of them (from the first) are durable; `at`: the record at hand.
    """

    def __init__(self, error: Exception, durable: int, at: str) -> None:
        super().__init__(f"{at}: {error!r}")
        # Its cause is the failure, set here: compiled code (mypyc) drops the `from` of
        # `raise ... from ...`.
        self.__cause__ = error
        self.durable = durable
        self.at = at


def _printable(text: str) -> str:
    """Text that any JSON writer takes (an exception may quote undecodable bytes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def stops_the_worker(exc: Exception) -> bool:
    """Whether a failure is not the record's: the broker, the local store, corrupt state.

    These stop the worker (fail-stop: the batch is not acknowledged, and is decided again
    after a restart); any other failure is the record's to carry.  A full disk under the
    local store (StorageError) is never a record's fault.
    """
    return isinstance(exc, KafkaError | OSError | TimeoutError | StateCorrupt | StorageError)


@trait
class RejectMixin:
    """The partition worker's paths for records it cannot decide.

    A mypyc trait: the worker is compiled, and a compiled class can inherit only compiled
    classes (one of them a regular class, the rest traits).
    """

    rt: Shared
    lock: asyncio.Lock
    journal: list[JournalRecord]
    outputs: list[Any]
    processors: dict[str, TriggerProcessor]
    _raw_key: bytes | None
    _null_headers: list[str]

    joins: dict[str, Any]

    # Provided by the partition worker.
    @abstractmethod
    def where(self, delivery: wire.Delivery) -> str: ...  # noqa: D102
    @abstractmethod
    async def _flush(self) -> None: ...

    async def reject(self, delivery: wire.Delivery, fault: RecordFault) -> None:
        """A record the worker failed on, alone: journal it, keep it, and go on.

        `bad-input` (trigger null) with the failure as the reason, and a dead-letter copy
        of the record as it was; its offset is committed like any other.
        """
        async with self.lock:
            error = fault.__cause__ or fault
            what = limits.clip(_printable(f"{type(error).__name__}: {error}"))
            where = self.where(delivery)
            reason = (f"the worker failed on record {where} ({what}); it was not processed "
                      f"and is kept on {DEAD_LETTER_TOPIC}; please report it")
            log.error("onceflow: %s", reason, exc_info=error)
            self._failed_input(delivery, reason)
            await self._flush()

    def _record_of(self, delivery: wire.Delivery, value: Any = None) -> Record:
        """The core's record of a delivery, with `value` (decoded, or None for now).

        Its key and headers are read as documents carry them (wire.record_of); a key that
        is not UTF-8 and the names of null headers are kept aside for a dead-letter copy
        of the record (see _rejected).
        """
        record, self._raw_key, self._null_headers = wire.record_of(
            delivery, self.rt.names.logical(delivery.topic), value)
        return record

    def _keep_letter(self, letter: Output, size: int) -> None:
        """Send a dead letter of the record at hand (by reference if it must: its size)."""
        if limits.fit(letter, "dead-letter", [], self.rt.options.max_record_bytes):
            letter.value["size"] = size
        self.outputs.append(letter)

    def _rejected(self, record: Record, reason: str, identity: str | None,
                  activation: str | None, size: int, *, trigger: str | None = None,
                  by_reference: bool = False) -> None:
        """The record at hand is not decided: journal `bad-input`, keep a dead letter.

        `by_reference`: the value is not copied (the record stays on its topic).
        """
        entry, letter = rejection(record, reason, identity, activation, trigger,
                                  raw_key=self._raw_key, null_headers=self._null_headers)
        self.journal.append(entry)
        if not by_reference:
            self._keep_letter(letter, size)
            return
        letter.value.pop("value", None)
        letter.value["size"] = size
        limits.fit(letter, "dead-letter", [], self.rt.options.max_record_bytes)  # its headers
        self.outputs.append(letter)

    def _failed_input(self, delivery: wire.Delivery, reason: str) -> None:
        """The last resort for a record (input or route): journal it, keep its bytes.

        Nothing here parses the record again (the normal path just failed on it): the
        identity is its coordinates, and the dead letter holds the key, value and headers
        as raw text, or in base64 where they are not UTF-8 (see raw_letter).
        """
        rt = self.rt
        topic = rt.names.logical(delivery.topic)
        where = coordinates(topic, delivery.partition, delivery.offset)
        self.journal.append(J.bad_input(None, where, None, delivery.ts, topic,
                                        delivery.partition, delivery.offset, reason))
        self.outputs.append(raw_letter(delivery, topic, reason, rt.options.max_record_bytes))

    def _too_large(self, processor: TriggerProcessor, doc: Document, why: str,
                   sink: Sink | None = None) -> None:
        """Bad input for a trigger: the document cannot be routed, held or joined whole.

        Journal `bad-input`; the trigger's error topic gets an error document (BadInput)
        that refers to the input record, which stays on its topic.
        """
        if sink is None:
            sink = Sink(self.journal, self.outputs)
        record, error = refusal(processor.trigger, doc, why)
        sink.journal.append(record)
        limits.fit(error, "error", [doc], self.rt.options.max_record_bytes)
        sink.output(error)

    def _oversized(self, record: Record, value: bytes, size: int) -> None:
        limit = self.rt.options.max_document_bytes
        reason = (f"the value is {size} bytes, more than max_document_bytes ({limit}): "
                  f"onceflow does not copy it; the record stays on its topic")
        try:
            uuid, activation = envelope_fields(orjson.loads(value))
        except orjson.JSONDecodeError:
            uuid, activation = None, None
        self._rejected(record, reason, uuid or record.message_id, activation, size,
                       by_reference=True)

    def _ahead_of_clock(self, delivery: wire.Delivery, why: str) -> None:
        """Bad input at ingress, before any state is written: a record time too far ahead."""
        rt = self.rt
        value = delivery.value
        record = self._record_of(delivery)
        size = len(value or b"")
        if size <= rt.options.max_document_bytes:
            record.value = decode_value(value)
        uuid, activation = envelope_fields(record.value)
        reason = f"the record: {why}; the record stays on its topic"
        self._rejected(record, reason, uuid or record.message_id, activation, size,
                       by_reference=size > rt.options.max_document_bytes)

    def bad_route_record(self, delivery: wire.Delivery, reason: str, *,
                         trigger: str | None = None) -> None:
        """A repartition-topic record this worker cannot apply: journal it, keep a copy.

        Journal `bad-input` (trigger null, or the trigger a control message names) with
        the reason, which names the record's coordinates; the record goes to the
        dead-letter topic as it was; the worker goes on (its offset is committed).
        """
        log.warning("onceflow: %s", limits.clip(reason))
        record = self._record_of(delivery, decode_value(delivery.value))
        identity = None if trigger is not None else self.where(delivery)
        self._rejected(record, reason, identity, None, len(delivery.value or b""),
                       trigger=trigger)

    def _unknown_triggers(self, names: list[str], doc: Document) -> None:
        """A document routed here for triggers this worker does not have: keep it.

        During a rolling change of the trigger file a worker with the new file can route a
        document to one still running the old file (or the other way round).  Each such
        trigger gets an `error` journal record, and the document goes to the dead-letter
        topic; `onceflow resubmit TRIGGER --outcome error` runs it once every worker has
        the trigger.
        """
        listed = ", ".join(repr(name) for name in names)
        subject = f"trigger {listed} is" if len(names) == 1 else f"triggers {listed} are"
        reason = (f"{subject} not defined on this worker: a worker with another trigger "
                  f"file routed this document here; the document went to "
                  f"{DEAD_LETTER_TOPIC}; once every worker runs the same trigger file, "
                  f"resubmit it (onceflow resubmit TRIGGER --outcome error)")
        for name in names:
            self.journal.append(JournalRecord(name, J.ERROR, doc.identity, doc.activation,
                                              doc.ts, doc.topic, doc.partition, doc.offset,
                                              reason, None, doc.position))
        letter = document_letter(doc, reason, triggers=names)
        limits.fit(letter, "dead-letter", [doc], self.rt.options.max_record_bytes)
        self.outputs.append(letter)


# _text and _base64 take Any: in compiled code an annotation is checked at the call, and a
# header of a record the worker failed on may hold anything.
def _text(data: Any) -> str | None:
    """The data as UTF-8 text, or None when it is not (never raises)."""
    try:
        if isinstance(data, str):
            data.encode("utf-8")  # a name read with surrogateescape is not text
            return data
        return bytes(data).decode("utf-8") if data is not None else None
    except (UnicodeError, TypeError, ValueError):
        return None


def _base64(data: Any) -> str:
    try:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        return base64.b64encode(bytes(data or b"")).decode("ascii")
    except (UnicodeError, TypeError, ValueError):
        return ""


def raw_letter(delivery: wire.Delivery, topic: str, reason: str, limit: int) -> Output:
    """The dead-letter copy of a record the worker failed on, from its bytes alone.

    {"reason", "topic", "partition", "offset", "ts", "raw" (the value as UTF-8 text) or
    "raw_base64", "headers": {name: text or null}, "headers_base64": [{"name", "value"}]
    for the ones that are not UTF-8, "key_base64" when the key is not UTF-8}, the key as
    the record's key when it is text.  Nothing here can fail on what the record holds.

    The one dead letter built outside the core (onceflow.outputs): the core's copies read
    the decoded record, and this last resort must read nothing that can fail, so it
    keeps the bytes as they came instead.
    """
    body: dict[str, Any] = {"reason": reason, "topic": topic, "partition": delivery.partition,
                            "offset": delivery.offset,
                            "ts": seconds(delivery.ts) if type(delivery.ts) is int else None}
    value = delivery.value
    if value is not None:
        text = _text(value)
        if text is not None:
            body["raw"] = text
        else:
            body["raw_base64"] = _base64(value)
    headers: dict[str, str | None] = {}
    binary: list[dict[str, str | None]] = []
    raw_headers: list[Any] = delivery.headers or []  # items unchecked (see _text)
    for header in raw_headers:
        try:
            name, data = header
        except (TypeError, ValueError):
            continue
        name_text = _text(name)
        data_text = _text(data)
        if name_text is not None and (data is None or data_text is not None):
            headers[name_text] = data_text
        else:
            binary.append({"name": _base64(name),
                           "value": None if data is None else _base64(data)})
    body["headers"] = headers
    if binary:
        body["headers_base64"] = binary
    key = _text(delivery.key) if delivery.key else None
    if delivery.key and key is None:
        body["key_base64"] = _base64(delivery.key)
    letter = Output(DEAD_LETTER_TOPIC, key, body, {"reason": limits.clip(reason)})
    size = len(value or b"")
    if limits.fit(letter, "dead-letter", [], limit):
        letter.value["size"] = size
    return letter


def claims(value: bytes | None) -> str:
    """What an unverified route record says it is (" (a suspend message for 'x')"), if any."""
    try:
        message = orjson.loads(value) if value else None
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(message, dict) or not isinstance(message.get("k"), str):
        return ""
    kind = limits.clip(message["k"], 80)
    names = message.get("t") if kind == wire.DOC else [message.get("trigger")]
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        return f" (a {kind!r} message for {limits.clip(', '.join(map(repr, names)), 200)})"
    return f" (a {kind!r} message)"
