"""Archives: folders of several files and formats, and input that is not records."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onceflow.app.replay import replay_scenario
from onceflow.journal import contract_key
from onceflow.pipeline.archive import list_archive
from onceflow.pipeline.plan import ReplayPlan
from onceflow.pipeline.replay import document_lines, journal_lines, replay_in_memory
from onceflow.scenario import load_scenario
from onceflow.triggers import load_triggers

from .support import multiset

pytestmark = pytest.mark.spark

TRIGGERS = """\
[[trigger]]
name = "billing"
types = ["invoice"]
service = "scripted"

[[trigger]]
name = "fulfil"
types = ["order", "payment"]
service = "scripted"
condition = "all"
join_timeout = "5m"
"""


def expected_journal(folder: Path, lines: list[bytes]) -> Counter[tuple[Any, ...]]:
    """What `onceflow replay` gives for these lines, in this order."""
    scenario = folder / "as-scenario"
    scenario.mkdir()
    (scenario / "triggers.toml").write_text((folder / "triggers.toml").read_text())
    (scenario / "input.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    journal, _, _ = replay_scenario(load_scenario(scenario))
    return Counter(contract_key(record.as_dict()) for record in journal)


def run(spark: Any, folder: Path, archive: Path) -> tuple[Any, Counter[tuple[Any, ...]]]:
    plan = ReplayPlan(load_triggers(folder / "triggers.toml"), str(folder), partitions=2)
    table, _ = replay_in_memory(spark, list_archive(spark, str(archive)), plan)
    return table, multiset(journal_lines(table))


def test_a_folder_of_json_lines_gzip_and_parquet_files_is_read_in_path_order(
    spark: Any, tmp_path: Path
) -> None:
    from generate import TRIGGERS_TOML, generate_lines

    (tmp_path / "triggers.toml").write_text(TRIGGERS_TOML)
    lines = [orjson.dumps(line) for line in generate_lines(3000, seed=11)]
    archive = tmp_path / "archive"
    (archive / "2024").mkdir(parents=True)
    (archive / "2024" / "a-0.jsonl").write_bytes(b"\n".join(lines[:1000]) + b"\n")
    rows = [orjson.loads(line) for line in lines[1000:2000]]
    pq.write_table(pa.table({
        "ts": pa.array([r["ts"] for r in rows], pa.float64()),
        "topic": [r["topic"] for r in rows],
        "partition": pa.array([r["partition"] for r in rows], pa.int32()),
        "value": [orjson.dumps(r["value"]).decode() if "value" in r else None for r in rows],
        "raw": [r.get("raw") for r in rows],
    }), archive / "2024" / "a-1.parquet")
    with gzip.open(archive / "2024" / "a-2.jsonl.gz", "wb") as handle:
        handle.write(b"\n".join(lines[2000:]) + b"\n")
    (archive / "_SUCCESS").write_text("")
    (archive / "notes.txt").write_text("not an archive file")
    table, got = run(spark, tmp_path, archive)
    assert len(list_archive(spark, str(archive)).files) == 3
    expected = expected_journal(tmp_path, lines)
    assert got == expected, f"missing: {expected - got}\nunexpected: {got - expected}"


def test_redeliveries_without_their_value_across_files_take_the_first_lines_value(
    spark: Any, tmp_path: Path
) -> None:
    # The read stage lists the offsets a later line redelivers without its value; the
    # ingress and audit stages keep those values only.  A redelivery in another file (and
    # another format) than its first delivery still finds it.
    from onceflow.app.replay import write_journal
    from onceflow.pipeline.audit import run_audit

    (tmp_path / "triggers.toml").write_text(TRIGGERS)
    first = [
        b'{"ts": 1, "topic": "invoice", "offset": 0, "value": {"uuid": "i-1"}}',
        b'{"ts": 2, "topic": "order", "offset": 0, "value": {"uuid": "o-1", "activation": "c"}}',
        b'{"ts": 3, "topic": "invoice", "offset": 1, "raw": "{not json"}',
        b'{"ts": 4, "topic": "invoice", "partition": 1, "offset": 9, "value": {"uuid": "i-2"}}',
    ]
    later = [  # Parquet: the coordinates only
        {"ts": 5.0, "topic": "invoice", "partition": 0, "offset": 0},
        {"ts": 6.0, "topic": "invoice", "partition": 1, "offset": 9},
    ]
    last = [
        b'{"ts": 8, "topic": "order", "offset": 0}',
        b'{"ts": 9, "topic": "invoice", "offset": 1, "headers": {"delivery-count": "2"}}',
        b'{"ts": 10, "topic": "payment", "value": {"uuid": "p-1", "activation": "c"}}',
    ]
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "a-0.jsonl").write_bytes(b"\n".join(first) + b"\n")
    pq.write_table(pa.table({
        "ts": pa.array([r["ts"] for r in later], pa.float64()),
        "topic": [r["topic"] for r in later],
        "partition": pa.array([r["partition"] for r in later], pa.int32()),
        "offset": pa.array([r["offset"] for r in later], pa.int64()),
        "value": pa.array([None] * len(later), pa.string()),
    }), archive / "a-1.parquet")
    with gzip.open(archive / "a-2.jsonl.gz", "wb") as handle:
        handle.write(b"\n".join(last) + b"\n")
    lines = first + [orjson.dumps(r) for r in later] + last
    expected = expected_journal(tmp_path, lines)
    table, got = run(spark, tmp_path, archive)
    assert got == expected, f"missing: {expected - got}\nunexpected: {got - expected}"
    outcomes = Counter((k[0], k[1]) for k in got.elements())
    assert outcomes[("billing", "duplicate")] == 2  # i-1 and i-2 again, values found
    assert outcomes[(None, "bad-input")] == 2  # "{not json", and again without its text
    assert ("fulfil", "processed") in outcomes  # o-1's redelivery did not break the join
    journal, _, _ = replay_scenario(load_scenario(tmp_path / "as-scenario"))
    journal_path = tmp_path / "journal.jsonl"
    with journal_path.open("wb") as handle:
        write_journal(journal, handle)
    result = run_audit(spark, list_archive(spark, str(archive)), str(journal_path),
                       load_triggers(tmp_path / "triggers.toml"), partitions=2)
    assert result.passed, [v.message for v in result.violations]


def test_lines_that_are_not_records_are_reported_and_the_rest_is_processed(
    spark: Any, tmp_path: Path
) -> None:
    (tmp_path / "triggers.toml").write_text(TRIGGERS)
    good = [
        b'{"ts": 1, "topic": "invoice", "value": {"uuid": "i-1"}}',
        b'{"ts": 2, "topic": "order", "value": {"uuid": "o-1", "activation": "c-1"}}',
        b'{"ts": 3, "topic": "invoice", "value": {"uuid": "i-1"}}',
        b'{"ts": 4, "topic": "payment", "value": {"uuid": "p-1", "activation": "c-1"}}',
        b'{"ts": 5, "topic": "invoice", "raw": "{not json"}',
    ]
    bad = [
        b"this is not JSON",
        b"[1, 2, 3]",
        b'{"topic": "invoice", "value": {}}',
        b'{"ts": "soon", "topic": "invoice", "value": {}}',
        b'{"ts": 9, "topic": "invoice", "partition": -1, "value": {}}',
        b'{"ts": 9, "topic": "invoice", "headers": {"dup-id": 7}, "value": {}}',
    ]
    mixed = [good[0], bad[0], good[1], bad[1], bad[2], good[2], b"", bad[3], good[3],
             bad[4], bad[5], good[4]]
    (tmp_path / "input.jsonl").write_bytes(b"\n".join(mixed) + b"\n")
    table, got = run(spark, tmp_path, tmp_path / "input.jsonl")
    rows = table.to_pylist()
    reported = [r for r in rows if r["dataset"] == "journal" and r["topic"] is None]
    assert len(reported) == len(bad)
    assert all(r["outcome"] == "bad-input" and r["trigger"] is None for r in reported)
    where = sorted(r["identity"].rsplit(" ", 1)[-1] for r in reported)
    assert where == sorted(str(mixed.index(line) + 1) for line in bad)  # line numbers
    reasons = " ".join(r["reason"] for r in reported)
    assert "not a JSON line" in reasons and "'ts' must be a number" in reasons
    assert "'headers' must be an object of string values" in reasons
    dead = document_lines(table)["onceflow.dead-letter"]
    assert len(dead) == len(bad) + 1  # and the record whose value is not JSON
    good_only = Counter({k: n for k, n in got.items() if k[4] is not None})
    assert good_only == expected_journal(tmp_path, good)
