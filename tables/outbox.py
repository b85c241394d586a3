"""Records to produce together: changelog entries, journal records, outputs, routed documents.

A batch fills an `Outbox`; a `Sender` produces it in as few producer batches as the
broker allows (one per topic-partition, split only by size) and waits for every
acknowledgement.  Faust's per-record produce path costs well over 100 microseconds a
record; a producer batch costs a few microseconds a record.
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import Sequence
from typing import Any, Final, Protocol

TopicPartition = tuple[str, int]


# A record batch header (61 bytes) and the framing of one record in it at its largest
# (length, attributes, timestamp and offset deltas, key and value lengths, header count).
RECORD_OVERHEAD: Final = 61 + 5 + 1 + 10 + 5 + 5 + 5 + 5
HEADER_OVERHEAD: Final = 10  # two length varints a header
# What the record builder is given for a record without headers (it never changes it).
_NO_HEADERS: Final[list[tuple[str, bytes | None]]] = []


def record_size(key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes | None]] = ()) -> int:
    """The bytes of a record batch that holds only this record (an upper bound).

    Kafka refuses a batch larger than `message.max.bytes`; a record that fits no batch
    beside others is sent in one of its own.
    """
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    for name, data in headers:
        size += HEADER_OVERHEAD + len(name.encode()) + len(data or b"")
    return size


class OutRecord:
    """One record to produce.

    A class of its own rather than a NamedTuple: mypyc compiles its __init__, while a
    NamedTuple's __new__ is interpreted (one record a document's journal record, output
    and changelog entries).
    """

    __slots__ = ("key", "value", "headers", "timestamp_ms")

    def __init__(self, key: bytes | None, value: bytes | None,
                 headers: Sequence[tuple[str, bytes | None]] = (),
                 timestamp_ms: int | None = None) -> None:
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp_ms = timestamp_ms


class Outbox:
    """Records grouped by topic and partition (None: by a hash of the key)."""

    __slots__ = ("records", "count")

    def __init__(self) -> None:
        self.records: dict[tuple[str, int | None], list[OutRecord]] = {}
        self.count = 0

    def add(self, topic: str, partition: int | None, key: bytes | None, value: bytes | None,
            headers: Sequence[tuple[str, bytes | None]] = (),
            timestamp_ms: int | None = None) -> None:
        """Queue one record."""
        bucket = self.records.get((topic, partition))
        if bucket is None:
            bucket = self.records[(topic, partition)] = []
        bucket.append(OutRecord(key, value, headers, timestamp_ms))
        self.count += 1

    def add_entries(self, topic: str, partition: int, entries: dict[bytes, bytes | None]
                    ) -> None:
        """Queue one record a (key, value), without headers or a timestamp (changelog)."""
        self.extend(topic, partition, [OutRecord(key, value) for key, value in entries.items()])

    def extend(self, topic: str, partition: int | None, records: list[OutRecord]) -> None:
        """Queue records for one topic and partition, in order.

        The outbox takes the list itself when it has none for that topic and partition
        yet: every caller hands it a list made for the call and keeps no other use of it.
        """
        bucket = self.records.get((topic, partition))
        if bucket is None:
            self.records[(topic, partition)] = records
        else:
            bucket.extend(records)
        self.count += len(records)

    def __len__(self) -> int:
        return self.count

    def clear(self) -> None:
        """Forget every queued record."""
        self.records.clear()
        self.count = 0


class Sender(Protocol):
    """Produces an outbox and waits until the broker has every record."""

    async def send(self, outbox: Outbox) -> dict[TopicPartition, int]:
        """Produce everything; return the last offset written per topic-partition."""


def _counted(batch: Any, count: int) -> Any:
    """An aiokafka BatchBuilder filled through its record builder, told how many it holds.

    BatchBuilder.append counts its records in `_relative_offset` (what record_count()
    answers).
    """
    batch._relative_offset = count
    return batch


class KafkaSender:
    """An outbox through one aiokafka producer, one producer batch per topic-partition."""

    def __init__(self, producer: Any, *, max_record_bytes: int | None = None) -> None:
        self._producer = producer
        self._partitions: dict[str, int] = {}
        self._spread = itertools.count()
        # Records are made to fit before they get here (agents/limits.py); one that does not
        # stops the batch here with its topic and size, not at the broker.
        self._limit = max_record_bytes

    async def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            count = self._partitions[topic] = len(await self._producer.partitions_for(topic))
        return count

    async def send(self, outbox: Outbox) -> dict[TopicPartition, int]:
        """Produce everything and wait for the acknowledgements."""
        if not outbox.count:
            return {}
        grouped: dict[TopicPartition, list[OutRecord]] = {}
        for (topic, partition), records in outbox.records.items():
            if partition is not None:
                grouped.setdefault((topic, partition), []).extend(records)
                continue
            count = await self._partition_count(topic)
            # The lists of this topic's partitions, looked up by number (not a new
            # (topic, partition) tuple a record).
            lists: dict[int, list[OutRecord]] = {}
            for record in records:
                # Any stable hash keeps one key's records in one partition; crc32 is C.
                chosen = (zlib.crc32(record.key) % count if record.key is not None
                          else next(self._spread) % count)
                bucket = lists.get(chosen)
                if bucket is None:
                    bucket = lists[chosen] = grouped.setdefault((topic, chosen), [])
                bucket.append(record)
        pending: list[tuple[TopicPartition, int, Any]] = []
        producer = self._producer
        limit = self._limit
        for (topic, partition), records in grouped.items():
            batch = producer.create_batch()
            # Records go straight into aiokafka's C record builder: BatchBuilder.append,
            # interpreted Python around that one call, was a twentieth of the worker's
            # CPU.  The batch learns its record count before it is sent (_counted;
            # tests/agents/test_patched_internals.py checks both names).
            builder = batch._builder
            size = 0
            for record in records:
                if limit is not None and len(record.value or b"") + len(
                        record.key or b"") > limit - 4096:
                    self._check_size(topic, record, limit)
                # aiokafka's builder takes headers as a list, nothing else (it only reads
                # them: records without headers share one empty list).
                headers = record.headers
                if type(headers) is not list:
                    headers = list(headers) if headers else _NO_HEADERS
                # Positional (offset, timestamp, key, value, headers): the builder's own
                # order, without a keyword tuple a record.
                if builder.append(size, record.timestamp_ms, record.key, record.value,
                                  headers) is None:
                    _counted(batch, size).close()  # as append closes a full batch
                    pending.append(((topic, partition), size,
                                    await producer.send_batch(batch, topic, partition=partition)))
                    batch = producer.create_batch()
                    builder = batch._builder
                    size = 0
                    if builder.append(0, record.timestamp_ms, record.key, record.value,
                                      headers) is None:
                        raise ValueError(f"a record for {topic} does not fit a producer batch")
                size += 1
            pending.append(((topic, partition), size, await producer.send_batch(
                _counted(batch, size), topic, partition=partition)))
        results = await asyncio.gather(*(future for _, _, future in pending))
        last: dict[TopicPartition, int] = {}
        for (tp, size, _), metadata in zip(pending, results, strict=True):
            last[tp] = max(last.get(tp, -1), metadata.offset + size - 1)
        return last


    @staticmethod
    def _check_size(topic: str, record: OutRecord, limit: int) -> None:
        size = record_size(record.key, record.value, record.headers)
        if size > limit:
            raise ValueError(f"a record for {topic} is about {size} bytes, more than the "
                             f"broker takes (ONCEFLOW_MAX_RECORD_BYTES = {limit})")
