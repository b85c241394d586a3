"""The state layer: buffered core stores over table partitions, undo, bulk flushes."""

from __future__ import annotations

import os

import orjson
import pytest
from aiokafka.partitioner import murmur2 as reference_murmur2
from hypothesis import given
from hypothesis import strategies as st
from memory_broker import MemoryBroker
from onceflow.keys import kafka_partition, murmur2
from onceflow.tables.outbox import Outbox
from onceflow.tables.raw_partition import DictPartition, RocksPartition, StorageError
from onceflow.tables.state import PartitionStore, TableBuffer, UndoLog, flush_state

keys = st.text(min_size=1, max_size=8)
values = st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=5),
                   st.lists(st.integers(-2**63, 2**63 - 1), max_size=3))


@given(st.lists(st.tuples(st.sampled_from(["set", "del"]), keys, values), max_size=40))
async def test_a_partition_store_behaves_like_a_dict(ops: list) -> None:
    buffer = TableBuffer(DictPartition(), "t-changelog", 0)
    store = PartitionStore(buffer, "p\x1f")
    model: dict = {}
    for index, (op, key, value) in enumerate(ops):
        if op == "set":
            store[key] = value
            model[key] = value
        elif key in model:
            del store[key]
            del model[key]
        else:
            with pytest.raises(KeyError):
                del store[key]
        if index % 7 == 3:
            await flush_state(MemoryBroker(1), [buffer])
        assert store.get(key) == model.get(key)
    assert dict(store.items()) == model
    assert len(store) == len(model) and sorted(store.keys()) == sorted(model)


async def test_writes_reach_the_changelog_before_the_local_store() -> None:
    raw = DictPartition()
    buffer = TableBuffer(raw, "t-changelog", 3)
    other = PartitionStore(buffer, "other\x1f")
    store = PartitionStore(buffer, "p\x1f")
    store["a"] = [1, 2]
    other["a"] = "x"
    assert raw.data == {}  # nothing local before the flush
    broker = MemoryBroker(4)
    await flush_state(broker, [buffer])
    log = broker.log("t-changelog", 3)
    assert {(r.key, r.value) for r in log} == {(b"p\x1fa", b"[1,2]"), (b"other\x1fa", b'"x"')}
    assert raw.data[b"p\x1fa"] == b"[1,2]" and raw.offset == 1  # Faust's persisted offset
    del store["a"]
    await flush_state(broker, [buffer])
    assert log[-1].value is None and b"p\x1fa" not in raw.data  # a tombstone


def test_an_undo_log_puts_back_what_was_overwritten() -> None:
    buffer = TableBuffer(DictPartition(), "t", 0)
    store = PartitionStore(buffer, "")
    store["kept"] = 1
    store["changed"] = "before"
    undo = UndoLog()
    store.undo = undo
    store["changed"] = "after"
    store["new"] = True
    del store["kept"]
    store.undo = None
    undo.roll_back()
    assert dict(store.items()) == {"kept": 1, "changed": "before"}


def test_murmur2_agrees_with_kafka() -> None:
    for length in range(0, 40):
        for _ in range(50):
            data = os.urandom(length)
            assert murmur2(data) == reference_murmur2(data)
    # Kafka's default partitioner (the Java client) puts these keys here.
    assert kafka_partition(b"a", 4) == (reference_murmur2(b"a") & 0x7FFFFFFF) % 4


async def test_an_outbox_keeps_order_within_a_partition() -> None:
    outbox = Outbox()
    for i in range(5):
        outbox.add("t", 1, str(i).encode(), orjson.dumps(i))
    outbox.add("t", None, b"k", b"by-key")
    broker = MemoryBroker(3)
    last = await broker.send(outbox)
    assert [orjson.loads(r.value) for r in broker.log("t", 1)][:5] == [0, 1, 2, 3, 4]
    assert last[("t", 1)] >= 4


def test_a_rocksdb_failure_is_a_storage_error_naming_the_store() -> None:
    # rocksdict raises plain Exceptions ("IO error: No space left on device ...").
    class FullDisk:
        def get(self, key: bytes) -> bytes:
            raise Exception("IO error: No space left on device")

        def items(self, from_key: bytes) -> list[tuple[bytes, bytes]]:
            raise Exception("IO error: No space left on device")

        def write(self, batch: object) -> None:
            raise Exception("IO error: No space left on device")

    class Store:
        def _db_for_partition(self, partition: int) -> FullDisk:
            return FullDisk()

        def partition_path(self, partition: int) -> str:
            return f"/data/v1/tables/ingress-{partition}.db"

    raw = RocksPartition(Store(), 3)
    for call in (lambda: raw.get(b"k"), lambda: list(raw.scan(b"a")),
                 lambda: raw.apply({b"k": b"v", b"gone": None}, 5)):
        with pytest.raises(StorageError, match="^the local store /data/v1/tables/ingress-3.db "
                                               "failed: IO error: No space left on device$"):
            call()
