"""A scenario as a live run sends it: headers that keep replay's identities and counts.

A live run cannot make the broker redeliver a record, so (spec section 7) it sends the
record again with `message-id` set to the first delivery's message id,
`delivery-count` 2 and a signed `onceflow-redelivery` marker naming the first delivery
(the live run signs it, knowing where that delivery landed: `FeedRecord.redelivers`).
Every record carries `message-id` set to its scenario coordinates, so an identity taken
from the message id is the one replay reports.  A shadow of ingress (the core's, over
memory) tells which triggers will answer each record, so the runner knows what to wait
for.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from onceflow.agents.signing import RouteSigner
from onceflow.agents.wire import route_partition
from onceflow.envelope import (
    H_DELIVERY_COUNT,
    H_MESSAGE_ID,
    H_REDELIVERY,
    Record,
    coordinates,
    record_time,
    seconds,
)
from onceflow.ingress import Ingress
from onceflow.partition import seed_route
from onceflow.scenario import Control, HistorySeed, Scenario
from onceflow.store import MemoryState
from onceflow.triggers import TriggerSet
from onceflow.values import encode_value


@dataclass(slots=True)
class FeedRecord:
    """One scenario record, ready to send, and who will answer it."""

    index: int
    record: Record
    value: bytes
    key: bytes | None
    headers: dict[str, str]
    answered_by: tuple[str, ...]  # trigger names; empty: ingress answers (trigger null)
    redelivers: int | None = None  # a redelivery: the scenario offset it hands over again


def feed(scenario: Scenario) -> Iterator[FeedRecord | Control]:
    """Every record of a scenario in file order, as a live run sends it.

    A control line (an operator's command) comes as it is, in its place.
    """
    state = MemoryState()
    shadow = Ingress(scenario.triggers, state.progress, state.id_store)
    for index, record in enumerate(scenario.iter_records()):
        if isinstance(record, Control):
            yield record
            continue
        headers = dict(record.headers)
        headers.setdefault(H_MESSAGE_ID, record.coordinates)
        highest = shadow.delivery.highest(record.topic, record.partition)
        redelivers = None
        if highest is not None and record.offset <= highest:
            headers.setdefault(H_DELIVERY_COUNT, "2")
            redelivers = record.offset
        document, targets, _ = shadow.admit_into(record, index, [])
        answered = tuple(t.name for t in targets) if document is not None else ()
        yield FeedRecord(index, record, encode_value(record.value),
                         record.key.encode() if record.key is not None else None,
                         headers, answered, redelivers)


def seed_message(seed: HistorySeed, base: float = 0) -> dict[str, Any]:
    """A history seed as a control message (its ts moved by `base`, as the records' are).

    Control messages carry times in seconds; `base` is a whole number of seconds.
    """
    ts = seconds(round(base * 1000) + seed.ts)
    return {"trigger": seed.trigger, "identity": seed.identity, "status": seed.status,
            "ts": ts, "failed": seed.failed, "activation": seed.activation}


def seed_partitions(triggers: TriggerSet, seed: HistorySeed, partitions: int) -> list[int]:
    """Where a seed must go: the partition of its routing key, or every partition.

    A join trigger keeps history under the activation; a seed without one applies to
    every activation, so every partition gets it.
    """
    key = seed_route(triggers.by_name(seed.trigger), seed.identity, seed.activation)
    if key is None:
        return list(range(partitions))
    return [route_partition(key, partitions)]


class StandIns:
    """Where each scenario record was first sent, and the marker of each stand-in.

    A live run's stand-in for the broker redelivering a record carries the header
    `onceflow-redelivery`: the live coordinates of the first delivery, signed with the
    run's admin key for the stand-in's topic, partition and value (spec section 7).
    """

    def __init__(self, signer: RouteSigner) -> None:
        self.signer = signer
        self._first: dict[tuple[str, int, int], int] = {}  # scenario coordinates -> live offset

    def headers(self, item: FeedRecord, topic: str) -> dict[str, str]:
        """The headers to send item with, to `topic` (its real name)."""
        record = item.record
        first = None
        if item.redelivers is not None:
            first = self._first.get((record.topic, record.partition, item.redelivers))
        if first is None:
            return item.headers
        marker = self.signer.redelivery_marker(
            topic, record.partition, coordinates(record.topic, record.partition, first),
            item.value)
        return item.headers if marker is None else {**item.headers, H_REDELIVERY: marker}

    def sent(self, item: FeedRecord, live_offset: int) -> None:
        """Remember where item landed (the first delivery of its coordinates counts)."""
        record = item.record
        self._first.setdefault((record.topic, record.partition, record.offset), live_offset)


class JournalMapper:
    """Puts journal records of a live run back in the scenario's terms.

    `base`: the milliseconds the run added to every scenario time; a record about no
    input record (a command's `suspended` or `resumed`) has it taken off its ts.
    """

    def __init__(self, base: int = 0) -> None:
        self._by_live: dict[tuple[str, int, int], Record] = {}
        self.base = base

    def sent(self, record: Record, topic: str, partition: int, live_offset: int) -> None:
        """Remember where a scenario record landed (topic: its logical name)."""
        self._by_live[(topic, partition, live_offset)] = record

    def source(self, line: dict[str, Any]) -> Record | None:
        """The scenario record a journal record is about, if any."""
        topic, partition, offset = line.get("topic"), line.get("partition"), line.get("offset")
        if topic is None or partition is None or offset is None:
            return None
        return self._by_live.get((topic, partition, offset))

    def map(self, line: dict[str, Any]) -> dict[str, Any]:
        """The journal record with ts, partition and offset of the scenario record."""
        record = self.source(line)
        out = dict(line)
        if record is not None:
            out["ts"] = seconds(record.ts)
            out["partition"] = record.partition
            out["offset"] = record.offset
        elif isinstance(line.get("ts"), int | float) and line.get("topic") is None:
            out["ts"] = seconds(record_time(line["ts"]) - self.base)
        return out
