"""`onceflow bridge`: forward a topic to another topic, on the same cluster or another one.

Each record goes to the target with its key, value, headers and timestamp, and with a
`dup-id` header derived from where it came from when it has none:

    bridge:<source topic>/<source partition>@<source offset>

(the prefix `bridge:` can be changed with --dup-id-prefix, for example to tell two source
clusters with the same topic names apart).  A record goes to the target partition
<source partition> mod <target partitions>, so a record sent again lands in the partition
whose duplicate-ID cache already holds its dup-id.

The source offsets are committed (consumer group --group) only after the target has
acknowledged every record of the batch (acks=all).  A bridge that is killed between the
two sends those records again when it restarts: the onceflow worker that reads the target
drops them at ingress (journal `duplicate-id`), so every record reaches the triggers once.

No source record stops it: the fetcher reads header names that are not UTF-8 with the
worker's reader (onceflow.agents.record_batches) and such a record is forwarded with the
names' bytes unchanged (the worker journals it bad-input); a record the target refuses as
too large is logged as not forwarded and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    CommitFailedError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
)
from onceflow.agents import record_batches
from onceflow.envelope import H_DUP_ID
from onceflow.errors import OnceflowError

from .security import Cluster, bootstrap_servers, security_from_env, started

log = logging.getLogger("onceflow.bridge")
UNASSIGNED_WARNING = 30.0  # seconds without a partition before the log says so
DUP_ID_PREFIX = "bridge:"
TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)


def bridge_dup_id(prefix: str, topic: str, partition: int, offset: int) -> str:
    """The dup-id of a forwarded record that had none: its source coordinates."""
    return f"{prefix}{topic}/{partition}@{offset}"


@dataclass(frozen=True)
class BridgeSpec:
    """What one bridge forwards, from where to where."""

    source: Cluster
    source_topic: str
    target: Cluster
    target_topic: str
    group: str
    batch_size: int = 1000
    dup_id_prefix: str = DUP_ID_PREFIX
    session_timeout: float = 10.0
    heartbeat_interval: float = 1.0
    log_level: str = "warning"


class Bridge:
    """Consumes the source topic in a consumer group and produces to the target topic."""

    def __init__(self, spec: BridgeSpec) -> None:
        self.spec = spec
        self.forwarded = 0
        self.batches = 0
        self.skipped = 0
        self._stopping = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._target_partitions = 0
        # When the consumer last had partitions (or started): a group that assigns none
        # for long is told in the log, not waited on in silence.
        self._assigned_at = time.monotonic()
        self._told_unassigned = 0.0

    def stop(self) -> None:
        """Finish the batch in hand, commit it, and stop."""
        self._stopping.set()

    async def run(self) -> None:
        """Forward until stopped."""
        spec = self.spec
        self._target_partitions = await self._check_topics()
        consumer = AIOKafkaConsumer(
            spec.source_topic, group_id=spec.group, enable_auto_commit=False,
            auto_offset_reset="earliest", max_poll_records=spec.batch_size,
            max_partition_fetch_bytes=8 << 20, fetch_max_wait_ms=100,
            session_timeout_ms=round(spec.session_timeout * 1000),
            heartbeat_interval_ms=round(spec.heartbeat_interval * 1000),
            **spec.source.client_kwargs())
        producer = AIOKafkaProducer(
            acks="all", enable_idempotence=False, linger_ms=5,
            max_request_size=8 * 1024 * 1024, **spec.target.client_kwargs())
        record_batches.install()  # a header name that is not UTF-8 must not stop the fetch
        self._consumer = await started(consumer, spec.source)
        try:
            self._producer = await started(producer, spec.target)
            print(f"onceflow: bridge {spec.source_topic} on {spec.source.describe()} -> "
                  f"{spec.target_topic} on {spec.target.describe()} (group {spec.group!r})",
                  file=sys.stderr, flush=True)
            try:
                while not self._stopping.is_set():
                    await self._forward_one_batch()
            finally:
                await producer.stop()
        finally:
            await consumer.stop()

    async def _check_topics(self) -> int:
        """The target's partition count; both topics must exist (nothing is created)."""
        spec = self.spec
        counts = []
        for cluster, topic, side in ((spec.source, spec.source_topic, "--from"),
                                     (spec.target, spec.target_topic, "--to")):
            admin = await started(AIOKafkaAdminClient(**cluster.client_kwargs()), cluster)
            try:
                if topic not in set(await admin.list_topics()):
                    raise OnceflowError(f"bridge: {side} topic {topic!r} does not exist on "
                                        f"{cluster.describe()}: create it first")
                described = await admin.describe_topics([topic])
                counts.append(len(described[0]["partitions"]))
            finally:
                await admin.close()
        return counts[1]

    async def _forward_one_batch(self) -> None:
        assert self._consumer is not None and self._producer is not None
        spec = self.spec
        self._check_assignment()
        fetch = asyncio.ensure_future(self._consumer.getmany(
            timeout_ms=500, max_records=spec.batch_size))
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({fetch, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not fetch.done():
            fetch.cancel()
            return
        batches = fetch.result()
        if not batches:
            return
        pending: list[tuple[Any, Any]] = []
        commit: dict[Any, int] = {}
        skipped = 0
        for tp, records in batches.items():
            for record in records:
                if record_batches.has_raw_header_name(record.headers):
                    # Sent alone, in order: its names keep their bytes (the worker
                    # reading the target journals it bad-input, naming the header).
                    skipped += await self._acknowledged(pending)
                    pending = [(record, await self._send_raw(record))]
                    continue
                try:
                    pending.append((record, await self._producer.send(
                        spec.target_topic, record.value, key=record.key,
                        partition=record.partition % self._target_partitions,
                        timestamp_ms=record.timestamp, headers=self._headers(record))))
                except MessageSizeTooLargeError as exc:
                    self._skip(record, exc)
                    skipped += 1
            commit[tp] = records[-1].offset + 1
        # Every record is acknowledged by the target (acks=all) before the source offsets
        # move: a crash in between sends them again, and their dup-ids drop them.
        skipped += await self._acknowledged(pending)
        try:
            await self._consumer.commit(commit)
        except CommitFailedError as exc:  # a rebalance: the new owner sends them again
            log.warning("bridge: offsets not committed (%s); the records will be sent again "
                        "and dropped by their dup-id", exc)
            return
        self.forwarded += sum(len(records) for records in batches.values()) - skipped
        self.skipped += skipped
        self.batches += 1

    def _check_assignment(self) -> None:
        """Warn, every UNASSIGNED_WARNING seconds, while the group gives this bridge nothing."""
        assert self._consumer is not None
        now = time.monotonic()
        if self._consumer.assignment():
            self._assigned_at, self._told_unassigned = now, 0.0
            return
        waited = now - self._assigned_at
        if waited >= self._told_unassigned + UNASSIGNED_WARNING:
            self._told_unassigned = waited
            log.warning("bridge: no partition of %s assigned to this bridge for %.0f s "
                        "(group %r); another member may hold them all, or the group "
                        "coordinator is not answering", self.spec.source_topic, waited,
                        self.spec.group)

    async def _send_raw(self, record: Any) -> Any:
        assert self._producer is not None
        batch = record_batches.raw_name_batch(
            self._producer, record.key, record.value, record.timestamp,
            self._headers(record))
        return await self._producer.send_batch(
            batch, self.spec.target_topic,
            partition=record.partition % self._target_partitions)

    async def _acknowledged(self, pending: list[tuple[Any, Any]]) -> int:
        """Wait until the target acknowledged every pending send; how many it refused.

        A record refused as too large is logged and skipped; any other refusal stops the
        bridge.
        """
        results = await asyncio.gather(*(future for _, future in pending),
                                       return_exceptions=True)
        skipped = 0
        for (record, _), result in zip(pending, results, strict=True):
            if isinstance(result, TOO_LARGE):
                self._skip(record, result)
                skipped += 1
            elif isinstance(result, BaseException):
                raise result
        return skipped

    def _skip(self, record: Any, exc: BaseException) -> None:
        size = len(record.key or b"") + len(record.value or b"")
        print(f"onceflow: bridge: record {record.topic}/{record.partition}@{record.offset} "
              f"({size} bytes of key and value) NOT forwarded: the target refuses it as too "
              f"large ({type(exc).__name__}); going on", file=sys.stderr, flush=True)

    def _headers(self, record: Any) -> list[tuple[str, bytes | None]]:
        headers = list(record.headers or ())
        if not any(name == H_DUP_ID for name, _ in headers):
            headers.append((H_DUP_ID, bridge_dup_id(
                self.spec.dup_id_prefix, record.topic, record.partition,
                record.offset).encode()))
        return headers


def bridge_spec(args: Any, settings: Any) -> BridgeSpec:
    """The bridge's settings from its options and the environment.

    Each side's broker and security settings are ONCEFLOW_BRIDGE_SOURCE_* and
    ONCEFLOW_BRIDGE_TARGET_* (BROKER_URL, SECURITY_PROTOCOL, SASL_*, SSL_*), each falling
    back to the ONCEFLOW_* setting of the same name; --from-broker and --to-broker win.
    """
    import os

    def side(prefix: str, option: str | None) -> Cluster:
        url = option or os.environ.get(f"{prefix}BROKER_URL") or settings.broker_url
        return Cluster(bootstrap_servers(url), security_from_env(prefix, "ONCEFLOW_"))

    source = side("ONCEFLOW_BRIDGE_SOURCE_", args.from_broker)
    target = side("ONCEFLOW_BRIDGE_TARGET_", args.to_broker)
    group = args.group or f"onceflow-bridge.{args.source}.{args.target}"
    if args.batch_size < 1:
        raise OnceflowError("bridge: --batch-size must be at least 1")
    if source.bootstrap == target.bootstrap and args.source == args.target:
        raise OnceflowError("bridge: --from and --to are the same topic on the same cluster")
    return BridgeSpec(source, args.source, target, args.target, group,
                      batch_size=args.batch_size, dup_id_prefix=args.dup_id_prefix,
                      session_timeout=settings.session_timeout,
                      heartbeat_interval=settings.heartbeat_interval,
                      log_level=settings.log_level)


def run_bridge(spec: BridgeSpec) -> int:
    """`onceflow bridge`: forward until SIGTERM or Ctrl-C, then commit and stop."""
    logging.basicConfig(level=spec.log_level.upper(),
                        format="%(asctime)s %(name)s %(message)s")
    bridge = Bridge(spec)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, bridge.stop)
        await bridge.run()

    started_at = time.monotonic()
    try:
        asyncio.run(main())
    except KafkaError as exc:
        raise OnceflowError(f"bridge stopped: {exc}; nothing after the last committed "
                            "batch was lost: a restart sends it again") from None
    print(f"onceflow: bridge stopped after {bridge.forwarded} record(s) in "
          f"{time.monotonic() - started_at:.1f} s", file=sys.stderr, flush=True)
    return 0
