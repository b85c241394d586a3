"""Scenario folders (spec section 7): triggers.toml, input.jsonl, optional history.jsonl."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from .envelope import Record, Timestamp, record_time
from .errors import ScenarioError
from .pickling import by_fields
from .tomltext import toml_text
from .triggers import TriggerSet, load_triggers
from .values import decode_value


@dataclass(slots=True)
class HistorySeed:
    """One line of history.jsonl."""

    trigger: str
    identity: str
    status: str
    ts: Timestamp
    failed: bool = False
    activation: str | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)


# The operator's commands a scenario line may give (spec section 7).
SUSPEND: Final = "suspend"
RESUME: Final = "resume"
CONTROLS: Final = (SUSPEND, RESUME)


@dataclass(slots=True)
class Control:
    """An input line that is an operator's command at a time: suspend or resume a trigger.

    `{"ts": seconds, "control": "suspend" | "resume", "trigger": name}`: the admin command
    (`onceflow suspend|resume`) given at that record time, between the lines around it.
    """

    ts: Timestamp
    action: str
    trigger: str

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)


def parse_control_line(item: dict[str, Any], where: str = "",
                       triggers: Collection[str] | None = None) -> Control:
    """A control line as a Control; ScenarioError says what is wrong with it.

    `triggers`: the names of the scenario's triggers, when known; a control naming
    another trigger is refused.
    """
    action = item.get("control")
    if action not in CONTROLS:
        raise ScenarioError(f"{_at(where)}'control' must be \"suspend\" or \"resume\", "
                            f"got {toml_text(action)}")
    ts: Any = item.get("ts")
    if type(ts) not in _NUMBER:
        raise ScenarioError(f"{_at(where)}'ts' must be a number of seconds")
    trigger = item.get("trigger")
    if type(trigger) is not str or not trigger:
        raise ScenarioError(f"{_at(where)}a {action} line needs 'trigger', the name of a "
                            f"trigger of triggers.toml")
    if triggers is not None and trigger not in triggers:
        known = ", ".join(sorted(triggers))
        raise ScenarioError(f"{_at(where)}'trigger' must name a trigger of triggers.toml "
                            f"({known}), got {trigger!r}")
    unknown = sorted(set(item) - {"ts", "control", "trigger"})
    if unknown:
        raise ScenarioError(f"{_at(where)}a control line has only 'ts', 'control' and "
                            f"'trigger', not {', '.join(map(repr, unknown))}")
    try:
        ms = record_time(ts)
    except ValueError as exc:
        raise ScenarioError(f"{_at(where)}'ts': {exc}") from None
    return Control(ms, action, trigger)


@dataclass(slots=True)
class Scenario:
    """A scenario read from its folder; records are read lazily, in file order."""

    path: Path
    triggers: TriggerSet
    history: list[HistorySeed] = field(default_factory=list)

    @property
    def input_path(self) -> Path:
        """The scenario's input.jsonl."""
        return self.path / "input.jsonl"

    def iter_records(self, offsets: InputOffsets | None = None) -> Iterator[Record | Control]:
        """Every input line in file order, read as it goes (into `offsets` when given).

        A line is a Record, or a Control (an operator's command) naming one of the
        scenario's triggers.
        """
        return read_records(self.input_path, offsets,
                            triggers={t.name for t in self.triggers.triggers})

    @property
    def records(self) -> list[Record | Control]:
        """Every input line, in a list."""
        return list(self.iter_records())


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario folder; ScenarioError or ConfigError say which file and line is wrong."""
    folder = Path(path)
    if not folder.is_dir():
        raise ScenarioError(f"{folder}: not a scenario folder")
    triggers = load_triggers(folder / "triggers.toml")
    input_path = folder / "input.jsonl"
    if not input_path.exists():
        raise ScenarioError(f"{input_path}: missing (every scenario has an input.jsonl)")
    seeds: list[HistorySeed] = []
    history_path = folder / "history.jsonl"
    if history_path.exists():
        names = {t.name for t in triggers.triggers}
        seeds = list(read_history(history_path, names))
    return Scenario(folder, triggers, seeds)


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    loads = orjson.loads
    with path.open("rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                item = loads(line)
            except orjson.JSONDecodeError as exc:
                if not line.strip():
                    continue
                raise ScenarioError(f"{path}:{number}: not a JSON line: {exc}") from None
            if type(item) is not dict:
                raise ScenarioError(f"{path}:{number}: expected a JSON object")
            yield number, item


class InputOffsets:
    """What reading input lines remembers, per topic partition, from one line to the next.

    The highest offset so far (a line without an offset takes the next one) and, when
    `keep_values`, the value each offset first came with (a redelivery line may leave its
    value out).  One dict keyed by offset per partition: an int key hashes for free, where
    a (topic, partition, offset) key cost a tuple and its hash on every line.  Where the
    reader has the line itself, it keeps the line's bytes instead of the decoded value and
    decodes it again for the rare redelivery without a value: a few hundred bytes less per
    record, and the values are freed once processed.

    A reader of a file it can read again (`read_records`, `reread`) keeps nothing until
    the first redelivery without a value: that line has the lines before it read once
    more, and from then on where each line starts is kept (`indexed`), and a redelivery
    reads its first line again.  An input without such lines (most) pays for none of it:
    the replay bench's 300,000 records took 162 MB with every line kept, 98 MB without.

    `only_wanted`: keep the values of the offsets given to `want` only.  A reader that
    knows beforehand which offsets a later line redelivers without its value (the Spark
    pipeline's read stage lists them) then keeps a handful of values instead of all.
    """

    def __init__(self, keep_values: bool = True, only_wanted: bool = False) -> None:
        self.keep_values = keep_values
        self.only_wanted = only_wanted
        self.lanes: dict[tuple[str, int], _Lane] = {}
        # Set by read_records on offsets it fills from the start: the values kept, once
        # `indexed`, are the byte positions of lines in that file, read again through
        # `_again` (opened when first needed, closed when the reading ends).
        self.reread: Path | None = None
        self.indexed = False
        self._again: Any = None

    def index_before(self, end: int) -> None:
        """Keep where each line before byte `end` of `reread` starts, reading them again.

        The lines are parsed as the first reading parsed them (they all were, without an
        error), so every offset gets the position of the line that first had it.
        """
        assert self.reread is not None
        again = InputOffsets()
        again.reread, again.indexed = self.reread, True
        try:
            for _ in read_records(self.reread, again, end):
                pass
        except (OSError, ScenarioError) as exc:  # the file changed under the reader
            raise ScenarioError(f"the lines before byte {end} cannot be read again: {exc}"
                                ) from None
        for (topic, partition), lane in again.lanes.items():
            self.lane(topic, partition).values = lane.values
        self.indexed = True

    def line_at(self, position: int) -> bytes:
        """The line of the file being read (`reread`) that starts at `position`."""
        try:
            if self._again is None:
                assert self.reread is not None
                self._again = self.reread.open("rb")
            self._again.seek(position)
            line: bytes = self._again.readline()
        except OSError as exc:  # the file went away or changed under the reader
            raise ScenarioError(f"the line at byte {position} cannot be read again: {exc}"
                                ) from None
        return line

    def close(self) -> None:
        """Close the file opened to read lines again (it is opened again when needed)."""
        if self._again is not None:
            self._again.close()
            self._again = None

    def lane(self, topic: str, partition: int) -> _Lane:
        """The topic partition's lane, made on first use."""
        tp = (topic, partition)
        lane = self.lanes.get(tp)
        if lane is None:
            lane = self.lanes[tp] = _Lane(set() if self.only_wanted else None)
        return lane

    def want(self, topic: str, partition: int, offsets: list[int]) -> None:
        """Keep the values of these offsets (with only_wanted; all are kept otherwise)."""
        wanted = self.lane(topic, partition).wanted
        if wanted is not None:
            wanted.update(offsets)


class _Lane:
    """One topic partition's input so far."""

    def __init__(self, wanted: set[int] | None) -> None:
        self.top = -1
        self.values: dict[int, Any] = {}
        self.wanted = wanted  # the offsets whose values are kept; None: every offset


def read_records(path: Path, offsets: InputOffsets | None = None, end: int = -1, *,
                 triggers: Collection[str] | None = None) -> Iterator[Record | Control]:
    """Records of an input.jsonl in file order, with partitions and offsets filled in.

    A control line comes as a Control (`triggers`: the names it may give, when known).
    The caller may own `offsets`, to keep what was read beyond the iteration.  With `end`
    >= 0, the reading stops before the line that starts at or after byte `end`.
    """
    if offsets is None:
        offsets = InputOffsets()
    loads = orjson.loads
    number = 0
    at = 0  # where the next line starts in the file
    if offsets.reread is not None and offsets.reread != path:
        raise ValueError(f"these offsets keep positions in {offsets.reread}, not {path}")
    try:
        with path.open("rb") as handle:
            # Lines are read again by position only from a regular file (not a pipe).
            if offsets.reread is None and offsets.keep_values and not offsets.lanes and \
                    path.is_file() and handle.seekable():
                offsets.reread = path
            while True:
                # A few hundred lines at a time: one call for many lines, memory bounded.
                lines = handle.readlines(1 << 16)
                if not lines:
                    return
                for line in lines:
                    number += 1
                    start = at
                    if 0 <= end <= start:
                        return
                    at += len(line)
                    try:
                        item = loads(line)
                        if type(item) is not dict:
                            raise ScenarioError("expected a JSON object")
                        record: Record | Control
                        if "control" in item:
                            record = parse_control_line(item, "", triggers)
                        else:
                            record = parse_record_line(item, offsets, "", line, start)
                    except orjson.JSONDecodeError as exc:
                        if not line.strip():
                            continue
                        raise ScenarioError(f"{path}:{number}: not a JSON line: {exc}"
                                            ) from None
                    except ScenarioError as exc:
                        raise ScenarioError(f"{path}:{number}: {exc}") from None
                    yield record
    finally:
        offsets.close()


def parse_record_line(item: dict[str, Any], offsets: InputOffsets, where: str = "",
                      line: bytes | None = None, at: int = -1) -> Record:
    """One input line as a Record; `offsets` carries what earlier lines said.

    Errors name `where` (a file and line) when given.  `line`: the JSON text `item` was
    decoded from, when the caller has it (kept instead of the value, see InputOffsets);
    `at`: where that line starts in the file `offsets.reread` names, when it reads one.
    """
    ts: Any = item.get("ts")
    topic: Any = item.get("topic")
    if type(ts) not in _NUMBER or type(topic) is not str or not topic:
        _bad_line(item, where)
    partition = item.get("partition")
    if partition is None:
        partition = 0
    elif type(partition) is not int or partition < 0:
        raise ScenarioError(f"{_at(where)}'partition' must be a whole number >= 0")
    lane = offsets.lanes.get((topic, partition))
    if lane is None:
        lane = offsets.lane(topic, partition)
    top = lane.top
    offset = item.get("offset")
    if offset is None:
        offset = top + 1
    elif type(offset) is not int or offset < 0:
        raise ScenarioError(f"{_at(where)}'offset' must be a whole number >= 0")
    if offset > top:
        lane.top = offset  # a line found bad below still takes its offset
    key = item.get("key")
    if key is not None and type(key) is not str:
        raise ScenarioError(f"{_at(where)}'key' must be a string or null")
    headers = item.get("headers")
    if headers:
        if type(headers) is not dict or not all(
            type(k) is str and type(v) is str for k, v in headers.items()
        ):
            raise ScenarioError(f"{_at(where)}'headers' must be an object of string values")
    elif headers is None or headers == {}:
        headers = {}
    else:
        raise ScenarioError(f"{_at(where)}'headers' must be an object of string values")
    if "value" in item:
        value = item["value"]
    elif "raw" in item:
        raw = item["raw"]
        if type(raw) is not str:
            raise ScenarioError(f"{_at(where)}'raw' must be a string (the value as UTF-8 text)")
        value = decode_value(raw.encode("utf-8"))
    elif offsets.keep_values and offset <= top:  # a redelivery without its value
        reread = offsets.reread
        if reread is not None and not offsets.indexed:
            offsets.index_before(at)
        if offset not in lane.values:
            raise ScenarioError(f"{_at(where)}a record needs 'value' or 'raw'")
        value = lane.values[offset]
        if reread is not None:  # where the first line starts in the file
            value = _reread_value(offsets.line_at(value), topic, partition, offset)
        elif type(value) is bytes:  # the first line's text (no JSON value decodes to bytes)
            value = _line_value(value)
    else:
        raise ScenarioError(f"{_at(where)}a record needs 'value' or 'raw'")
    if offset > top and offsets.keep_values:
        wanted = lane.wanted
        if wanted is None or offset in wanted:
            if offsets.reread is not None:
                if offsets.indexed:
                    lane.values[offset] = at
            else:
                lane.values[offset] = value if line is None else line
    try:
        ms = record_time(ts)
    except ValueError as exc:
        raise ScenarioError(f"{_at(where)}'ts': {exc}") from None
    return Record(topic, partition, offset, ms, value, key, headers)


def _line_value(line: bytes) -> Any:
    """The value of a line that was read before (it had a value or raw text)."""
    return _item_value(orjson.loads(line))


def _item_value(item: dict[str, Any]) -> Any:
    """The value of a decoded line that has a value or raw text."""
    if "value" in item:
        return item["value"]
    return decode_value(item["raw"].encode("utf-8"))


def _reread_value(line: bytes, topic: str, partition: int, offset: int) -> Any:
    """The value of a line read again from the file, which must still be that record's.

    A file changed under the reader is an error, not another record's value.
    """
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError:
        item = None
    if type(item) is not dict or item.get("topic") != topic or \
            item.get("partition", 0) != partition or \
            item.get("offset", offset) != offset or \
            not ("value" in item or type(item.get("raw")) is str):
        raise ScenarioError(f"the first line of {topic}/{partition}@{offset} changed in the "
                            f"file while it was read")
    return _item_value(item)


_NUMBER: Final = (int, float)


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def _bad_line(item: dict[str, Any], where: str) -> None:
    ts = item.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise ScenarioError(f"{_at(where)}'ts' must be a number of seconds")
    raise ScenarioError(f"{_at(where)}'topic' must be a non-empty string")


def read_history(path: Path, triggers: set[str]) -> Iterator[HistorySeed]:
    """Seeds of a history.jsonl."""
    for number, item in _lines(path):
        where = f"{path}:{number}: "
        trigger = item.get("trigger")
        if trigger not in triggers:
            raise ScenarioError(f"{where}'trigger' must name a trigger of triggers.toml, "
                                f"got {trigger!r}")
        identity = item.get("identity")
        if not isinstance(identity, str) or not identity:
            raise ScenarioError(f"{where}'identity' must be a non-empty string")
        status = item.get("status")
        if status not in ("processing", "completed"):
            raise ScenarioError(f"{where}'status' must be \"processing\" or \"completed\"")
        ts = item.get("ts")
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise ScenarioError(f"{where}'ts' must be a number of seconds")
        failed = item.get("failed", False)
        if not isinstance(failed, bool):
            raise ScenarioError(f"{where}'failed' must be true or false")
        activation = item.get("activation")
        if activation is not None and not isinstance(activation, str):
            raise ScenarioError(f"{where}'activation' must be a string")
        try:
            ms = record_time(ts)
        except ValueError as exc:
            raise ScenarioError(f"{where}'ts': {exc}") from None
        yield HistorySeed(trigger, identity, status, ms, failed, activation)
