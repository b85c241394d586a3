"""`onceflow journal`: the journal topic as a table or JSON lines, filtered, or followed.

The journal is read from its beginning (the journal keeps no index by time): `--since`
filters on each record's `ts`, the record time of the decision.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from onceflow.agents.gaps import GaplessReads
from onceflow.agents.wire import Names
from onceflow.durations import parse_duration
from onceflow.errors import OnceflowError
from onceflow.journal import OUTCOMES

from .kafka import read_topic
from .security import Cluster, started
from .settings import WorkerSettings

COLUMNS = (("time", 23), ("trigger", 14), ("outcome", 14), ("identity", 20),
           ("activation", 12), ("record", 24))


def parse_since(text: str, now: float) -> float:
    """A duration back from now ("10m", "2h", "1d") or an ISO time (UTC unless it says)."""
    try:
        ms = parse_duration(text)
        seconds = None if ms is None else ms / 1000
    except ValueError:
        seconds = None
    if seconds is not None:
        return now - seconds
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise OnceflowError(f"--since {text!r}: expected a duration such as 10m, 2h or 1d, "
                            "or an ISO time such as 2026-11-23T20:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def matcher(trigger: str | None, outcome: str | None, since: float | None
            ) -> Callable[[dict[str, Any]], bool]:
    """Whether a journal line passes the filters."""
    if outcome is not None and outcome not in OUTCOMES:
        raise OnceflowError(f"--outcome {outcome!r}: expected one of "
                            + ", ".join(sorted(OUTCOMES)))

    def wanted(line: dict[str, Any]) -> bool:
        if trigger is not None and (line.get("trigger") or "-") != trigger:
            return False
        if outcome is not None and line.get("outcome") != outcome:
            return False
        if since is not None:
            ts = line.get("ts")
            if not isinstance(ts, int | float) or ts < since:
                return False
        return True

    return wanted


class Printer:
    """Journal lines to a stream, as JSON lines or as a table."""

    def __init__(self, stream: IO[str], as_json: bool) -> None:
        self.stream = stream
        self.as_json = as_json
        self.header = False

    def line(self, line: dict[str, Any]) -> None:
        """Write one journal line."""
        if self.as_json:
            self.stream.write(orjson.dumps(line).decode() + "\n")
        else:
            if not self.header:
                self.stream.write(_row([name for name, _ in COLUMNS] + ["reason"]))
                self.header = True
            self.stream.write(_row(_cells(line)))
        self.stream.flush()


def _cells(line: dict[str, Any]) -> list[str]:
    ts = line.get("ts")
    when = (datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]
            if isinstance(ts, int | float) else str(ts))
    where = "-"
    if line.get("topic") is not None:
        where = f"{line.get('topic')}/{line.get('partition')}@{line.get('offset')}"
    reason = str(line.get("reason") or "")
    if line.get("attempt") is not None:
        reason = f"attempt {line['attempt']}" + (f": {reason}" if reason else "")
    return [when, str(line.get("trigger") or "-"), str(line.get("outcome")),
            str(line.get("identity") or "-"), str(line.get("activation") or "-"), where,
            " ".join(reason.split())]


def _printable(cell: str) -> str:
    """A cell with control characters escaped: a record's fields must not drive the terminal."""
    if cell.isprintable():
        return cell
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cell)


def _row(cells: list[str]) -> str:
    cells = [_printable(cell) for cell in cells]
    padded = [cell.ljust(width) for cell, (_, width) in zip(cells, COLUMNS, strict=False)]
    return "  ".join([*padded, *cells[len(COLUMNS):]]).rstrip() + "\n"


def _decode(record: Any) -> dict[str, Any] | None:
    try:
        line = orjson.loads(record.value)
    except (orjson.JSONDecodeError, TypeError):
        return None
    return line if isinstance(line, dict) else None


def show_journal(settings: WorkerSettings, *, trigger: str | None, outcome: str | None,
                 since: str | None, follow: bool, as_json: bool) -> int:
    """The `onceflow journal` command."""
    start = parse_since(since, time.time()) if since else None
    wanted = matcher(trigger, outcome, start)
    printer = Printer(sys.stdout, as_json)
    topic = Names(settings.topic_prefix).journal
    if follow:
        asyncio.run(_follow(settings.cluster, topic, wanted, printer))
        return 0
    records = asyncio.run(read_topic(settings.cluster, topic))
    lines = [line for line in map(_decode, records) if line is not None and wanted(line)]
    lines.sort(key=lambda line: line["ts"] if isinstance(line.get("ts"), int | float) else 0)
    for line in lines:
        printer.line(line)
    if not records:
        print(f"onceflow: the journal topic {topic!r} is empty or does not exist (check "
              "ONCEFLOW_TOPIC_PREFIX)", file=sys.stderr)
    return 0


async def _follow(cluster: Cluster, topic: str, wanted: Callable[[dict[str, Any]], bool],
                  printer: Printer) -> None:
    """Print matching lines as they arrive until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    consumer = await started(AIOKafkaConsumer(
        enable_auto_commit=False, fetch_max_wait_ms=200, max_partition_fetch_bytes=8 << 20,
        **cluster.client_kwargs()), cluster)
    stopping = asyncio.ensure_future(stop.wait())
    gapless = GaplessReads(consumer)
    try:
        partitions: set[int] = set()
        told = False
        while not stop.is_set():
            found = consumer.partitions_for_topic(topic) or set()
            if found - partitions:
                new = [TopicPartition(topic, p) for p in sorted(found - partitions)]
                partitions |= found
                consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
                await consumer.seek_to_beginning(*new)
            if not partitions:
                if not told:
                    print(f"onceflow: waiting for the journal topic {topic!r}",
                          file=sys.stderr, flush=True)
                    told = True
                await consumer._client.force_metadata_update()
                await _wait(stop, 1.0)
                continue
            fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=500, max_records=5000))
            await asyncio.wait([fetch, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not fetch.done():
                fetch.cancel()
                break
            for items in gapless.take(fetch.result()).values():
                for record in items:
                    line = _decode(record)
                    if line is not None and wanted(line):
                        printer.line(line)
    finally:
        stopping.cancel()
        await consumer.stop()


async def _wait(event: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass
