"""Trigger definitions: `triggers.toml` (spec section 7) read into frozen, validated objects."""

from __future__ import annotations

import difflib
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .durations import parse_duration
from .envelope import MAX_DELIVERY_COUNT
from .errors import ConfigError
from .pickling import by_fields
from .tomltext import toml_text

ALL: Final = "all"
ANY: Final = "any"
ONLY_ONE: Final = "only_one"
SIMPLE: Final = "simple"
CONDITIONS: Final = (ALL, ANY, ONLY_ONE)

ON_FAILURE_ERROR: Final = "error"
ON_FAILURE_SUSPEND: Final = "suspend"

DEFAULT_ID_CACHE_SIZE: Final = 20000

_TRIGGER_KEYS: Final = {
    "name", "types", "condition", "topics", "service", "join_timeout", "detect_duplicates",
    "use_history", "history_ttl", "resolver", "max_retry_attempts", "retry_interval",
    "on_retry_failure", "output", "error", "in_doubt", "history_sweep_interval",
    "resource_check", "max_delivery_count",
}
_TOPIC_KEYS: Final = {"id_cache_size", "persist_id_cache"}

# A trigger's name becomes part of topic names (NAME.out, NAME.error, NAME.in-doubt), of
# metric labels and of URLs: letters, digits, ".", "_" and "-", starting with a letter or
# digit, at most 100 characters.
TRIGGER_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
TRIGGER_NAME_RULE: Final = ('letters, digits, ".", "_" and "-", starting with a letter or digit, '
                     "at most 100 characters")


class _Notes:
    """What is wrong but not fatal: warnings on stderr, or (strict) problems to report."""

    def __init__(self, source: str, strict: bool) -> None:
        self.source = source
        self.strict = strict
        self.problems: list[str] = []

    def note(self, where: str, problem: str) -> None:
        if self.strict:
            self.problems.append(f"{where}: {problem}")
        else:
            print(f"onceflow: warning: {self.source}: {where}: {problem}", file=sys.stderr)


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """Ingress settings of one input topic (the Kafka "address")."""

    id_cache_size: int = DEFAULT_ID_CACHE_SIZE
    persist_id_cache: bool = True

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class TriggerDef:
    """One trigger: its condition, its service and its exactly-once settings."""

    name: str
    types: tuple[str, ...]
    condition: str = ALL
    topics: tuple[str, ...] = ()
    service: str = "scripted"  # required in a trigger file; "scripted" for tests in code
    # Durations are whole milliseconds (core/durations.py).
    join_timeout: int | None = 86_400_000
    detect_duplicates: bool = True
    use_history: bool = True
    history_ttl: int = 7_200_000
    resolver: str | None = None
    max_retry_attempts: int = 0
    retry_interval: int = 10_000
    on_retry_failure: str = ON_FAILURE_ERROR
    output: str = ""
    error: str = ""
    in_doubt: str = ""
    history_sweep_interval: int = 600_000
    resource_check: str | None = None
    max_delivery_count: int | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    @property
    def kind(self) -> str:
        """How documents are joined: simple, any, all or only_one.

        A trigger listing one type alone is simple.  A type listed twice under
        only_one means "one and only one of that type per activation per window".
        """
        if len(self.types) == 1:
            return SIMPLE
        return self.condition

    @property
    def join_types(self) -> frozenset[str]:
        """The distinct document types of the condition."""
        return frozenset(self.types)

    @property
    def join_arity(self) -> int:
        """How many distinct document types the condition names."""
        return len(set(self.types))

    @property
    def needs_activation(self) -> bool:
        """All and only_one conditions tie documents by activation."""
        return self.kind in (ALL, ONLY_ONE)

    @property
    def routes_by_activation(self) -> bool:
        """Join triggers keep their state under the activation; others under the identity."""
        return self.needs_activation


@dataclass(frozen=True, slots=True)
class TriggerSet:
    """Every trigger of a file, plus per-topic ingress settings."""

    triggers: tuple[TriggerDef, ...]
    topic_settings: dict[str, TopicSettings] = field(default_factory=dict)
    source: str = "<memory>"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    @property
    def input_topics(self) -> tuple[str, ...]:
        """Every topic some trigger reads, in first-mention order."""
        seen: dict[str, None] = {}
        for trigger in self.triggers:
            for topic in trigger.topics:
                seen.setdefault(topic, None)
        return tuple(seen)

    def topic(self, name: str) -> TopicSettings:
        """Ingress settings of a topic (defaults when the file has none)."""
        return self.topic_settings.get(name, TopicSettings())

    def by_name(self, name: str) -> TriggerDef:
        """The trigger called `name`; KeyError names the known ones."""
        for trigger in self.triggers:
            if trigger.name == name:
                return trigger
        known = ", ".join(t.name for t in self.triggers)
        raise KeyError(f"no trigger named {name!r} (known: {known})")


