"""The real `onceflow` command, failing: one clear line on stderr, an exit code, no traceback.

These cases need no broker (an unreachable one is part of what they test); the ones that
need a running broker or worker are in tests/integration/test_cli_live.py.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import onceflow, one_line_error
from onceflow.app.broker import free_port

REPO = Path(__file__).resolve().parents[2]
DEAD_BROKER = {"ONCEFLOW_BROKER_URL": "kafka://127.0.0.1:9"}  # port 9: nothing listens
DEAD_WORKER = "http://127.0.0.1:9"


def test_version() -> None:
    result = onceflow("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("onceflow ")


def test_send_a_missing_file(tmp_path: Path) -> None:
    result = onceflow("send", str(tmp_path / "nowhere.jsonl"))
    one_line_error(result, 2, "nowhere.jsonl: no such file")


def test_send_a_folder(tmp_path: Path) -> None:
    one_line_error(onceflow("send", str(tmp_path)), 2, "is a folder")


def test_send_reports_every_bad_line_and_sends_nothing(tmp_path: Path) -> None:
    lines = ['{"ts": 0, "topic": "a", "value": 1}', "not json", "[1, 2]",
             '{"ts": 1, "topic": "a"}', '{"ts": 2, "topic": "a", "partition": -1, "value": 1}',
             '{"ts": 3, "topic": "a", "value": 2}']
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    # The broker is unreachable: bad lines are found before anything talks to it.
    result = onceflow("send", str(path), env=DEAD_BROKER)
    assert "Traceback" not in result.stderr
    assert result.returncode == 2
    told = result.stderr.strip().splitlines()
    assert len(told) == 4, told
    for number in (2, 3, 4, 5):
        assert any(f"in.jsonl:{number}:" in line for line in told), (number, told)
    assert "4 bad lines; nothing was sent" in told[-1]
    assert "not a JSON line" in told[0]
    assert "expected a JSON object" in told[1]
    assert "needs 'value' or 'raw'" in told[2]
    assert "'partition' must be a whole number" in told[3]
    assert "broker" not in result.stderr


def test_send_reads_standard_input() -> None:
    result = onceflow("send", "-", stdin='{"ts": 0, "topic": "a", "value": 1}\n{oops\n',
                      env=DEAD_BROKER)
    one_line_error(result, 2, "<stdin>:2: not a JSON line", "nothing was sent")


def test_send_to_an_unreachable_broker() -> None:
    result = onceflow("send", "-", stdin='{"ts": 0, "topic": "a", "value": 1}\n',
                      env=DEAD_BROKER, timeout=30)
    one_line_error(result, 3, "cannot connect to 127.0.0.1:9 (PLAINTEXT): connection refused",
                   "ONCEFLOW_BROKER_URL")


def test_worker_with_an_unreachable_broker() -> None:
    result = onceflow("worker", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                      env={**DEAD_BROKER, "ONCEFLOW_WEB_PORT": str(free_port())}, timeout=60)
    one_line_error(result, 3, "cannot connect to 127.0.0.1:9 (PLAINTEXT): connection refused")


def test_journal_with_an_unreachable_broker() -> None:
    result = onceflow("journal", env=DEAD_BROKER, timeout=30)
    one_line_error(result, 3, "cannot connect to 127.0.0.1:9 (PLAINTEXT)")


@pytest.mark.parametrize("url", ["http://127.0.0.1:9092", "127.0.0.1", "kafka://host:port"])
def test_a_broker_url_that_is_not_kafka_host_port_is_refused(url: str) -> None:
    result = onceflow("send", "-", env={"ONCEFLOW_BROKER_URL": url})
    one_line_error(result, 2, "ONCEFLOW_BROKER_URL", repr(url))


def test_a_broker_url_flag_with_the_wrong_scheme_is_refused() -> None:
    result = onceflow("worker", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                      "--broker", "https://127.0.0.1:9092")
    one_line_error(result, 2, "ONCEFLOW_BROKER_URL", "scheme 'https://'")


@pytest.mark.parametrize("command", [["history", "billing", "inv-1"], ["suspend", "billing"],
                                     ["resume", "billing"]])
def test_worker_commands_with_the_worker_down(command: list[str]) -> None:
    result = onceflow(*command, "--web", DEAD_WORKER, timeout=30)
    one_line_error(result, 3, f"cannot reach a worker at {DEAD_WORKER}: connection refused",
                   "--web")


def test_worker_commands_with_a_malformed_web_address() -> None:
    result = onceflow("history", "billing", "inv-1", "--web", "nonsense")
    one_line_error(result, 2, "web address 'nonsense': expected http://HOST:PORT")


def test_a_bad_log_level() -> None:
    result = onceflow("worker", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                      env={"ONCEFLOW_LOG_LEVEL": "loud"})
    one_line_error(result, 2, "ONCEFLOW_LOG_LEVEL", "'loud' is not a log level",
                   "crit, error, warn, info or debug")
    assert "Value error" not in result.stderr


def test_a_bad_log_level_flag() -> None:
    result = onceflow("worker", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                      "--log-level", "chatty")
    one_line_error(result, 2, "ONCEFLOW_LOG_LEVEL", "'chatty' is not a log level")


def test_a_web_port_already_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = onceflow("worker", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                          "--web-port", str(port), env=DEAD_BROKER)
    one_line_error(result, 2, f"127.0.0.1:{port}", "another process listens there",
                   "ONCEFLOW_WEB_PORT")


def test_a_missing_trigger_file() -> None:
    result = onceflow("worker", "--triggers", "/nonexistent/triggers.toml")
    one_line_error(result, 2, "/nonexistent/triggers.toml: file: not found")


def test_worker_help_lists_every_setting_with_its_default() -> None:
    from onceflow.app.settings import WorkerSettings

    result = onceflow("worker", "--help")
    assert result.returncode == 0
    text = result.stdout
    for name in WorkerSettings.model_fields:
        assert f"ONCEFLOW_{name.upper()}" in text, name
    rows = {line.split()[0]: line for line in text.splitlines()
            if line.strip().startswith("ONCEFLOW_") and len(line.split()) > 1}
    assert rows["ONCEFLOW_WEB_PORT"].split()[1] == "6066"
    assert rows["ONCEFLOW_PARTITIONS"].split()[1] == "4"
    assert rows["ONCEFLOW_BROKER_URL"].split()[1] == "kafka://127.0.0.1:9092"
    for flag in ("--broker", "--data-dir", "--web-port", "--partitions", "--log-level"):
        assert flag in text, flag


@pytest.mark.parametrize("value,says", [
    ("0", "greater than or equal to 1"), ("-3", "greater than or equal to 1"),
    ("many", "valid integer"), ("1.5", "valid integer"),
    ("99999999999", "less than or equal to 1000000")])
def test_a_bad_chunk_size_is_one_line_naming_the_setting(value: str, says: str) -> None:
    result = onceflow("worker", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                      env={**DEAD_BROKER, "ONCEFLOW_CHUNK_SIZE": value})
    one_line_error(result, 2, "ONCEFLOW_CHUNK_SIZE", says)


@pytest.mark.parametrize("env,named,says", [
    ({"ONCEFLOW_SESSION_TIMEOUT": "1000"}, "ONCEFLOW_SESSION_TIMEOUT", "less than or equal to 90"),
    ({"ONCEFLOW_SESSION_TIMEOUT": "inf"}, "ONCEFLOW_SESSION_TIMEOUT", "finite"),
    ({"ONCEFLOW_SESSION_TIMEOUT": "0.0001"}, "ONCEFLOW_SESSION_TIMEOUT", "0.001"),
    ({"ONCEFLOW_SESSION_TIMEOUT": "6", "ONCEFLOW_HEARTBEAT_INTERVAL": "6"},
     "ONCEFLOW_HEARTBEAT_INTERVAL", "not less than ONCEFLOW_SESSION_TIMEOUT"),
    ({"ONCEFLOW_HEARTBEAT_INTERVAL": "0"}, "ONCEFLOW_HEARTBEAT_INTERVAL", "0.001"),
    ({"ONCEFLOW_MAX_POLL_INTERVAL": "0.5"}, "ONCEFLOW_MAX_POLL_INTERVAL", "greater than 1"),
    ({"ONCEFLOW_MAX_POLL_INTERVAL": "nan"}, "ONCEFLOW_MAX_POLL_INTERVAL", "finite"),
    ({"ONCEFLOW_MAX_POLL_INTERVAL": "1e12"}, "ONCEFLOW_MAX_POLL_INTERVAL", "less than"),
])
def test_a_timing_the_consumer_refuses_is_one_line_naming_the_setting(
        env: dict[str, str], named: str, says: str) -> None:
    """Each of these passed validation and then stopped the worker with a Faust or aiokafka
    traceback (ONCEFLOW_SESSION_TIMEOUT=1000: 374 lines, issue 28 §6)."""
    result = onceflow("worker", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                      env={**DEAD_BROKER, **env})
    one_line_error(result, 2, named, says)


def test_the_timings_reach_faust() -> None:
    from onceflow.app.settings import WorkerSettings

    settings = WorkerSettings(session_timeout=6, heartbeat_interval=2, max_poll_interval=30)
    faust = settings.faust_settings()
    assert (faust["broker_session_timeout"], faust["broker_heartbeat_interval"],
            faust["broker_max_poll_interval"]) == (6, 2, 30)
    assert faust["broker_request_timeout"] >= faust["broker_session_timeout"]


def test_the_chunk_size_reaches_the_worker_options() -> None:
    from onceflow.app.settings import WorkerSettings

    assert WorkerSettings().options().chunk_size == 1000
    assert WorkerSettings(chunk_size=5000).options().chunk_size == 5000


def test_an_unknown_command_is_a_usage_line() -> None:
    result = onceflow("frobnicate")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "invalid choice" in result.stderr


def test_journal_with_a_bad_since() -> None:
    result = onceflow("journal", "--since", "yesterday-ish", env=DEAD_BROKER)
    one_line_error(result, 2, "--since 'yesterday-ish'", "10m", "ISO time")


def test_journal_with_an_unknown_outcome() -> None:
    result = onceflow("journal", "--outcome", "exploded", env=DEAD_BROKER)
    one_line_error(result, 2, "--outcome 'exploded'", "in-doubt")


def test_replay_of_a_missing_scenario(tmp_path: Path) -> None:
    result = onceflow("replay", str(tmp_path / "nothing"))
    assert "Traceback" not in result.stderr
    assert result.returncode == 2
    assert result.stderr.startswith("onceflow: ")


@pytest.mark.parametrize("command", [
    ["spark", "replay", "--triggers", str(REPO / "deploy" / "triggers.toml"), "--input",
     "/missing/archive", "--output", "/tmp/never"],
    ["spark", "audit", "--input", "/missing/archive", "--journal", "/tmp/x.jsonl"],
])
def test_spark_with_a_missing_input_says_so_before_starting_spark(command: list[str]) -> None:
    result = onceflow(*command, timeout=30)
    one_line_error(result, 2, "--input /missing/archive: no such file or folder")


def test_an_unexpected_error_is_one_line_with_a_hint(tmp_path: Path) -> None:
    # A service module that raises while it is imported: not an error onceflow knows.
    (tmp_path / "broken.py").write_text("raise ZeroDivisionError('boom at import')\n")
    (tmp_path / "triggers.toml").write_text(
        '[[trigger]]\nname = "t"\ntypes = ["a"]\nservice = "broken:run"\n')
    result = onceflow("check", str(tmp_path / "triggers.toml"))
    assert "Traceback" not in result.stderr
    assert result.returncode != 0
    assert "boom at import" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_broker_on_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = onceflow("broker", "--port", str(port))
    one_line_error(result, 2, f"cannot listen on 127.0.0.1:{port}", "another process")


def test_resubmit_of_an_unknown_trigger() -> None:
    result = onceflow("resubmit", "nosuch", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                      "--dry-run", env=DEAD_BROKER)
    one_line_error(result, 2, "no trigger named 'nosuch' (known: billing, fulfil)")


def test_the_boundary_turns_a_bug_into_one_line_and_code_70(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow.app.boundary import EXIT_INTERNAL, error_boundary

    monkeypatch.delenv("ONCEFLOW_DEBUG", raising=False)

    def bug() -> int:
        return {}["missing"]  # type: ignore[no-any-return]

    assert error_boundary(bug) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "unexpected error (KeyError: 'missing')" in err
    assert "ONCEFLOW_DEBUG=1" in err
    monkeypatch.setenv("ONCEFLOW_DEBUG", "1")
    assert error_boundary(bug) == EXIT_INTERNAL
    assert "Traceback" in capsys.readouterr().err  # asked for


def test_send_of_a_file_of_garbage_tells_a_hundred_lines_and_the_count(tmp_path: Path) -> None:
    path = tmp_path / "garbage.jsonl"
    path.write_bytes(b"\xff\xfe not json\n" * 5000)
    result = onceflow("send", str(path), env=DEAD_BROKER)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    told = result.stderr.strip().splitlines()
    assert len(told) == 101
    assert "4900 more bad lines not shown" in told[-2]
    assert told[-1].startswith("onceflow: ") and "garbage.jsonl:5000:" in told[-1]
    assert "(5000 bad lines; nothing was sent)" in told[-1]


def test_replay_live_with_an_unreachable_broker_says_why() -> None:
    result = onceflow("replay", "--live", "--broker", "127.0.0.1:9",
                      str(REPO / "tests" / "scenarios" / "and_join_expire"), timeout=120)
    one_line_error(result, 2, "the worker exited before it was ready",
                   "cannot connect to 127.0.0.1:9 (PLAINTEXT): connection refused")


def test_journal_table_escapes_control_characters_of_hostile_records() -> None:
    import io

    from onceflow.app.journal_reader import Printer

    out = io.StringIO()
    printer = Printer(out, as_json=False)
    printer.line({"trigger": "t", "outcome": "bad-input", "identity": "x\x1b[2J\ny",
                  "activation": None, "ts": 0, "topic": "a", "partition": 0, "offset": 1,
                  "reason": "bell\x07 and \u009b"})
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\u009b" not in text
    assert text.count("\n") == 2  # the header and one row: a newline in a field is escaped
    assert "x\\x1b[2J\\ny" in text


@pytest.mark.parametrize(("args", "line", "says"), [
    (["--base-time", "nan"], '{"ts": 0, "topic": "a", "value": 1}', "--base-time nan"),
    (["--base-time", "-1"], '{"ts": 0, "topic": "a", "value": 1}', "--base-time -1"),
    ([], '{"ts": 1e300, "topic": "a", "value": 1}', "is not a record time Kafka takes"),
    (["--base-time", "0"], '{"ts": -5, "topic": "a", "value": 1}',
     "is not a record time Kafka takes"),
])
def test_send_with_record_times_kafka_cannot_take(args: list[str], line: str,
                                                  says: str) -> None:
    result = onceflow("send", *args, "-", stdin=line + "\n", env=DEAD_BROKER)
    one_line_error(result, 2, says)


@pytest.fixture
def not_a_worker() -> Iterator[str]:
    """A web server that answers everything with 200 and a page of HTML."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = b"<html>\x1b[31mnot onceflow</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("command", [["suspend", "billing"], ["history", "billing", "i-1"]])
def test_worker_commands_against_something_that_is_not_a_worker(
        command: list[str], not_a_worker: str) -> None:
    result = onceflow(*command, "--web", not_a_worker, env=DEAD_BROKER)
    line = one_line_error(result, 2, "(200)", "not onceflow")
    assert "\x1b" not in line


def test_onceflow_alone_prints_its_help() -> None:
    result = onceflow()
    assert result.returncode == 2
    assert "usage: onceflow" in result.stdout and "replay" in result.stdout
    assert "the following arguments are required" not in result.stderr


def test_dash_capital_v_is_the_version() -> None:
    result = onceflow("-V")
    assert result.returncode == 0 and result.stdout.startswith("onceflow ")


def test_spark_alone_names_its_commands_not_an_internal_name() -> None:
    result = onceflow("spark")
    assert result.returncode == 2
    assert "spark_command" not in result.stderr and "{replay,audit}" in result.stderr


def test_an_unknown_broker_host_says_it_cannot_be_resolved(tmp_path: Path) -> None:
    records = tmp_path / "one.jsonl"
    records.write_text('{"ts": 0, "topic": "a", "value": 1}\n')
    result = onceflow("send", str(records),
                      env={"ONCEFLOW_BROKER_URL": "kafka://no-such-host.invalid:9092"})
    one_line_error(result, 3, "no-such-host.invalid:9092", "the host name cannot be resolved")
    assert "unknown error" not in result.stderr


@pytest.mark.parametrize("command", [
    ["send", "FILE"], ["journal"], ["resubmit", "billing", "--triggers", "TRIGGERS"]])
def test_send_journal_and_resubmit_take_broker_as_worker_does(
        command: list[str], tmp_path: Path) -> None:
    records = tmp_path / "one.jsonl"
    records.write_text('{"ts": 0, "topic": "a", "value": 1}\n')
    args = [str(records) if a == "FILE" else str(REPO / "deploy" / "triggers.toml")
            if a == "TRIGGERS" else a for a in command]
    result = onceflow(*args, "--broker", "kafka://127.0.0.1:9",
                      env={"ONCEFLOW_BROKER_URL": "kafka://127.0.0.1:1",
                           "ONCEFLOW_ADMIN_TOKEN": "t"})
    one_line_error(result, 3, "127.0.0.1:9")


def test_resubmit_without_a_token_refuses_before_writing() -> None:
    result = onceflow("resubmit", "billing", "--triggers", str(REPO / "deploy" / "triggers.toml"),
                      env=DEAD_BROKER)  # nothing is read or written: no broker needed
    one_line_error(result, 2, "ONCEFLOW_ADMIN_TOKEN is not set")


def test_a_data_dir_in_use_is_refused(tmp_path: Path) -> None:
    from onceflow.app import worker
    from onceflow.errors import ConfigError

    worker.lock_data_dir(tmp_path / "data")
    try:
        with pytest.raises(ConfigError, match=r"in use by another worker \(pid \d+\)"):
            worker.lock_data_dir(tmp_path / "data")
    finally:
        import os

        os.close(worker._held.pop())
