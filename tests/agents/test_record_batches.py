"""The worker's reader of fetched record batches: header names that are not UTF-8.

aiokafka's reader raises UnicodeDecodeError on such a name (inside the consumer's fetch);
the worker's reader hands every record over once, the name decoded losslessly.  Through a
real worker: tests/integration/test_hostile_records.py.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.memory_records import MemoryRecords
from onceflow.agents import record_batches
from onceflow.agents.record_batches import TolerantRecords


class RawName(str):
    """A header name whose bytes are not UTF-8 (aiokafka's Python builder writes them)."""

    def encode(self, *_: Any, **__: Any) -> bytes:  # type: ignore[override]
        return b"\xff\xfe"


def batch(base: int, headers: list[list[tuple[str, bytes]]], compression: int = 0) -> bytes:
    builder = _DefaultRecordBatchBuilderPy(
        magic=2, compression_type=compression, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for index, names in enumerate(headers):
        builder.append(index, timestamp=None, key=b"k", value=b"v%d" % (base + index),
                       headers=names)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base)  # the base offset (outside the checksum)
    return bytes(data)


def read(records: Any) -> list[tuple[int, bytes, list[tuple[str, bytes]]]]:
    out = []
    while records.has_next():
        next_batch = records.next_batch()
        assert next_batch.validate_crc()
        out.extend((r.offset, r.value, r.headers) for r in next_batch)
    return out


@pytest.mark.parametrize("compression", [0, 1], ids=["plain", "gzip"])
def test_a_bad_header_name_is_read_losslessly_and_every_record_once(compression: int) -> None:
    data = (batch(0, [[("a", b"1")], [("b", b"2"), (RawName("x"), b"3")], []], compression)
            + batch(3, [[], [("c", b"4")]], compression))
    with pytest.raises(UnicodeDecodeError):
        read(MemoryRecords(data))  # aiokafka's own reader
    assert read(TolerantRecords(data)) == [
        (0, b"v0", [("a", b"1")]),
        (1, b"v1", [("b", b"2"), ("\udcff\udcfe", b"3")]),
        (2, b"v2", []),
        (3, b"v3", []),
        (4, b"v4", [("c", b"4")]),
    ]
    assert "\udcff\udcfe".encode("utf-8", "surrogateescape") == b"\xff\xfe"


def test_well_formed_batches_read_as_aiokafka_reads_them() -> None:
    data = batch(0, [[("a", b"1")], [], [("é", b"\xff")]]) + batch(3, [[]])
    assert read(TolerantRecords(data)) == read(MemoryRecords(data))


def test_install_replaces_only_aiokafka_own_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher, "MemoryRecords", record_batches._ORIGINAL)
    record_batches.install()
    record_batches.install()
    assert fetcher.MemoryRecords is TolerantRecords
    monkeypatch.setattr(fetcher, "MemoryRecords", object)
    with pytest.raises(RuntimeError, match="cannot install its reader"):
        record_batches.install()
