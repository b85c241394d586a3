"""Every scenario through the Spark pipeline gives the journal `onceflow replay` gives."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from onceflow.app.replay import replay_scenario
from onceflow.journal import contract_key
from onceflow.pipeline.archive import list_archive
from onceflow.pipeline.plan import ReplayPlan
from onceflow.pipeline.replay import journal_lines, replay_in_memory, replay_to_files
from onceflow.pipeline.session import Progress
from onceflow.scenario import load_scenario

from .support import SCENARIOS, SHARED, multiset, scenario_dirs

pytestmark = pytest.mark.spark

ALL = scenario_dirs(SCENARIOS) + scenario_dirs(SHARED)


def test_there_are_scenarios_to_run() -> None:
    assert len(scenario_dirs(SCENARIOS)) >= 24


@pytest.mark.parametrize("folder", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_scenario_through_spark_equals_replay(spark: Any, folder: Path) -> None:
    scenario = load_scenario(folder)
    table, summary = replay_in_memory(
        spark, list_archive(spark, str(folder)),
        ReplayPlan(scenario.triggers, str(folder), scenario.history, partitions=2))
    got = multiset(journal_lines(table))
    journal, _, engine = replay_scenario(scenario)
    expected = Counter(contract_key(record.as_dict()) for record in journal)
    assert got == expected, (f"missing: {expected - got}\nunexpected: {got - expected}")
    held = {name: len(docs) for name, docs in engine.held.items() if docs}
    assert summary.held == held


def test_suspension_holds_later_documents_of_the_trigger_in_every_group(spark: Any) -> None:
    # suspend_on_retry_failure: a-2 suspends 'fragile'; a-3 and a re-sent a-1 come later
    # and (in other routing groups) must be held, which takes the second pass.
    folder = SCENARIOS / "suspend_on_retry_failure"
    scenario = load_scenario(folder)
    _, summary = replay_in_memory(spark, list_archive(spark, str(folder)),
                                  ReplayPlan(scenario.triggers, str(folder), scenario.history,
                                             partitions=2))
    assert summary.passes == 2
    assert summary.held == {"fragile": 3}


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "through-spark"])
def test_output_folder_of_a_suspending_scenario(spark: Any, tmp_path: Path,
                                                direct: bool) -> None:
    # The output folder, written by the tasks themselves or by Spark's writer: the
    # journal as Parquet and JSON lines, the documents, the held documents, the summary.
    folder = SCENARIOS / "suspend_on_retry_failure"
    scenario = load_scenario(folder)
    output = tmp_path / "out"
    (output / "documents" / "stale-topic").mkdir(parents=True)
    summary = replay_to_files(spark, list_archive(spark, str(folder)),
                              ReplayPlan(scenario.triggers, str(folder), scenario.history,
                                         partitions=2),
                              str(output), Progress(spark, stream=io.StringIO()),
                              direct=direct)
    journal, outputs, _ = replay_scenario(scenario)
    lines = [line for part in sorted((output / "journal.jsonl").glob("part-*"))
             for line in part.read_bytes().splitlines()]
    assert multiset(lines) == Counter(contract_key(record.as_dict()) for record in journal)
    parquet = pq.read_table(output / "journal.parquet")
    assert parquet.num_rows == len(journal)
    assert sorted(parquet.column("json").to_pylist()) == sorted(x.decode() for x in lines)
    assert summary.passes == 2 and summary.held == {"fragile": 3}
    held = pq.read_table(output / "held.parquet")
    assert held.column("trigger").to_pylist() == ["fragile"] * 3
    written = json.loads((output / "summary.json").read_text())
    assert written["held"] == {"fragile": 3} and written["passes"] == 2
    assert sum(row["count"] for row in written["counts"]) == len(journal)
    topics = {item.topic for item in outputs}
    assert {p.name for p in (output / "documents").iterdir() if p.is_dir()} == topics
    for topic in topics:
        got = [line for part in (output / "documents" / topic).glob("part-*")
               for line in part.read_bytes().splitlines()]
        assert len(got) == sum(1 for item in outputs if item.topic == topic)
    assert not (output / "_results").exists()


def test_a_failed_run_leaves_no_results_behind(spark: Any, tmp_path: Path) -> None:
    # The service module is missing: every task of the trigger stage fails.
    (tmp_path / "triggers.toml").write_text(
        '[[trigger]]\nname = "t"\ntypes = ["a"]\nservice = "no_such_module:run"\n')
    (tmp_path / "input.jsonl").write_text(
        '{"ts": 1, "topic": "a", "value": {"uuid": "a-1", "type": "a"}}\n')
    output = tmp_path / "out"
    with pytest.raises(Exception, match="no_such_module"):
        replay_to_files(spark, list_archive(spark, str(tmp_path / "input.jsonl")),
                        ReplayPlan(load_scenario(tmp_path).triggers, str(tmp_path),
                                   partitions=2),
                        str(output), Progress(spark, stream=io.StringIO()))
    assert not (output / "_results").exists()
    assert not (output / "journal.parquet").exists()


def test_cli_replay_spark_prints_the_expected_journal(
    spark: Any, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    from onceflow.app.cli import main

    # In this process: the command uses the test session (a new process starts its own
    # JVM, as the class-data test does).
    folder = SCENARIOS / "and_join_expire"
    assert main(["replay", "--spark", str(folder)]) == 0
    stdout = capsysbinary.readouterr().out.decode()
    got = Counter(contract_key(json.loads(line)) for line in stdout.splitlines() if line)
    expected = Counter(contract_key(json.loads(line)) for line in
                       (folder / "expected.jsonl").read_text().splitlines() if line.strip())
    assert got == expected


CALL_LOGGING_SERVICE = '''\
from pathlib import Path

from onceflow.errors import TransientError

HERE = Path(__file__).parent


def run(document):
    # Every call is logged; the first call for c2 fails (its retries too), later ones
    # succeed: a service whose answer changes between calls.
    with open(HERE / "calls.log", "a") as log:
        log.write(document["uuid"] + "\\n")
    marker = HERE / "c2-failed"
    if document["uuid"] == "c2" and not marker.exists():
        marker.write_text("")
        raise TransientError("c2 is not available")
    return {"done": document["uuid"]}
'''


def test_a_suspending_run_calls_each_service_once_as_replay_does(spark: Any,
                                                                 tmp_path: Path) -> None:
    # The second pass (it holds what follows the suspension) answers the service from
    # the first pass's outcomes: the call log is replay's, and a service that would now
    # answer differently cannot move the suspension.
    module = f"call_log_{tmp_path.name.replace('-', '_')}"  # workers are reused
    (tmp_path / f"{module}.py").write_text(CALL_LOGGING_SERVICE)
    (tmp_path / "triggers.toml").write_text(
        f'[[trigger]]\nname = "logged"\ntypes = ["a"]\nservice = "{module}:run"\n'
        'on_retry_failure = "suspend"\n')
    (tmp_path / "input.jsonl").write_text(
        '{"ts": 1, "topic": "a", "value": {"uuid": "c1", "type": "a"}}\n'
        '{"ts": 2, "topic": "a", "value": {"uuid": "c2", "type": "a"}}\n')
    log, marker = tmp_path / "calls.log", tmp_path / "c2-failed"
    scenario = load_scenario(tmp_path)
    journal, _, _ = replay_scenario(scenario)
    replay_log = log.read_text().split()
    assert replay_log == ["c1", "c2"]
    log.unlink()
    marker.unlink()
    table, summary = replay_in_memory(spark, list_archive(spark, str(tmp_path)),
                                      ReplayPlan(scenario.triggers, str(tmp_path),
                                                 partitions=2))
    assert summary.passes == 2 and summary.held == {"logged": 1}
    assert sorted(log.read_text().split()) == replay_log
    assert multiset(journal_lines(table)) == Counter(contract_key(r.as_dict()) for r in journal)
    assert [r.outcome for r in journal if r.identity == "c2"] == ["suspended"]
