"""A generated archive of 5,000 documents: Spark journal = replay journal; the audit."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.app.replay import replay_scenario
from onceflow.journal import JournalRecord, contract_key
from onceflow.outputs import Output
from onceflow.pipeline.archive import list_archive
from onceflow.pipeline.audit import Auditor
from onceflow.pipeline.plan import ReplayPlan
from onceflow.pipeline.replay import replay_to_files
from onceflow.pipeline.session import Progress
from onceflow.scenario import load_scenario

from .support import multiset

pytestmark = pytest.mark.spark

DOCUMENTS = 5_000


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from generate import generate_lines, write_scenario

    folder = tmp_path_factory.mktemp("generated") / "scenario"
    return write_scenario(folder, generate_lines(DOCUMENTS))


@pytest.fixture(scope="module", params=["direct", "through-spark"])
def spark_output(request: pytest.FixtureRequest, spark: Any, generated: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder; "direct": the tasks read the archive and write the output files
    themselves (a local master's default), "through-spark": Spark's text reader and
    Parquet writer, as on a cluster."""
    output = tmp_path_factory.mktemp("spark") / "out"
    scenario = load_scenario(generated)
    # Small splits: the 0.5 MB file is read as about eight splits in two tasks, so
    # positions, blocks and partition time are rebuilt across split boundaries.
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(1 << 16))
    spark.conf.set("spark.onceflow.direct", "true" if request.param == "direct" else "false")
    try:
        replay_to_files(spark, list_archive(spark, str(generated / "input.jsonl")),
                        ReplayPlan(scenario.triggers, str(generated), partitions=2),
                        str(output), Progress(spark, stream=io.StringIO()))
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.onceflow.direct")
    return output


@pytest.fixture(scope="module")
def replayed(generated: Path) -> tuple[list[JournalRecord], list[Output]]:
    journal, outputs, _ = replay_scenario(load_scenario(generated))
    return journal, outputs


@pytest.fixture(scope="module")
def auditor(spark: Any, generated: Path) -> Iterator[Auditor]:
    scenario = load_scenario(generated)
    checker = Auditor(spark, list_archive(spark, str(generated)), scenario.triggers,
                      partitions=2)
    yield checker
    checker.close()


def journal_lines(output: Path) -> list[bytes]:
    parts = sorted((output / "journal.jsonl").glob("part-*"))
    return [line for part in parts for line in part.read_bytes().splitlines() if line]


def test_spark_journal_equals_the_replay_journal(
    spark: Any, spark_output: Path, replayed: tuple[list[JournalRecord], list[Output]]
) -> None:
    journal, _ = replayed
    expected = Counter(contract_key(record.as_dict()) for record in journal)
    got = multiset(journal_lines(spark_output))
    assert len(journal) > DOCUMENTS
    assert got == expected, f"missing: {expected - got}\nunexpected: {got - expected}"
    parquet = spark.read.parquet(str(spark_output / "journal.parquet"))
    assert parquet.count() == len(journal)


def test_spark_documents_equal_the_replay_outputs(
    spark_output: Path, replayed: tuple[list[JournalRecord], list[Output]]
) -> None:
    _, outputs = replayed

    def canonical(value: Any) -> bytes:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)

    expected: dict[str, Counter[bytes]] = {}
    for item in outputs:
        expected.setdefault(item.topic, Counter())[canonical(
            {"key": item.key, "headers": item.headers, "value": item.value})] += 1
    got: dict[str, Counter[bytes]] = {}
    for folder in (spark_output / "documents").iterdir():
        if folder.is_dir():
            for part in folder.glob("part-*"):
                for line in part.read_bytes().splitlines():
                    got.setdefault(folder.name, Counter())[canonical(orjson.loads(line))] += 1
    assert set(got) == set(expected) == {"billing.out", "fulfil.out", "promo.out",
                                         "onceflow.dead-letter"}
    assert got == expected


