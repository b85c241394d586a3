"""`onceflow check TRIGGERS` (the strict check) and trigger-file messages written as TOML."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import onceflow, one_line_error
from onceflow.errors import ConfigError
from onceflow.triggers import load_triggers

REPO = Path(__file__).resolve().parents[2]


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "triggers.toml"
    path.write_text(text)
    return path


def test_a_good_file_passes() -> None:
    result = onceflow("check", str(REPO / "deploy" / "triggers.toml"))
    assert result.returncode == 0, result.stderr
    assert "ok:" in result.stdout
    assert result.stderr == ""


def test_every_strict_problem_is_told_and_exits_1(tmp_path: Path) -> None:
    path = _file(tmp_path, """
colour = "blue"

[[trigger]]
name = "billing"
types = ["invoice"]
service = "scripted"
servce = "scripted"

[[trigger]]
name = "has space"
types = ["order"]
service = "scripted"

[topic.invoice]
id_cache_size = 10
persist = false

[topic.invoices]
id_cache_size = 10
""")
    result = onceflow("check", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    told = result.stderr.strip().splitlines()
    assert all(line.startswith(f"onceflow: {path}: ") for line in told), told
    text = result.stderr
    assert "top level: unknown key 'colour'" in text
    assert "trigger 'billing': unknown key 'servce' (did you mean 'service'?)" in text
    assert "trigger 'has space': odd name" in text
    assert "[topic.invoice]: unknown key 'persist' (did you mean 'persist_id_cache'?)" in text
    assert "[topic.invoices]: no trigger reads this topic" in text
    assert told[-1].endswith("5 problems")


@pytest.mark.parametrize("name", ["-starts-with-dash", "a/b", "x" * 101, "naïve", ".hidden"])
def test_odd_trigger_names(tmp_path: Path, name: str) -> None:
    path = _file(tmp_path, f'[[trigger]]\nname = "{name}"\ntypes = ["a"]\nservice = "scripted"\n')
    result = onceflow("check", str(path))
    one_line_error(result, 1, "odd name", 'letters, digits, ".", "_" and "-"')


@pytest.mark.parametrize("name", ["billing", "Billing_2", "orders.v2", "a-b", "9lives"])
def test_ordinary_trigger_names(tmp_path: Path, name: str) -> None:
    path = _file(tmp_path, f'[[trigger]]\nname = "{name}"\ntypes = ["a"]\nservice = "scripted"\n')
    assert onceflow("check", str(path)).returncode == 0


def test_a_worker_only_warns_about_what_check_refuses(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    path = _file(tmp_path, '[[trigger]]\nname = "t"\ntypes = ["a"]\nservice = "scripted"\n'
                 'servce = "x"\n'
                 '[topic.b]\nid_cache_size = 5\n')
    triggers = load_triggers(path)
    assert [t.name for t in triggers.triggers] == ["t"]
    assert "unknown key 'servce' ignored" in capsys.readouterr().err
    with pytest.raises(ConfigError) as caught:
        load_triggers(path, strict=True)
    assert len(caught.value.details) == 2


def test_check_of_a_missing_or_broken_file(tmp_path: Path) -> None:
    # No file to check is a wrong argument (exit 2, as every command says it); a file with
    # problems is what check reports (exit 1).
    one_line_error(onceflow("check", str(tmp_path / "none.toml")), 2, "file: not found")
    path = _file(tmp_path, "[[trigger]\nname=")
    one_line_error(onceflow("check", str(path)), 1, "not valid TOML")
    one_line_error(onceflow("check", str(tmp_path)), 2, "is a folder")


def test_check_imports_services(tmp_path: Path) -> None:
    path = _file(tmp_path, '[[trigger]]\nname = "t"\ntypes = ["a"]\n'
                 'service = "nomodule:run"\n')
    one_line_error(onceflow("check", str(path)), 1, "nomodule")


@pytest.mark.parametrize(("line", "says"), [
    ("detect_duplicates = 1", "expected true or false, got 1"),
    ('use_history = "yes"', 'expected true or false, got "yes"'),
    ("condition = true", 'got true'),
    ("max_retry_attempts = false", "got false"),
    ("max_retry_attempts = 1.5", "got 1.5"),
    ('on_retry_failure = ["error"]', 'got ["error"]'),
    ("history_ttl = true", "got true"),
    ("retry_interval = { s = 10 }", "got { s = 10 }"),
    ("retry_interval = -1", "got -1"),
])
def test_messages_read_as_toml(tmp_path: Path, line: str, says: str) -> None:
    path = _file(tmp_path, f'[[trigger]]\nname = "t"\ntypes = ["a", "b"]\n'
                           f'service = "scripted"\n{line}\n')
    message = one_line_error(onceflow("check", str(path)), 1, says)
    for python in ("True", "False", "None", "['", "{'"):
        assert python not in message, message
