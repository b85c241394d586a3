"""The real `onceflow` command against a real broker and worker: send, journal, history.

Each case runs the command as a user does (a subprocess) and checks what it prints, its
exit code, and that no traceback shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_runner import onceflow, one_line_error
from onceflow.agents import wire
from onceflow.app.broker import EmbeddedBroker

from .support import outcomes, records, wait_journal

pytestmark = pytest.mark.integration

TRIGGERS = """
[[trigger]]
name = "billing"
types = ["invoice"]
service = "scripted"

[[trigger]]
name = "fulfil"
types = ["order", "payment"]
service = "scripted"
condition = "all"
"""


def _env(broker: EmbeddedBroker, prefix: str, **more: str) -> dict[str, str]:
    return {"ONCEFLOW_BROKER_URL": broker.url, "ONCEFLOW_TOPIC_PREFIX": prefix, **more}


def _line(ts: float, topic: str, uuid: str, partition: int = 0, **value: Any) -> str:
    return json.dumps({"ts": ts, "topic": topic, "partition": partition, "key": uuid,
                       "value": {"uuid": uuid, "body": {}, **value}})


def test_send_refuses_a_partition_the_topic_lacks(broker: EmbeddedBroker, start_worker: Any,
                                                  new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    start_worker(triggers, prefix, partitions=2)  # creates the input topics, 2 partitions
    lines = [_line(0, "invoice", "i-1", 1), _line(1, "invoice", "i-2", 5),
             _line(2, "invoice", "i-3", 2)]
    result = onceflow("send", "-", stdin="\n".join(lines) + "\n", env=_env(broker, prefix))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    told = result.stderr.strip().splitlines()
    assert len(told) == 2, told
    assert "<stdin>:2: partition 5 of topic" in told[0]
    assert "(it has 2: 0 to 1)" in told[0]
    assert "<stdin>:3: partition 2 of topic" in told[1]
    assert "2 bad lines; nothing was sent" in told[1]
    assert records(broker.bootstrap, wire.Names(prefix).topic("invoice")) == []


def test_send_from_stdin_then_the_journal(broker: EmbeddedBroker, start_worker: Any,
                                          new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    names = wire.Names(prefix)
    worker = start_worker(triggers, prefix, partitions=2)
    lines = [_line(0, "invoice", "i-1"), _line(0.5, "invoice", "i-1"),
             _line(1, "order", "o-1", activation="cart-7"),
             _line(2, "order", "o-1", 1, activation="cart-8"),
             _line(3, "payment", "p-1", activation="cart-7")]
    env = _env(broker, prefix)
    sent = onceflow("send", "-", stdin="\n".join(lines) + "\n", env=env)
    assert sent.returncode == 0, sent.stderr
    assert "sent 5 record(s) from <stdin>" in sent.stdout
    wait_journal(broker.bootstrap, names,
                 lambda ls: "processed" in outcomes(ls, "p-1", "fulfil")
                 and len(outcomes(ls, "i-1")) == 2 and len(outcomes(ls, "o-1")) >= 2,
                 worker)

    table = onceflow("journal", env=env)
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[0].split()[:6] == ["time", "trigger", "outcome", "identity", "activation",
                                   "record"]
    assert any("billing" in r and "processed" in r and "i-1" in r for r in rows[1:])
    assert any("duplicate" in r and "i-1" in r for r in rows[1:])

    as_json = onceflow("journal", "--json", "--trigger", "billing", env=env)
    journal = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert journal and {line["trigger"] for line in journal} == {"billing"}
    assert sorted(line["outcome"] for line in journal) == ["duplicate", "processed"]
    only = onceflow("journal", "--json", "--outcome", "join-pending", env=env)
    pending = [json.loads(line) for line in only.stdout.splitlines()]
    assert pending and {line["outcome"] for line in pending} == {"join-pending"}
    # Record times are now + ts (send's base time): 10m covers them, a future time none.
    recent = onceflow("journal", "--json", "--since", "10m", env=env)
    assert len(recent.stdout.splitlines()) == len(table.stdout.splitlines()) - 1
    later = onceflow("journal", "--json", "--since", "2999-01-01T00:00:00", env=env)
    assert later.returncode == 0 and later.stdout == ""

    # A join trigger without --activation: the entries over every activation of o-1.
    web = ["--web", worker.web_url]
    every = onceflow("history", "fulfil", "o-1", *web, env=env)
    assert every.returncode == 0, every.stderr
    entries = json.loads(every.stdout)
    assert {e["activation"] for e in entries} == {"cart-7", "cart-8"}
    assert all(e["identity"] == "o-1" and e["trigger"] == "fulfil" for e in entries)
    one = onceflow("history", "fulfil", "o-1", "--activation", "cart-7", *web, env=env)
    assert json.loads(one.stdout)["activation"] == "cart-7"
    nothing = onceflow("history", "fulfil", "o-404", *web, env=env)
    one_line_error(nothing, 2, "no journal record", "give --activation")
    unknown = onceflow("history", "nosuch", "o-1", *web, env=env)
    one_line_error(unknown, 2, "no trigger named 'nosuch'", "billing", "fulfil")
    # No entry: the answer is printed, and the command says so and exits 1 (it exited 0).
    none = onceflow("history", "billing", "nope", *web, env=env)
    assert none.returncode == 1 and '"entry": null' in none.stdout
    assert "has no history entry for identity 'nope'" in none.stderr
    # resubmit of an identity no journal record has: nothing done, exit 1 (it exited 0).
    matched = onceflow("resubmit", "billing", "--triggers", str(triggers), "--identity", "zzz",
                       env={**env, "ONCEFLOW_ADMIN_TOKEN": "any"})
    one_line_error(matched, 1, "nothing matched", "'zzz'")


def test_journal_follow_stops_cleanly_on_sigterm(broker: EmbeddedBroker, start_worker: Any,
                                                 new_prefix: Any, tmp_path: Path) -> None:
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    start_worker(triggers, prefix, partitions=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    env.update(_env(broker, prefix))
    follow = subprocess.Popen(
        [sys.executable, "-m", "onceflow.app.cli", "journal", "--follow", "--json",
         "--trigger", "billing"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        for n in range(3):
            sent = onceflow("send", "-", stdin=_line(n, "invoice", f"i-{n}") + "\n", env=env)
            assert sent.returncode == 0, sent.stderr
        seen: list[dict[str, Any]] = []
        assert follow.stdout is not None
        deadline = time.monotonic() + 60
        while len(seen) < 3 and time.monotonic() < deadline:
            line = follow.stdout.readline()
            if line:
                seen.append(orjson.loads(line))
        assert [x["identity"] for x in seen] == ["i-0", "i-1", "i-2"]
        follow.send_signal(signal.SIGTERM)
        _, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize("stdout", ["terminal", "file"])
def test_worker_logs_to_a_file_have_no_terminal_escapes(broker: EmbeddedBroker,
                                                        new_prefix: Any, tmp_path: Path,
                                                        stdout: str) -> None:
    """A worker whose stderr (its log) is a file, and stdout a terminal or the same file."""
    from onceflow.app.broker import free_port
    from onceflow.app.process import http_json

    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    env.update(_env(broker, new_prefix(), ONCEFLOW_PARTITIONS="2",
                    ONCEFLOW_DATA_DIR=str(tmp_path / "data"), ONCEFLOW_WEB_PORT=str(port),
                    ONCEFLOW_LOG_LEVEL="info"))
    env.pop("NO_COLOR", None)
    leader, follower = os.openpty()
    log = tmp_path / "worker.log"
    with log.open("wb") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-m", "onceflow.app.cli", "worker", "--triggers", str(triggers)],
            env=env, stdin=subprocess.DEVNULL,
            stdout=follower if stdout == "terminal" else stderr, stderr=stderr,
            start_new_session=True)
    os.close(follower)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if http_json(f"http://127.0.0.1:{port}/ready", timeout=1)[0] == 200:
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            assert worker.poll() is None, log.read_text()
            time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        os.close(leader)
    text = log.read_bytes()
    assert b"INFO" in text  # there are log lines to look at
    assert b"\x1b[" not in text, text[:2000]


def test_journal_of_a_deployment_with_no_journal_yet(broker: EmbeddedBroker,
                                                     new_prefix: Any) -> None:
    result = onceflow("journal", env=_env(broker, new_prefix()))
    assert result.returncode == 0 and result.stdout == ""
    assert "is empty or does not exist (check ONCEFLOW_TOPIC_PREFIX)" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_second_worker_on_a_data_dir_in_use_stops_before_joining(
        broker: EmbeddedBroker, start_worker: Any, new_prefix: Any, tmp_path: Path) -> None:
    """It joined the group (a rebalance of every worker), hung 38 s and printed a 52-line
    RocksDB LOCK traceback (issue 28 §6)."""
    triggers = tmp_path / "triggers.toml"
    triggers.write_text(TRIGGERS)
    prefix = new_prefix()
    first = start_worker(triggers, prefix, partitions=2)
    started = time.monotonic()
    second = start_worker(triggers, prefix, name="w2", partitions=2, wait=False,
                          data_dir=first.env["ONCEFLOW_DATA_DIR"])
    assert second.process is not None
    assert second.process.wait(timeout=30) == 2
    assert time.monotonic() - started < 15
    said = [line for line in second.log_path.read_text().splitlines() if line.strip()]
    assert len(said) == 1 and "in use by another worker" in said[0], said
    assert "rebalanc" not in first.log_path.read_text().lower()
    assert first.alive


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("PPid:") and int(line.split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().split()[2]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_replay_live_stopped_or_killed_leaves_no_broker_or_worker(sig: int) -> None:
    """Sent SIGTERM it exited and left its embedded broker and worker running, re-parented
    to init; a SIGKILL did the same (issue 28 §6)."""
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "and_join_complete"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    run = subprocess.Popen([sys.executable, "-m", "onceflow.app.cli", "replay", "--live",
                            str(scenario)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(children) < 2 and run.poll() is None and time.monotonic() < deadline:
            children = _children(run.pid)
            time.sleep(0.05)
        assert len(children) == 2, f"no broker and worker seen: {children}"
        run.send_signal(sig)
        run.wait(timeout=60)
        if sig == signal.SIGTERM:
            assert run.returncode == 143
        assert _gone(children, 30), f"still running: {children}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