# The audits below read a journal written out as JSON lines, the same records from either
# mode (the tests above show the two journals equal): one mode is enough for them.  An
# audit is some 26 Spark jobs, about 3 s of the JVM's CPU even on a few records.  The
# broken journal's four kinds of damage touch different documents, so one audit names
# them all, each in violations of its own.
ONE_MODE = pytest.mark.parametrize("spark_output", ["through-spark"], indirect=True)


@ONE_MODE
def test_audit_passes_on_the_spark_journal(auditor: Auditor, spark_output: Path) -> None:
    result = auditor.check(str(spark_output))
    assert result.passed, [v.message for v in result.violations[:5]]
    assert result.records == DOCUMENTS
    assert result.exempt_pending > 0  # joins still open at the end of the input


@ONE_MODE
def test_audit_names_each_record_a_broken_journal_gets_wrong(
    auditor: Auditor, spark_output: Path, tmp_path: Path
) -> None:
    lines = journal_lines(spark_output)
    records = [orjson.loads(line) for line in lines]
    used: set[str] = set()

    def first(trigger: str, outcome: str) -> int:
        index = next(i for i, r in enumerate(records) if r["trigger"] == trigger
                     and r["outcome"] == outcome and r["identity"] not in used)
        used.add(records[index]["identity"])
        return index

    # 1. A billing document's duplicate record made `processed`: its service ran twice.
    twice = first("billing", "duplicate")
    again = dict(records[twice], outcome="processed")
    again.pop("reason", None)
    # 2. A billing document's `processed` record removed: no terminal outcome.
    removed = first("billing", "processed")
    # 3. A billing record carrying an identity that is not its record's.
    forged_at = first("billing", "processed")
    real = records[forged_at]["identity"]
    forged = dict(records[forged_at], identity="forged-" + real)
    # 4. Join members that waited (join-pending) and then ran with their join: removing
    # the `processed` record leaves the `join-pending` line, which must not pass for a
    # member still waiting in an open join.  The last ones completed near the end of
    # the input, where the waiting-in-join exemption applies.
    pending = {(r["identity"], r["activation"]) for r in records
               if r["trigger"] == "fulfil" and r["outcome"] == "join-pending"}
    ran = [i for i, r in enumerate(records)
           if r["trigger"] == "fulfil" and r["outcome"] == "processed"
           and (r["identity"], r["activation"]) in pending and r["identity"] not in used]
    members = set(sorted(ran, key=lambda i: records[i]["ts"])[-10:])
    changed = {twice: orjson.dumps(again), forged_at: orjson.dumps(forged)}
    gone = {removed, *members}
    broken = tmp_path / "journal.jsonl"
    broken.write_bytes(b"\n".join(changed.get(i, line) for i, line in enumerate(lines)
                                  if i not in gone) + b"\n")

    result = auditor.check(str(broken))
    assert not result.passed
    messages = [v.message for v in result.violations]
    assert result.violation_count == 3 + len(members), messages

    def named(*parts: str) -> list[str]:
        return [m for m in messages if all(part in m for part in parts)]

    ran_twice = [v for v in result.violations if v.check == "twice"]
    assert len(ran_twice) == 1, messages
    assert f"ran its service twice for identity {again['identity']!r}" in ran_twice[0].message
    assert f"@{again['offset']} ts {float(again['ts'])}" in ran_twice[0].message
    gone_record = records[removed]
    assert len(named(f"identity {gone_record['identity']!r}",
                     f"{gone_record['topic']}/{gone_record['partition']}@"
                     f"{gone_record['offset']}",
                     "no terminal outcome for trigger 'billing'")) == 1, messages
    assert len(named(f"carries identity {'forged-' + real!r}",
                     "not the identity of the record it names",
                     f"{forged['topic']}/{forged['partition']}@{forged['offset']}")) == 1, \
        messages
    for index in members:
        assert len(named(f"identity {records[index]['identity']!r}",
                         "no terminal outcome for trigger 'fulfil'")) == 1, messages