def load_triggers(path: str | Path, *, strict: bool = False) -> TriggerSet:
    """Read and validate a trigger file; ConfigError names the file, trigger and key.

    `strict` (`onceflow check`): what is otherwise a warning is an error (unknown keys,
    odd trigger names), and so is a [topic.X] table for a topic no trigger reads; the
    ConfigError lists every such problem (`details`).
    """
    path = Path(path)
    source = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(source, "file", "not found") from None
    except IsADirectoryError:
        raise ConfigError(source, "file", "is a folder; give the triggers.toml file") from None
    except PermissionError:
        raise ConfigError(source, "file", "cannot be read: permission denied") from None
    except UnicodeDecodeError:
        raise ConfigError(source, "file", "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "file", f"not valid TOML: {exc}") from None
    return parse_triggers(raw, source, strict=strict)


def parse_triggers(raw: dict[str, Any], source: str = "<memory>", *,
                   strict: bool = False) -> TriggerSet:
    """Validate an already-parsed trigger document (`strict`: see load_triggers)."""
    notes = _Notes(source, strict)
    for key in raw:
        if key not in ("trigger", "topic"):
            _unknown(notes, "top level", key, {"trigger", "topic"})
    entries = raw.get("trigger")
    if entries is None:
        raise ConfigError(source, "file", "no [[trigger]] tables: define at least one trigger")
    if not isinstance(entries, list):
        raise ConfigError(source, "key 'trigger'", "expected [[trigger]] tables")
    triggers: list[TriggerDef] = []
    names: set[str] = set()
    for index, entry in enumerate(entries):
        trigger = _parse_trigger(entry, index, source, notes)
        if trigger.name in names:
            raise ConfigError(source, f"trigger {trigger.name!r}", "name is not unique")
        names.add(trigger.name)
        triggers.append(trigger)
    topics: dict[str, TopicSettings] = {}
    topic_tables = raw.get("topic", {})
    if not isinstance(topic_tables, dict):
        raise ConfigError(source, "key 'topic'", "expected [topic.NAME] tables")
    read = {topic for trigger in triggers for topic in trigger.topics}
    for name, table in topic_tables.items():
        topics[name] = _parse_topic(name, table, source, notes)
        if strict and name not in read:
            notes.note(f"[topic.{name}]", "no trigger reads this topic (a typo in the "
                       "topic name, or a table left from a removed trigger?)")
    if notes.problems:
        count = len(notes.problems)
        raise ConfigError(source, "strict check",
                          f"{count} problem{'s' if count > 1 else ''}: "
                          + "; ".join(notes.problems), details=tuple(notes.problems))
    return TriggerSet(tuple(triggers), topics, source)


def _parse_trigger(entry: Any, index: int, source: str, notes: _Notes) -> TriggerDef:
    where = f"trigger #{index + 1}"
    if not isinstance(entry, dict):
        raise ConfigError(source, where, "expected a table")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(source, f"{where}: key 'name'", "expected a non-empty string")
    where = f"trigger {name!r}"
    if TRIGGER_NAME.fullmatch(name) is None:
        notes.note(where, f"odd name: a trigger name becomes part of topic names, so it "
                   f"takes {TRIGGER_NAME_RULE}")
    for key in entry:
        if key not in _TRIGGER_KEYS:
            _unknown(notes, where, key, _TRIGGER_KEYS)

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(source, f"{where}: key {key!r}", problem)

    types = entry.get("types")
    if (
        not isinstance(types, list)
        or not types
        or not all(isinstance(t, str) and t for t in types)
    ):
        raise fail("types", "expected a non-empty list of document type names")
    condition = entry.get("condition", ALL)
    if condition not in CONDITIONS:
        raise fail("condition",
                   f'expected one of "all", "any", "only_one", got {toml_text(condition)}')
    if condition == ALL and len(types) > 1:
        repeated = [t for t in dict.fromkeys(types) if types.count(t) > 1]
        if repeated:
            raise fail("types", (
                f"{toml_text(repeated[0])} is listed more than once under condition "
                f'"all" (the default): an all condition waits for one document of each '
                f"distinct type, so a repeated type would run the service once per "
                f"document.  List each type once, or use condition = \"only_one\" for "
                f"one and only one document of that type per activation per window"))
    service = entry.get("service")
    if service is None:
        raise fail("service", (
            'missing: name the service the trigger runs, "package.module:function" or a '
            'built-in ("scripted" is the test stub that scenarios drive through '
            "body.raise)"))
    topics = entry.get("topics")
    if topics is None:
        topics = list(dict.fromkeys(types))
    elif (
        not isinstance(topics, list)
        or not topics
        or not all(isinstance(t, str) and t for t in topics)
    ):
        raise fail("topics", "expected a non-empty list of topic names")

    def text(key: str, default: str | None) -> str | None:
        value = entry.get(key, default)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise fail(key, "expected a non-empty string")
        return value

    def flag(key: str, default: bool) -> bool:
        value = entry.get(key, default)
        if not isinstance(value, bool):
            raise fail(key, f"expected true or false, got {toml_text(value)}")
        return value

    def duration(key: str, default: str, allow_none: bool = False) -> int | None:
        try:
            return parse_duration(entry.get(key, default), allow_none=allow_none)
        except ValueError as exc:
            raise fail(key, str(exc)) from None

    retries = entry.get("max_retry_attempts", 0)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise fail("max_retry_attempts", f"expected a whole number >= 0, got {toml_text(retries)}")
    on_failure = entry.get("on_retry_failure", ON_FAILURE_ERROR)
    if on_failure not in (ON_FAILURE_ERROR, ON_FAILURE_SUSPEND):
        raise fail("on_retry_failure",
                   f'expected "error" or "suspend", got {toml_text(on_failure)}')
    max_deliveries = entry.get("max_delivery_count")
    if max_deliveries is not None and (
            not isinstance(max_deliveries, int) or isinstance(max_deliveries, bool)
            or not 1 <= max_deliveries <= MAX_DELIVERY_COUNT):
        raise fail("max_delivery_count",
                   f"expected a whole number from 1 to {MAX_DELIVERY_COUNT} (a document "
                   f"delivered that many times is rejected and dead-lettered), or leave "
                   f"the key out for no limit; got {toml_text(max_deliveries)}")
    ttl = duration("history_ttl", "2h")
    sweep = duration("history_sweep_interval", "10m")
    interval = duration("retry_interval", "10s")
    assert ttl is not None and sweep is not None and interval is not None
    return TriggerDef(
        name=name,
        types=tuple(types),
        condition=condition,
        topics=tuple(topics),
        service=text("service", None) or "",
        join_timeout=duration("join_timeout", "1d", allow_none=True),
        detect_duplicates=flag("detect_duplicates", True),
        use_history=flag("use_history", True),
        history_ttl=ttl,
        resolver=text("resolver", None),
        max_retry_attempts=retries,
        retry_interval=interval,
        on_retry_failure=on_failure,
        output=text("output", f"{name}.out") or f"{name}.out",
        error=text("error", f"{name}.error") or f"{name}.error",
        in_doubt=text("in_doubt", f"{name}.in-doubt") or f"{name}.in-doubt",
        history_sweep_interval=sweep,
        resource_check=text("resource_check", None),
        max_delivery_count=max_deliveries,
    )


def _parse_topic(name: str, table: Any, source: str, notes: _Notes) -> TopicSettings:
    where = f"[topic.{name}]"
    if not isinstance(table, dict):
        raise ConfigError(source, where, "expected a table")
    for key in table:
        if key not in _TOPIC_KEYS:
            _unknown(notes, where, key, _TOPIC_KEYS)
    size = table.get("id_cache_size", DEFAULT_ID_CACHE_SIZE)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(source, f"{where}: key 'id_cache_size'",
                          f"expected a whole number >= 1, got {toml_text(size)}")
    persist = table.get("persist_id_cache", True)
    if not isinstance(persist, bool):
        raise ConfigError(source, f"{where}: key 'persist_id_cache'",
                          f"expected true or false, got {toml_text(persist)}")
    return TopicSettings(id_cache_size=size, persist_id_cache=persist)


def _unknown(notes: _Notes, where: str, key: str, known: set[str]) -> None:
    # Unknown keys are reported, not fatal (unless strict): trigger files may carry keys
    # for newer versions or other tools.  A close match is most likely a typo, so say so.
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    notes.note(where, f"unknown key {key!r}{'' if notes.strict else ' ignored'}{hint}")
