"""Every scenario folder through the core, and a few through the real `onceflow` command.

A scenario's expected.jsonl is compared with the journal as a multiset of the five
contract fields of spec section 7 (trigger, outcome, identity, activation, ts).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from onceflow.app.replay import replay_scenario
from onceflow.errors import ConfigError, ScenarioError
from onceflow.journal import CONTRACT_FIELDS, contract_key, contract_multiset
from onceflow.scenario import load_scenario

HERE = Path(__file__).parents[1]  # tests/
OWN = HERE / "scenarios"
SHARED = Path(__file__).parents[3] / "shared" / "examples"
ONCEFLOW = Path(sys.executable).parent / "onceflow"


def scenario_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "triggers.toml").exists())


def read_expected(folder: Path) -> Counter:
    lines = (folder / "expected.jsonl").read_text(encoding="utf-8").splitlines()
    return Counter(contract_key(json.loads(line)) for line in lines if line.strip())


def describe(expected: Counter, got: Counter) -> str:
    out = []
    for key, n in (expected - got).items():
        out.append(f"missing x{n}: {key}")
    for key, n in (got - expected).items():
        out.append(f"unexpected x{n}: {key}")
    return "\n".join(out)


def test_there_are_enough_scenarios() -> None:
    assert len(scenario_dirs(OWN)) >= 24
    for folder in scenario_dirs(OWN):
        assert (folder / "expected.jsonl").exists(), folder


def expect_failure_if_marked(folder: Path, request: pytest.FixtureRequest) -> None:
    # A scenario whose expected.jsonl follows the spec but which the core gets wrong holds
    # an XFAIL file saying why; strict, so the test reports as soon as the core is fixed.
    marker = folder / "XFAIL"
    if marker.exists():
        reason = marker.read_text(encoding="utf-8").strip()
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


@pytest.mark.parametrize("folder", scenario_dirs(OWN), ids=lambda p: p.name)
def test_own_scenario(folder: Path, request: pytest.FixtureRequest) -> None:
    expect_failure_if_marked(folder, request)
    journal, _, _ = replay_scenario(load_scenario(folder))
    got = Counter(contract_key(r.as_dict()) for r in journal)
    expected = read_expected(folder)
    assert got == expected, describe(expected, got)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared examples are not next to the repo")
@pytest.mark.parametrize("folder", scenario_dirs(SHARED), ids=lambda p: p.name)
def test_shared_example(folder: Path) -> None:
    journal, _, _ = replay_scenario(load_scenario(folder))
    got = Counter(contract_key(r.as_dict()) for r in journal)
    expected = read_expected(folder)
    assert got == expected, describe(expected, got)


def test_the_contract_multiset_counts_lines_and_keeps_the_type_of_ts() -> None:
    line = b'{"trigger": "t", "outcome": "processed", "identity": "u", "activation": null, '
    got = contract_multiset([line + b'"ts": 5}', b"", b"  \n", line + b'"ts": 5.0}',
                             line + b'"ts": 5, "reason": "r"}'])
    assert got == Counter({("t", "processed", "u", None, 5, "int"): 2,
                           ("t", "processed", "u", None, 5.0, "float"): 1})


def test_every_journal_record_has_the_contract_fields() -> None:
    for folder in scenario_dirs(OWN):
        journal, _, _ = replay_scenario(load_scenario(folder))
        for record in journal:
            data = record.as_dict()
            assert set(CONTRACT_FIELDS) <= set(data)
            assert data["activation"] is None or isinstance(data["activation"], str)


# -- the real command ------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    assert ONCEFLOW.exists(), f"the onceflow command is not installed at {ONCEFLOW}"
    return subprocess.run([str(ONCEFLOW), *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name", ["and_join_expire", "bad_input", "dupid_drop",
                                  "timestamps_echoed"])
def test_cli_replay_prints_the_expected_journal(name: str) -> None:
    folder = OWN / name
    done = run_cli("replay", str(folder))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    got = Counter(contract_key(line) for line in lines)
    expected = read_expected(folder)
    assert got == expected, describe(expected, got)


def test_cli_replay_of_a_shared_example() -> None:
    folders = scenario_dirs(SHARED)
    if not folders:
        pytest.skip("shared examples are not next to the repo")
    for folder in folders:
        done = run_cli("replay", str(folder))
        assert done.returncode == 0, done.stderr
        got = Counter(contract_key(json.loads(line)) for line in done.stdout.splitlines() if line)
        assert got == read_expected(folder)


def test_cli_summary_counts_outcomes_per_trigger() -> None:
    done = run_cli("replay", "--summary", str(OWN / "service_transient_retries"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    head = lines[0]
    assert head.split()[0] == "trigger"
    # Cells are right-aligned under their column names: a column ends where its name ends.
    ends = {m.group(): m.end() for m in re.finditer(r"\S+", head)}
    rows = {line.split()[0]: line for line in lines[2:] if line.strip()}
    assert set(rows) == {"retrying", "noretry"}

    def count(trigger: str, outcome: str) -> int:
        if outcome not in ends:
            return 0
        end = ends[outcome]
        cell = rows[trigger][end - max(len(outcome), 5):end].strip()
        return int(cell) if cell else 0

    # retrying: j-1 and j-2 processed, j-3 and j-4 error, j-3 rejected, j-1 duplicate;
    # retries: 2 (j-1) + 1 (j-2) + 2 (j-3) + 2 (j-4).
    assert count("retrying", "processed") == 2
    assert count("retrying", "error") == 2
    assert count("retrying", "duplicate") == 1
    assert count("retrying", "rejected") == 1
    assert count("retrying", "retry") == 7
    assert count("noretry", "error") == 2
    assert count("noretry", "processed") == 1
    assert count("noretry", "retry") == 0


def test_cli_summary_says_which_trigger_is_suspended() -> None:
    done = run_cli("replay", "--summary", str(OWN / "suspend_on_retry_failure"))
    assert done.returncode == 0, done.stderr
    assert "'fragile' is suspended" in done.stdout
    # a-3 and the re-sent a-1 are held after a-2 itself.
    assert "3 document(s)" in done.stdout
    assert "steady" in done.stdout


def test_cli_reports_a_bad_trigger_file_and_exits_nonzero(tmp_path: Path) -> None:
    (tmp_path / "triggers.toml").write_text(
        '[[trigger]]\nname = "t"\ntypes = ["a"]\nservice = "scripted"\nmax_retry_attempts = -1\n')
    (tmp_path / "input.jsonl").write_text('{"ts": 0, "topic": "a", "value": {}}\n')
    done = run_cli("replay", str(tmp_path))
    assert done.returncode != 0
    assert "max_retry_attempts" in done.stderr
    assert "'t'" in done.stderr
    assert done.stdout == ""


def test_unloadable_service_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "triggers.toml").write_text(
        '[[trigger]]\nname = "t"\ntypes = ["a"]\nservice = "no_such_module:run"\n')
    (tmp_path / "input.jsonl").write_text('{"ts": 0, "topic": "a", "value": {}}\n')
    with pytest.raises(ConfigError) as info:
        replay_scenario(load_scenario(tmp_path))
    message = str(info.value)
    assert "triggers.toml" in message and "'t'" in message and "'service'" in message


def test_a_service_beside_the_trigger_file_is_loaded(tmp_path: Path) -> None:
    (tmp_path / "triggers.toml").write_text(
        '[[trigger]]\nname = "t"\ntypes = ["a"]\nservice = "beside_svc_mod:handle"\n')
    (tmp_path / "beside_svc_mod.py").write_text(
        "def handle(doc):\n"
        "    if doc['body'].get('boom'):\n"
        "        raise ValueError('boom')\n"
        "    return {'seen': doc['uuid']}\n")
    (tmp_path / "input.jsonl").write_text(
        '{"ts": 0, "topic": "a", "value": {"uuid": "u-1", "body": {}}}\n'
        '{"ts": 1, "topic": "a", "value": {"uuid": "u-2", "body": {"boom": true}}}\n')
    journal, outputs, _ = replay_scenario(load_scenario(tmp_path))
    assert [(r.identity, r.outcome) for r in journal] == [("u-1", "processed"),
                                                          ("u-2", "error")]
    by_topic = {o.topic: o for o in outputs}
    assert by_topic["t.out"].value == {"seen": "u-1"}
    assert by_topic["t.error"].value["error"]["type"] == "ValueError"


def test_cli_outputs_writes_one_file_per_topic(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_cli("replay", "--outputs", str(out), str(OWN / "service_fatal"))
    assert done.returncode == 0, done.stderr
    # The journal is still printed in full.
    got = Counter(contract_key(json.loads(line)) for line in done.stdout.splitlines() if line)
    assert got == read_expected(OWN / "service_fatal")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["billing.error.jsonl", "billing.out.jsonl", "nohistory.error.jsonl"]
    errors = [json.loads(line) for line in (out / "nohistory.error.jsonl").read_text()
              .splitlines()]
    assert [e["value"]["identity"] for e in errors] == ["m-1", "m-1"]
    (ok,) = [json.loads(line) for line in (out / "billing.out.jsonl").read_text()
             .splitlines()]
    assert ok["value"] == {"ok": True}
    assert ok["headers"]["dup-id"] == "billing:a-2"


def test_a_redelivery_line_without_a_value_takes_the_first_lines_value(tmp_path: Path) -> None:
    # The reader keeps where each offset's line starts in the file, not its decoded value,
    # and reads and decodes that line again for a redelivery that leaves the value out:
    # the same value, "raw" text included.
    from onceflow.scenario import InputOffsets, parse_record_line, read_records
    from onceflow.values import NotJson

    lines = [{"ts": 1, "topic": "t", "value": {"uuid": "a", "n": [1, {"x": None}]}},
             {"ts": 2, "topic": "t", "raw": "not json"},
             {"ts": 3, "topic": "t", "partition": 1, "offset": 7, "value": "seven"},
             {"ts": 4, "topic": "t", "offset": 0},
             {"ts": 5, "topic": "t", "offset": 1},
             {"ts": 6, "topic": "t", "partition": 1, "offset": 7}]
    path = tmp_path / "input.jsonl"
    path.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    records = list(read_records(path))
    assert [(r.partition, r.offset) for r in records] == [(0, 0), (0, 1), (1, 7), (0, 0),
                                                         (0, 1), (1, 7)]
    assert records[3].value == records[0].value == {"uuid": "a", "n": [1, {"x": None}]}
    assert isinstance(records[4].value, NotJson) and records[4].value.text == "not json"
    assert records[5].value == "seven"
    # Given items without their lines (the Spark stages), the values themselves are kept.
    offsets = InputOffsets()
    parsed = [parse_record_line(line, offsets) for line in lines]
    assert parsed[3].value is parsed[0].value and parsed[5].value == "seven"
    # An offset never seen before still needs a value.
    with pytest.raises(Exception, match="needs 'value' or 'raw'"):
        parse_record_line({"ts": 7, "topic": "t", "offset": 5}, offsets)
    # Told which offsets will be wanted (the Spark stages), only those values are kept.
    offsets = InputOffsets(only_wanted=True)
    offsets.want("t", 1, [7])
    parsed = [parse_record_line(line, offsets) for line in lines[:3]]
    assert offsets.lanes[("t", 0)].values == {} and offsets.lanes[("t", 1)].values == {
        7: "seven"}
    assert parse_record_line(lines[5], offsets).value == "seven"
    with pytest.raises(Exception, match="needs 'value' or 'raw'"):
        parse_record_line(lines[3], offsets)


def test_redeliveries_reread_their_first_line_whatever_the_line_endings(tmp_path: Path) -> None:
    # Positions count every byte: CRLF endings, blank lines, a line with multi-byte text
    # and a last line without a newline.
    from onceflow.scenario import InputOffsets, read_records

    path = tmp_path / "input.jsonl"
    text = ('{"ts": 1, "topic": "t", "value": {"uuid": "\u00e9t\u00e9", "s": "\\u00fc"}}\r\n'
            "\r\n"
            '{"ts": 2, "topic": "t", "value": "zw\u00f6lf \u2603"}\n'
            '{"ts": 3, "topic": "t", "value": "d\u00e9j\u00e0"}\n'
            '{"ts": 4, "topic": "t", "offset": 1}\r\n'
            '{"ts": 5, "topic": "t", "offset": 0}\n'
            '{"ts": 6, "topic": "t", "offset": 2}')
    path.write_bytes(text.encode())
    offsets = InputOffsets()
    records = list(read_records(path, offsets))
    assert [r.offset for r in records] == [0, 1, 2, 1, 0, 2]
    assert records[3].value == "zw\u00f6lf \u2603"
    assert records[4].value == {"uuid": "\u00e9t\u00e9", "s": "\u00fc"}
    assert records[5].value == "d\u00e9j\u00e0"
    # What is kept per offset is a position, not the line: from the first redelivery
    # without a value on, for every line (the lines before it were read again for theirs).
    assert offsets.indexed
    data = text.encode()
    assert offsets.lanes[("t", 0)].values == {0: 0, 1: data.index(b'{"ts": 2'),
                                              2: data.index(b'{"ts": 3')}
    # Without such a redelivery nothing is kept at all.
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(text.encode().split(b'{"ts": 4')[0])
    kept = InputOffsets()
    assert len(list(read_records(plain, kept))) == 3
    assert not kept.indexed and kept.lanes[("t", 0)].values == {}
    # Those positions are in this file: reading another with the same offsets is refused.
    other = tmp_path / "other.jsonl"
    other.write_bytes(b'{"ts": 1, "topic": "t", "value": 1}\n')
    with pytest.raises(ValueError, match="positions in"):
        list(read_records(other, offsets))


def test_a_pipe_is_read_once_and_its_redelivered_lines_are_kept(tmp_path: Path) -> None:
    # A named pipe cannot be read again: the reader keeps the lines themselves.
    import threading

    from onceflow.scenario import InputOffsets, read_records

    path = tmp_path / "input.jsonl"
    os.mkfifo(path)
    text = (b'{"ts": 1, "topic": "t", "value": {"uuid": "a"}}\n'
            b'{"ts": 2, "topic": "t", "offset": 0}\n')
    writer = threading.Thread(target=path.write_bytes, args=(text,))
    writer.start()
    offsets = InputOffsets()
    records = list(read_records(path, offsets))
    writer.join()
    assert [r.value for r in records] == [{"uuid": "a"}, {"uuid": "a"}]
    assert offsets.reread is None
    assert all(type(v) is bytes for v in offsets.lanes[("t", 0)].values.values())


def test_a_file_changed_under_the_reader_is_a_scenario_error(tmp_path: Path) -> None:
    from onceflow.errors import ScenarioError
    from onceflow.scenario import read_records

    path = tmp_path / "input.jsonl"
    path.write_bytes(b'{"ts": 1, "topic": "t", "value": 1}\n'
                     b'{"ts": 2, "topic": "t", "offset": 0}\n')
    records = read_records(path)
    assert next(records).value == 1
    path.write_bytes(b"not json any more\n" * 4)  # the rest is in the reader's buffer
    with pytest.raises(ScenarioError, match="cannot be read again"):
        next(records)


def test_a_first_line_that_changed_in_the_file_is_not_taken_for_the_record(
        tmp_path: Path) -> None:
    # Offsets that point at a line which now holds another record: the redelivery is an
    # error, not that record's value.
    from onceflow.errors import ScenarioError
    from onceflow.scenario import InputOffsets, parse_record_line

    path = tmp_path / "input.jsonl"
    path.write_bytes(b'{"ts": 1, "topic": "u", "value": 1}\n'
                     b'{"ts": 1, "topic": "t", "partition": 1, "value": 2}\n'
                     b'{"ts": 1, "topic": "t", "offset": 7, "value": 3}\n'
                     b'{"ts": 1, "topic": "t", "offset": 0}\n'
                     b'{"ts": 1, "topic": "t", "raw": "x"}\n'
                     b"[]\n"
                     b'{"ts": 1, "topic": "t", "raw": 5}\n')
    starts = [0]
    for line in path.read_bytes().splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    offsets = InputOffsets()
    offsets.reread, offsets.indexed = path, True
    lane = offsets.lane("t", 0)
    lane.top = 0
    # Another topic, partition or offset, no value, not an object, raw text that is not text.
    for start in starts[:4] + starts[5:7]:
        lane.values[0] = start
        with pytest.raises(ScenarioError, match="changed in the file"):
            parse_record_line({"ts": 2, "topic": "t", "offset": 0}, offsets, "", None, 999)
    lane.values[0] = starts[4]  # the record's own line ("raw" counts as its value)
    assert parse_record_line({"ts": 2, "topic": "t", "offset": 0}, offsets, "", None,
                             999).value.text == "x"
    offsets.close()


# -- control lines: the operator's suspend and resume (spec section 7) -------------------------

def _control_scenario(tmp_path: Path, line: str) -> Path:
    (tmp_path / "triggers.toml").write_text(
        '[[trigger]]\nname = "bill"\ntypes = ["invoice"]\nservice = "scripted"\n')
    (tmp_path / "input.jsonl").write_text(
        '{"ts": 1, "topic": "invoice", "value": {"uuid": "i-1"}}\n' + line + "\n")
    return tmp_path


@pytest.mark.parametrize(("line", "says"), [
    ('{"ts": 2, "control": "suspend", "trigger": "billing"}',
     "input.jsonl:2: 'trigger' must name a trigger of triggers.toml (bill), got 'billing'"),
    ('{"ts": 2, "control": "pause", "trigger": "bill"}',
     "input.jsonl:2: 'control' must be \"suspend\" or \"resume\", got \"pause\""),
    ('{"ts": 2, "control": "resume"}', "input.jsonl:2: a resume line needs 'trigger'"),
    ('{"control": "resume", "trigger": "bill"}', "input.jsonl:2: 'ts' must be a number"),
    ('{"ts": 2, "control": "resume", "trigger": "bill", "topic": "invoice"}',
     "input.jsonl:2: a control line has only 'ts', 'control' and 'trigger', not 'topic'"),
])
def test_a_bad_control_line_is_a_scenario_error_naming_its_line(tmp_path: Path, line: str,
                                                                 says: str) -> None:
    scenario = load_scenario(_control_scenario(tmp_path, line))
    with pytest.raises(ScenarioError) as info:
        list(scenario.iter_records())
    assert says in str(info.value)


def test_a_control_line_reads_as_a_command_at_its_time(tmp_path: Path) -> None:
    from onceflow.scenario import Control

    scenario = load_scenario(_control_scenario(
        tmp_path, '{"ts": 2.0004, "control": "suspend", "trigger": "bill"}'))
    _, control = scenario.iter_records()
    assert control == Control(2000, "suspend", "bill")  # in ms, rounded
