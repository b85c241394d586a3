"""The Faust and aiokafka internals agents/transport.py replaces or reads are there, as it
expects them (pyproject.toml pins both libraries; this fails loudly when a new release moves
or reshapes one of them, before a worker meets it)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import aiokafka
import pytest
from aiokafka.consumer import fetcher
from faust.tables.recovery import Recovery
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import tuples
from mode.utils import futures
from onceflow.agents import highwaters, transport
from onceflow.agents.faust_app import OnceflowApp
from onceflow.agents.metrics import Metrics
from onceflow.agents.wire import Names

# (owner, method, its parameters after self): the methods transport.py overrides or calls.
METHODS = [
    (faust_aiokafka.AIOKafkaConsumerThread, "_create_worker_consumer", ["transport"]),
    (faust_aiokafka.AIOKafkaConsumerThread, "_highwaters", ["partitions"]),
    (faust_aiokafka.Consumer, "_new_consumer_thread", []),
    (faust_aiokafka.Consumer, "seek", ["partition", "offset"]),
    (faust_aiokafka.Consumer, "_seek", ["partition", "offset"]),
    (faust_aiokafka.Consumer, "seek_wait", ["partitions"]),
    (faust_aiokafka.Consumer, "seek_to_committed", []),
    (faust_aiokafka.Consumer, "perform_seek", []),
    (faust_aiokafka.Consumer, "on_partitions_revoked", ["revoked"]),
    (faust_aiokafka.Consumer, "on_partitions_assigned", ["assigned", "generation_id"]),
    (faust_aiokafka.Consumer, "_drain_messages", ["fetcher"]),
    (faust_aiokafka.Consumer, "_wait_next_records", ["timeout"]),
    (faust_aiokafka.Consumer, "_to_message", ["tp", "record"]),
    (faust_aiokafka.Consumer, "_add_gap", ["tp", "offset_from", "offset_to"]),
    (faust_aiokafka.Consumer, "track_message", ["message"]),
    (faust_aiokafka.Consumer, "highwater", ["tp"]),
    (Recovery, "flush_buffers", []),
    (Recovery, "need_recovery", []),
    (Recovery, "_set_recovery_ended", []),
    (aiokafka.AIOKafkaConsumer, "seek_to_committed", ["partitions"]),
]


@pytest.mark.parametrize(("owner", "name", "parameters"), METHODS,
                         ids=[f"{owner.__name__}.{name}" for owner, name, _ in METHODS])
def test_a_method_transport_relies_on_has_its_shape(owner: Any, name: str,
                                                    parameters: list[str]) -> None:
    method = getattr(owner, name, None)
    assert callable(method), f"{owner.__module__}.{owner.__name__}.{name} is gone"
    found = [p for p in inspect.signature(method).parameters if p != "self"]
    assert found == parameters, (f"{owner.__name__}.{name}{found}: transport.py expects "
                                 f"{parameters}; read the new release before unpinning it")


def test_module_level_names_transport_uses_are_there() -> None:
    assert isinstance(faust_consumer.CONSUMER_FETCHING, str)
    assert hasattr(tuples.ack_lock, "__enter__")
    assert callable(futures.notify)
    assert callable(faust_aiokafka.credentials_to_aiokafka_auth)
    assert faust_aiokafka.Transport.Consumer is not None
    assert fetcher.MemoryRecords is not None  # record_batches.install replaces it


def test_aiokafka_seeks_to_committed_only_above_0() -> None:
    """Why transport.py seeks dropped records back itself (issue 28 §1)."""
    source = inspect.getsource(aiokafka.AIOKafkaConsumer.seek_to_committed)
    assert "if offset and offset > 0:" in source


def test_the_state_transport_reads_on_a_consumer_is_there() -> None:
    app = OnceflowApp("internals", broker="kafka://127.0.0.1:9", store="memory://")
    app.runtime = SimpleNamespace(metrics=Metrics(), names=Names(""))
    consumer = app.consumer
    assert isinstance(consumer, transport.Consumer)
    for name in ("_read_offset", "_committed_offset", "_acked", "_acked_index", "_n_acked",
                 "_unacked_messages", "_waiting_for_ack", "_buffered_partitions",
                 "flow_active", "suspend_flow", "scheduler", "consumer_stopped_errors",
                 "diag", "callback", "_thread"):
        assert hasattr(consumer, name), f"Faust's consumer has no {name} any more"
    assert callable(consumer.scheduler.iterate)
    assert hasattr(app, "consumer_generation_id") and hasattr(app, "rebalancing")
    thread = consumer._thread
    assert isinstance(thread, highwaters.FetchHighwaterThread)
    for name in ("seek", "seek_to_committed", "consumer"):
        assert hasattr(thread, name), f"Faust's consumer thread has no {name} any more"
    recovery = app.tables.recovery
    for name in ("active_offsets", "tp_to_table", "in_recovery", "active_tps",
                 "signal_recovery_end"):
        assert hasattr(recovery, name), f"Faust's recovery has no {name} any more"


async def test_an_aiokafka_consumer_keeps_its_fetch_wait_where_transport_sets_it() -> None:
    consumer = aiokafka.AIOKafkaConsumer(fetch_max_wait_ms=123)
    assert consumer._fetch_max_wait_ms == 123


async def test_the_outbox_fills_aiokafka_batches_as_batch_append_would() -> None:
    # tables/outbox.py appends to a BatchBuilder's record builder directly and then sets
    # the count BatchBuilder.append keeps: the batches must be the ones append makes.
    import asyncio

    from aiokafka.producer.message_accumulator import BatchBuilder
    from onceflow.tables.outbox import KafkaSender, Outbox

    sent: list[Any] = []

    class Producer:
        def create_batch(self) -> BatchBuilder:
            return BatchBuilder(600, 0)

        async def send_batch(self, batch: BatchBuilder, topic: str, *,
                             partition: int) -> Any:
            sent.append(batch)
            done = asyncio.get_running_loop().create_future()
            done.set_result(SimpleNamespace(offset=0))
            return done

    records = [(f"k{i}".encode(), b"v" * (i * 7), [("h", b"x"), ("n", None)], 1000 + i)
               for i in range(40)]
    outbox = Outbox()
    for key, value, headers, ts in records:
        outbox.add("t", 0, key, value, headers, ts)
    await KafkaSender(Producer()).send(outbox)
    assert len(sent) > 1  # some records did not fit the first batch
    expected: list[BatchBuilder] = [BatchBuilder(600, 0)]
    for key, value, headers, ts in records:
        if expected[-1].append(timestamp=ts, key=key, value=value, headers=headers) is None:
            expected.append(BatchBuilder(600, 0))
            assert expected[-1].append(timestamp=ts, key=key, value=value,
                                       headers=headers) is not None
    assert [b.record_count() for b in sent] == [b.record_count() for b in expected]
    assert sum(b.record_count() for b in sent) == len(records)
    assert [bytes(b._build()) for b in sent] == [bytes(b._build()) for b in expected]
