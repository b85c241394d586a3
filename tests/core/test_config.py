"""triggers.toml (spec section 7, a fixed contract): defaults, bad files, durations."""

from __future__ import annotations

from pathlib import Path

import pytest
from onceflow.durations import format_duration, parse_duration
from onceflow.errors import ConfigError
from onceflow.triggers import load_triggers

SPEC_EXAMPLE = '''
[[trigger]]
name = "orders"                 # unique
types = ["documentA", "documentB"]
condition = "all"               # "all" | "any" | "only_one"; one type alone = simple
topics = ["documentA", "documentB"]   # optional; default: one topic per type, named as the type
service = "scripted"            # a built-in name or "package.module:function"
join_timeout = "1d"             # durations: "250ms", "10s", "5m", "2h", "1d"; or "none"
detect_duplicates = true        # default true
use_history = true              # default true
history_ttl = "2h"              # default "2h"
resolver = "scripted"           # optional; a built-in name or "package.module:function"
max_retry_attempts = 0          # default 0
retry_interval = "10s"          # default "10s"
on_retry_failure = "error"      # "error" (default) | "suspend"
output = "orders.out"           # defaults: "<name>.out", "<name>.error", "<name>.in-doubt"
error = "orders.error"
in_doubt = "orders.in-doubt"

[topic.documentA]               # optional ingress settings per input topic
id_cache_size = 20000
persist_id_cache = true
'''


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "triggers.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_spec_example_reads_as_written(tmp_path: Path) -> None:
    triggers = load_triggers(write(tmp_path, SPEC_EXAMPLE))
    (t,) = triggers.triggers
    assert t.name == "orders"
    assert t.types == ("documentA", "documentB")
    assert t.condition == "all" and t.kind == "all"
    assert t.topics == ("documentA", "documentB")
    assert t.service == "scripted" and t.resolver == "scripted"
    assert t.join_timeout == 86_400_000  # durations are whole milliseconds
    assert t.history_ttl == 7_200_000 and t.retry_interval == 10_000
    assert (t.detect_duplicates, t.use_history) == (True, True)
    assert (t.max_retry_attempts, t.on_retry_failure) == (0, "error")
    assert (t.output, t.error, t.in_doubt) == ("orders.out", "orders.error",
                                               "orders.in-doubt")
    settings = triggers.topic("documentA")
    assert (settings.id_cache_size, settings.persist_id_cache) == (20000, True)
    assert triggers.input_topics == ("documentA", "documentB")


def test_defaults_are_exactly_those_of_section_7(tmp_path: Path) -> None:
    triggers = load_triggers(write(tmp_path, '[[trigger]]\nname = "pay"\n'
                                             'types = ["order", "payment"]\n'
                                             'service = "scripted"\n'))
    (t,) = triggers.triggers
    assert t.condition == "all"
    assert t.topics == ("order", "payment")  # one topic per type, named as the type
    assert t.join_timeout == 86_400_000  # 1d, in ms
    assert t.detect_duplicates is True
    assert t.use_history is True
    assert t.history_ttl == 7_200_000  # 2h
    assert t.resolver is None
    assert t.max_retry_attempts == 0
    assert t.retry_interval == 10_000
    assert t.on_retry_failure == "error"
    assert t.output == "pay.out"
    assert t.error == "pay.error"
    assert t.in_doubt == "pay.in-doubt"
    # A topic without a [topic.X] table gets the ingress defaults.
    settings = triggers.topic("order")
    assert settings.id_cache_size == 20000
    assert settings.persist_id_cache is True


def test_a_trigger_without_service_is_refused_not_run_with_the_test_stub(
        tmp_path: Path) -> None:
    path = write(tmp_path, '[[trigger]]\nname = "pay"\ntypes = ["order"]\n')
    with pytest.raises(ConfigError) as info:
        load_triggers(path)
    error = info.value
    assert error.source == str(path) and error.where == "trigger 'pay': key 'service'"
    assert error.problem.startswith("missing: name the service the trigger runs")


@pytest.mark.parametrize("condition", ["", 'condition = "all"\n'])
def test_a_type_repeated_under_an_all_condition_is_refused(tmp_path: Path,
                                                           condition: str) -> None:
    path = write(tmp_path, '[[trigger]]\nname = "x"\ntypes = ["a", "b", "a"]\n'
                           f'service = "scripted"\n{condition}')
    with pytest.raises(ConfigError) as info:
        load_triggers(path)
    assert info.value.where == "trigger 'x': key 'types'"
    assert '"a" is listed more than once under condition "all"' in info.value.problem
    assert 'condition = "only_one"' in info.value.problem


