"""Fetched record batches that aiokafka cannot decode: a header name that is not UTF-8.

Kafka's record format stores header names as bytes; aiokafka (0.12 to 0.14 at least)
decodes them as strict UTF-8 while it unpacks a fetched batch, inside the consumer.  One
record with such a name makes the fetch raise `UnicodeDecodeError` out of `getmany`, the
worker stops, and after a restart the same record is fetched again: a crash loop, and no
record after it on that partition is ever processed.  aiokafka has no setting or
deserializer hook for header names (key and value deserializers see only key and value).

So the worker hands the fetcher a records reader of its own (`install`): the one name
the fetcher builds fetched data with, `aiokafka.consumer.fetcher.MemoryRecords`.  It
slices batches as aiokafka does and reads each with aiokafka's compiled batch reader, the
fast path every well-formed batch takes.  Only a batch whose reading raises
`UnicodeDecodeError` is read again, from its own bytes, by aiokafka's pure-Python reader
with header names decoded with "surrogateescape": nothing is lost (each byte that is not
UTF-8 becomes one lone surrogate, which `str.encode("utf-8", "surrogateescape")` turns
back), and the core then makes the record bad input, naming the header
(onceflow.values.header_problem); its dead-letter copy holds the name's bytes in base64.
Records before it in the batch are not handed over twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.errors import CorruptRecordException
from aiokafka.record import default_records, memory_records

log = logging.getLogger("onceflow.transport")

_ORIGINAL = fetcher.MemoryRecords


class _TolerantBatchPy(default_records._DefaultRecordBatchPy):
    """aiokafka's pure-Python batch reader, with header names read as surrogateescape.

    `_read_msg` is aiokafka's own (default_records.py), with that one decode changed.
    """

    def _read_msg(self, decode_varint: Any = default_records.decode_varint) -> Any:
        buffer = self._buffer
        pos = self._pos
        length, pos = decode_varint(buffer, pos)
        start_pos = pos
        _, pos = decode_varint(buffer, pos)  # attributes
        ts_delta, pos = decode_varint(buffer, pos)
        if self.timestamp_type == self.LOG_APPEND_TIME:
            timestamp = self.max_timestamp
        else:
            timestamp = self.first_timestamp + ts_delta
        offset_delta, pos = decode_varint(buffer, pos)
        offset = self.base_offset + offset_delta
        key_len, pos = decode_varint(buffer, pos)
        key = None
        if key_len >= 0:
            key = bytes(buffer[pos:pos + key_len])
            pos += key_len
        value_len, pos = decode_varint(buffer, pos)
        value = None
        if value_len >= 0:
            value = bytes(buffer[pos:pos + value_len])
            pos += value_len
        header_count, pos = decode_varint(buffer, pos)
        if header_count < 0:
            raise CorruptRecordException(f"Found invalid number of record headers {header_count}")
        headers: list[tuple[str, bytes | None]] = []
        while header_count:
            h_key_len, pos = decode_varint(buffer, pos)
            if h_key_len < 0:
                raise CorruptRecordException(f"Invalid negative header key size {h_key_len}")
            h_key = bytes(buffer[pos:pos + h_key_len]).decode("utf-8", "surrogateescape")
            pos += h_key_len
            h_value_len, pos = decode_varint(buffer, pos)
            h_value = None
            if h_value_len >= 0:
                h_value = bytes(buffer[pos:pos + h_value_len])
                pos += h_value_len
            headers.append((h_key, h_value))
            header_count -= 1
        if pos - start_pos != length:
            raise CorruptRecordException(
                f"Invalid record size: expected to read {length} bytes in record payload, "
                f"but instead read {pos - start_pos}")
        self._pos = pos
        return default_records._DefaultRecordPy(offset, timestamp, self.timestamp_type, key,
                                                value, headers)


class _Batch:
    """A v2 record batch: aiokafka's compiled reader, the tolerant one where it fails."""

    __slots__ = ("_batch", "_data", "_records")

    def __init__(self, batch: Any, data: memoryview) -> None:
        self._batch = batch
        self._data = data
        self._records: Iterator[Any] | None = None

    def __getattr__(self, name: str) -> Any:  # base_offset, validate_crc, producer_id, ...
        return getattr(self._batch, name)

    def __iter__(self) -> Iterator[Any]:
        if self._records is None:
            self._records = self._read()
        return self._records

    def __next__(self) -> Any:  # (aiokafka reads a control batch's record with next())
        return next(iter(self))

    def _read(self) -> Iterator[Any]:
        last: int | None = None
        try:
            for record in self._batch:
                last = record.offset
                yield record
            return
        except UnicodeDecodeError as exc:
            log.warning("a record batch at offset %s has a header name that is not UTF-8 "
                        "(%s); reading it again with such names kept as bytes",
                        self._batch.base_offset, exc)
        for record in _TolerantBatchPy(self._data):
            if last is None or record.offset > last:
                yield record


class TolerantRecords(memory_records._MemoryRecordsPy):
    """The fetcher's MemoryRecords, whose v2 batches survive header names not in UTF-8."""

    def next_batch(self, *args: Any) -> Any:
        """The next batch; a v2 batch comes wrapped with its bytes."""
        data = self._next_slice
        batch = super().next_batch(*args)
        if data is None or not isinstance(batch, default_records.DefaultRecordBatch):
            return batch
        return _Batch(batch, data)


def install() -> None:
    """Make every aiokafka fetcher of this process read batches with TolerantRecords."""
    current = fetcher.MemoryRecords
    if current is TolerantRecords:
        return
    if current is not _ORIGINAL:
        raise RuntimeError(f"aiokafka's fetcher reads records with {current!r}, not with "
                           f"aiokafka's own MemoryRecords: onceflow cannot install its reader")
    fetcher.MemoryRecords = TolerantRecords


class RawHeaderName(str):
    """A header name read with "surrogateescape", written back as its original bytes."""

    __slots__ = ()

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        """The name's original bytes (whatever encoding or errors are asked for)."""
        return str(self).encode("utf-8", "surrogateescape")


def has_raw_header_name(headers: Any) -> bool:
    """Whether a header name was not UTF-8 on the wire (read back by TolerantRecords)."""
    for name, _ in headers or ():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            return True
    return False


def raw_name_batch(producer: Any, key: bytes | None, value: bytes | None,
                   timestamp_ms: int | None, headers: Any) -> Any:
    """A one-record batch for `producer.send_batch` whose header names keep their bytes.

    aiokafka's producer encodes header names as strict UTF-8 (its compiled builder takes
    nothing else), so such a record is built by aiokafka's pure-Python builder, which
    writes what each name's `encode` returns.  Not for an idempotent producer.
    """
    batch = producer.create_batch()
    batch._builder = default_records._DefaultRecordBatchBuilderPy(
        2, 0, is_transactional=0, producer_id=-1, producer_epoch=-1, base_sequence=0,
        batch_size=2 ** 31 - 1)
    if batch.append(key=key, value=value, timestamp=timestamp_ms,
                    headers=[(RawHeaderName(name), data) for name, data in headers]) is None:
        raise ValueError("the record does not fit in a batch")
    batch.close()
    return batch
