"""Scenario folders (spec section 7): triggers.toml, input.jsonl, optional history.jsonl."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .envelope import NotJson, Record, decode_value
from .errors import ScenarioError
from .triggers import TriggerSet, load_triggers


@dataclass(slots=True)
class HistorySeed:
    """One line of history.jsonl."""

    trigger: str
    identity: str
    status: str
    ts: float
    failed: bool = False
    activation: str | None = None


@dataclass(slots=True)
class Scenario:
    """A scenario read from its folder."""

    path: Path
    triggers: TriggerSet
    records: list[Record]
    history: list[HistorySeed] = field(default_factory=list)


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario folder; ScenarioError or ConfigError say which file and line is wrong."""
    folder = Path(path)
    if not folder.is_dir():
        raise ScenarioError(f"{folder}: not a scenario folder")
    triggers = load_triggers(folder / "triggers.toml")
    input_path = folder / "input.jsonl"
    if not input_path.exists():
        raise ScenarioError(f"{input_path}: missing (every scenario has an input.jsonl)")
    records = list(read_records(input_path))
    seeds: list[HistorySeed] = []
    history_path = folder / "history.jsonl"
    if history_path.exists():
        names = {t.name for t in triggers.triggers}
        seeds = list(read_history(history_path, names))
    return Scenario(folder, triggers, records, seeds)


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open("rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                item = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ScenarioError(f"{path}:{number}: not a JSON line: {exc}") from None
            if not isinstance(item, dict):
                raise ScenarioError(f"{path}:{number}: expected a JSON object")
            yield number, item


def read_records(path: Path) -> Iterator[Record]:
    """Records of an input.jsonl in file order, with partitions and offsets filled in."""
    highest: dict[tuple[str, int], int] = {}
    first_value: dict[tuple[str, int, int], Any] = {}
    for number, item in _lines(path):
        yield parse_record_line(item, highest, first_value, f"{path}:{number}")


def parse_record_line(
    item: dict[str, Any],
    highest: dict[tuple[str, int], int],
    first_value: dict[tuple[str, int, int], Any] | None,
    where: str,
) -> Record:
    """One input line as a Record; `highest` tracks offsets per partition across lines."""
    ts = item.get("ts")
    topic = item.get("topic")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise ScenarioError(f"{where}: 'ts' must be a number of seconds")
    if not isinstance(topic, str) or not topic:
        raise ScenarioError(f"{where}: 'topic' must be a non-empty string")
    partition = item.get("partition")
    if partition is None:
        partition = 0
    elif isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ScenarioError(f"{where}: 'partition' must be a whole number >= 0")
    tp = (topic, partition)
    offset = item.get("offset")
    if offset is None:
        offset = highest.get(tp, -1) + 1
    elif isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ScenarioError(f"{where}: 'offset' must be a whole number >= 0")
    if offset > highest.get(tp, -1):
        highest[tp] = offset
    key = item.get("key")
    if key is not None and not isinstance(key, str):
        raise ScenarioError(f"{where}: 'key' must be a string or null")
    headers = item.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ScenarioError(f"{where}: 'headers' must be an object of string values")
    coordinates = (topic, partition, offset)
    if "value" in item:
        value = item["value"]
    elif "raw" in item:
        raw = item["raw"]
        if not isinstance(raw, str):
            raise ScenarioError(f"{where}: 'raw' must be a string (the value as UTF-8 text)")
        value = decode_value(raw.encode("utf-8"))
    elif first_value is not None and coordinates in first_value:
        value = first_value[coordinates]  # a redelivery that does not repeat its value
    else:
        raise ScenarioError(f"{where}: a record needs 'value' or 'raw'")
    if first_value is not None and coordinates not in first_value:
        first_value[coordinates] = value
    return Record(topic, partition, offset, ts, value, key, dict(headers))


def read_history(path: Path, triggers: set[str]) -> Iterator[HistorySeed]:
    """Seeds of a history.jsonl."""
    for number, item in _lines(path):
        where = f"{path}:{number}"
        trigger = item.get("trigger")
        if trigger not in triggers:
            raise ScenarioError(f"{where}: 'trigger' must name a trigger of triggers.toml, "
                                f"got {trigger!r}")
        identity = item.get("identity")
        if not isinstance(identity, str) or not identity:
            raise ScenarioError(f"{where}: 'identity' must be a non-empty string")
        status = item.get("status")
        if status not in ("processing", "completed"):
            raise ScenarioError(f"{where}: 'status' must be \"processing\" or \"completed\"")
        ts = item.get("ts")
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise ScenarioError(f"{where}: 'ts' must be a number of seconds")
        failed = item.get("failed", False)
        if not isinstance(failed, bool):
            raise ScenarioError(f"{where}: 'failed' must be true or false")
        activation = item.get("activation")
        if activation is not None and not isinstance(activation, str):
            raise ScenarioError(f"{where}: 'activation' must be a string")
        yield HistorySeed(trigger, identity, status, ts, failed, activation)


def record_line(record: Record) -> dict[str, Any]:
    """A Record back in the input.jsonl form (for generators and the live runner)."""
    line: dict[str, Any] = {"ts": record.ts, "topic": record.topic,
                            "partition": record.partition, "offset": record.offset}
    if record.key is not None:
        line["key"] = record.key
    if record.headers:
        line["headers"] = record.headers
    if isinstance(record.value, NotJson):
        line["raw"] = record.value.text
    else:
        line["value"] = record.value
    return line