def test_a_type_repeated_under_any_or_only_one_is_taken(tmp_path: Path) -> None:
    for condition in ("any", "only_one"):
        (t,) = load_triggers(write(tmp_path, '[[trigger]]\nname = "x"\ntypes = ["a", "a"]\n'
                                             f'service = "scripted"\ncondition = "{condition}"\n'
                                   )).triggers
        assert t.kind == condition


def test_topics_default_lists_a_repeated_type_once(tmp_path: Path) -> None:
    (t,) = load_triggers(write(tmp_path, '[[trigger]]\nname = "x"\ntypes = ["a", "a"]\n'
                                         'service = "scripted"\ncondition = "only_one"\n')).triggers
    assert t.topics == ("a",)
    assert t.kind == "only_one" and t.needs_activation  # design 3: XOR over a


@pytest.mark.parametrize("condition", ["all", "any", "only_one"])
def test_one_type_alone_is_simple_whatever_the_condition(tmp_path: Path,
                                                         condition: str) -> None:
    (t,) = load_triggers(write(tmp_path, '[[trigger]]\nname = "x"\ntypes = ["a"]\n'
                                         f'service = "scripted"\ncondition = "{condition}"\n'
                               )).triggers
    assert t.kind == "simple"
    assert not t.needs_activation


def test_several_triggers_and_topic_tables(tmp_path: Path) -> None:
    triggers = load_triggers(write(tmp_path, '''
[[trigger]]
name = "a"
types = ["x"]
service = "scripted"
output = "custom.out"
join_timeout = "none"

[[trigger]]
name = "b"
types = ["x", "y"]
service = "scripted"
condition = "any"
topics = ["in"]
max_retry_attempts = 3
retry_interval = "250ms"
on_retry_failure = "suspend"
history_ttl = "5m"
detect_duplicates = false
use_history = false

[topic.in]
id_cache_size = 2
persist_id_cache = false
'''))
    a, b = triggers.triggers
    assert a.output == "custom.out" and a.error == "a.error" and a.join_timeout is None
    assert b.topics == ("in",) and b.kind == "any"
    assert (b.max_retry_attempts, b.retry_interval, b.on_retry_failure) == (3, 250,
                                                                             "suspend")
    assert b.history_ttl == 300_000
    assert (b.detect_duplicates, b.use_history) == (False, False)
    assert triggers.topic("in").id_cache_size == 2
    assert triggers.topic("in").persist_id_cache is False
    assert triggers.input_topics == ("x", "in")
    assert triggers.by_name("b") is b
    with pytest.raises(KeyError, match="known: a, b"):
        triggers.by_name("c")


# -- bad files: the error names the file, the trigger, the key and what was expected --------

BASE = '[[trigger]]\nname = "t"\ntypes = ["a"]\nservice = "scripted"\n'

BAD_KEYS = [
    # (extra lines, key, words of what was expected)
    ('condition = "and"', "condition", '"all", "any", "only_one"'),
    ('topics = []', "topics", "non-empty list"),
    ('topics = "a"', "topics", "list"),
    ('service = ""', "service", "non-empty string"),
    ('service = 3', "service", "string"),
    ('resolver = false', "resolver", "string"),
    ('join_timeout = "5 minutes"', "join_timeout", "duration"),
    ('join_timeout = "-5s"', "join_timeout", "duration"),
    ('join_timeout = true', "join_timeout", "duration"),
    ('history_ttl = "none"', "history_ttl", "not allowed"),
    ('history_ttl = "2 hours"', "history_ttl", "duration"),
    ('retry_interval = "soon"', "retry_interval", "duration"),
    ('detect_duplicates = "yes"', "detect_duplicates", "true or false"),
    ('use_history = 1', "use_history", "true or false"),
    ('max_retry_attempts = -1', "max_retry_attempts", "whole number >= 0"),
    ('max_retry_attempts = 1.5', "max_retry_attempts", "whole number >= 0"),
    ('max_retry_attempts = true', "max_retry_attempts", "whole number >= 0"),
    ('on_retry_failure = "retry"', "on_retry_failure", '"error" or "suspend"'),
    ('output = ""', "output", "non-empty string"),
    ('error = 5', "error", "string"),
    ('in_doubt = []', "in_doubt", "string"),
]


@pytest.mark.parametrize("line,key,expected", BAD_KEYS, ids=[b[0] for b in BAD_KEYS])
def test_bad_trigger_key_names_file_trigger_key_and_expectation(
        tmp_path: Path, line: str, key: str, expected: str) -> None:
    base = BASE.replace('service = "scripted"\n', "") if line.startswith("service") else BASE
    path = write(tmp_path, base + line + "\n")
    with pytest.raises(ConfigError) as info:
        load_triggers(path)
    error = info.value
    assert error.source == str(path)
    assert "trigger 't'" in error.where
    assert repr(key) in error.where
    assert expected in error.problem
    assert str(path) in str(error) and key in str(error)


@pytest.mark.parametrize("types", ['[]', '"a"', '[1]', '[""]', None])
def test_bad_types(tmp_path: Path, types: str | None) -> None:
    text = '[[trigger]]\nname = "t"\n' + (f"types = {types}\n" if types else "")
    with pytest.raises(ConfigError) as info:
        load_triggers(write(tmp_path, text))
    assert "'types'" in info.value.where and "trigger 't'" in info.value.where
    assert "non-empty list of document type names" in info.value.problem


@pytest.mark.parametrize("name", ['""', '"  "', "3"])
def test_trigger_needs_a_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_triggers(write(tmp_path, f'[[trigger]]\nname = {name}\ntypes = ["a"]\n'
                                      'service = "scripted"\n'))
    assert "trigger #1" in info.value.where and "'name'" in info.value.where


def test_missing_name_says_which_trigger_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_triggers(write(tmp_path, BASE + '[[trigger]]\ntypes = ["b"]\nservice = "scripted"\n'))
    assert "trigger #2" in info.value.where


def test_trigger_names_are_unique(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_triggers(write(tmp_path, BASE + BASE))
    assert "trigger 't'" in info.value.where and "unique" in info.value.problem


@pytest.mark.parametrize("table,key,expected", [
    ("id_cache_size = 0", "id_cache_size", "whole number >= 1"),
    ("id_cache_size = \"big\"", "id_cache_size", "whole number >= 1"),
    ("persist_id_cache = \"no\"", "persist_id_cache", "true or false"),
])
def test_bad_topic_table(tmp_path: Path, table: str, key: str, expected: str) -> None:
    path = write(tmp_path, BASE + f"[topic.a]\n{table}\n")
    with pytest.raises(ConfigError) as info:
        load_triggers(path)
    assert "[topic.a]" in info.value.where and repr(key) in info.value.where
    assert expected in info.value.problem
    assert info.value.source == str(path)


def test_missing_file_invalid_toml_and_no_triggers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_triggers(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_triggers(write(tmp_path, "[[trigger]\nname=\n"))
    with pytest.raises(ConfigError, match=r"\[\[trigger\]\]"):
        load_triggers(write(tmp_path, "[topic.a]\nid_cache_size = 3\n"))


def test_unknown_keys_are_warned_about_with_a_suggestion_not_fatal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    triggers = load_triggers(write(tmp_path, BASE + 'join_timout = "5m"\n'))
    assert triggers.triggers[0].join_timeout == 86_400_000
    err = capsys.readouterr().err
    assert "join_timout" in err and "did you mean 'join_timeout'" in err
    assert "trigger 't'" in err


# -- durations ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,ms", [
    ("250ms", 250), ("10s", 10_000), ("5m", 300_000), ("2h", 7_200_000), ("1d", 86_400_000),
    ("0s", 0), ("1.5h", 5_400_000), (" 30s ", 30_000), (45, 45_000), (0.5, 500),
    ("10.001s", 10_001), ("0.0015s", 2), (10.001, 10_001),
])
def test_durations_are_whole_milliseconds(text: object, ms: int) -> None:
    got = parse_duration(text)
    assert got == ms and type(got) is int


@pytest.mark.parametrize("text", ["none", "None", " NONE "])
def test_none_duration_only_where_allowed(text: str) -> None:
    assert parse_duration(text, allow_none=True) is None
    with pytest.raises(ValueError, match="not allowed"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["10", "10 sec", "1w", "-5s", "ms", "", True, None, -1,
                                  "5m30s"])
def test_bad_durations_say_what_is_expected(text: object) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert "duration" in str(info.value)


@pytest.mark.parametrize("ms", [250, 10_000, 300_000, 7_200_000, 86_400_000, 90_000, 1_500,
                                10_001, None])
def test_format_duration_reads_back(ms: int | None) -> None:
    assert parse_duration(format_duration(ms), allow_none=True) == ms
