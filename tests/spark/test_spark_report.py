"""The audit report in headless Chromium, and the `onceflow spark` commands."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from onceflow.app.replay import replay_scenario, write_journal
from onceflow.pipeline.archive import list_archive
from onceflow.pipeline.audit import run_audit
from onceflow.pipeline.report import write_report
from onceflow.scenario import load_scenario

from .support import SCENARIOS

pytestmark = pytest.mark.spark

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--enable-logging=stderr"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("CHROMIUM IS NOT INSTALLED: the audit report cannot be checked in a "
                    "browser. Install it (as root: apt-get update && apt-get install -y "
                    "chromium); .ci/run does this when it can.")
    return found


def png_rows(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct scanlines) of a PNG, read with zlib alone."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, depth = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
            depth = {2: 3, 6: 4}.get(body[9], 1)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + width * depth
    rows = {raw[i:i + stride] for i in range(0, len(raw), stride)}
    return width, height, len(rows)


@pytest.fixture(scope="module")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from generate import generate_lines, write_scenario

    folder = write_scenario(tmp_path_factory.mktemp("report") / "scenario",
                            generate_lines(5000, seed=3))
    scenario = load_scenario(folder)
    journal, _, _ = replay_scenario(scenario)
    journal_path = folder.parent / "journal.jsonl"
    with journal_path.open("wb") as handle:
        write_journal(journal, handle)
    result = run_audit(spark, list_archive(spark, str(folder)), str(journal_path),
                       scenario.triggers, partitions=2)
    assert result.passed
    path = folder.parent / "report.html"
    write_report(result, str(path), archive=str(folder), journal=str(journal_path))
    return path


def test_the_report_is_self_contained(report: Path) -> None:
    html = report.read_text(encoding="utf-8")
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", html)
    assert html.count("<svg") >= 6


def test_the_report_renders_its_charts_in_headless_chromium(report: Path,
                                                            tmp_path: Path) -> None:
    browser = chromium()
    shot = tmp_path / "report.png"
    common = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
              "--window-size=1200,2600"]
    done = subprocess.run([*common, f"--screenshot={shot}", report.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Uncaught" not in done.stderr, done.stderr[-2000:]
    width, height, distinct = png_rows(shot)
    assert (width, height) == (1200, 2600)
    assert distinct > 300, "the screenshot is (nearly) blank"
    dom = subprocess.run([*common, "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body is not None
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    assert "data-error" not in attributes, attributes.get("data-error")
    assert attributes.get("data-loaded") == "yes"
    assert int(attributes["data-charts"]) >= 6
    assert int(attributes["data-bars"]) > 50
    assert attributes.get("data-records") == "5000"
    assert "Report data loaded" not in dom.stdout  # no debug line for readers
    assert "audit run" in dom.stdout and "UTC" in dom.stdout
    assert "PASSED" in dom.stdout


def test_cli_spark_replay_then_audit_of_a_broken_journal_exits_nonzero(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from onceflow.app.cli import main

    # In this process, so the commands use the test session instead of starting a JVM.
    folder = SCENARIOS / "service_fatal"
    output = tmp_path / "out"
    code = main(["spark", "replay", "--triggers", str(folder / "triggers.toml"),
                 "--input", str(folder / "input.jsonl"), "--output", str(output)])
    done = capsys.readouterr()
    assert code == 0, done.err[-2000:]
    assert "onceflow: replay pass 1" in done.err  # progress on stderr
    assert "processed" in done.out  # the summary table
    for name in ("journal.parquet", "journal.jsonl", "documents", "summary.json"):
        assert (output / name).exists(), name
    lines = [line for part in sorted((output / "journal.jsonl").glob("part-*"))
             for line in part.read_bytes().splitlines() if line]
    # (`spark audit` of a journal that passes, exit 0: the standalone cluster's test.)
    dropped = orjson.loads(lines[0])
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"\n".join(lines[1:]) + b"\n")
    code = main(["spark", "audit", "--input", str(folder), "--journal", str(broken),
                 "--report", str(tmp_path / "report.html"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert f"identity {dropped['identity']!r}" in out
    assert "FAILED" in out
    assert (tmp_path / "report.html").exists()
    assert spark.range(1).count() == 1  # the shared session is still running


@pytest.mark.parametrize(("url", "cause"), [
    # Hadoop names the s3a class but does not ship it; the other scheme it does not know.
    ("s3a://no-such-bucket/archive/",
     "ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found"),
    ("nosuchfs://no-such-bucket/archive/",
     'UnsupportedFileSystemException: No FileSystem for scheme "nosuchfs"'),
])
def test_cli_names_the_cause_when_a_file_system_has_no_connector(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, cause: str
) -> None:
    from onceflow.app.cli import main

    folder = SCENARIOS / "service_fatal"
    code = main(["spark", "replay", "--triggers", str(folder / "triggers.toml"),
                 "--input", url, "--output", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"the Spark job failed: {cause}" in err, err
    assert "org.apache.hadoop:hadoop-aws:3.5.0" in err
    assert "Py4J" not in err and "Traceback" not in err
    assert spark.range(1).count() == 1


@pytest.mark.parametrize("name", ["state_keys_unambiguous", "and_join_member_redelivered"])
def test_the_audit_passes_replays_journal_of_ids_holding_separators(
        spark: Any, tmp_path: Path, name: str) -> None:
    # Two join runs whose (activation, identity) pairs would share a key joined with
    # U+001F are two documents: the audit's check that no service ran twice must not
    # take them for one (issue 8 item 3).
    folder = SCENARIOS / name
    scenario = load_scenario(folder)
    journal, _, _ = replay_scenario(scenario)
    journal_path = tmp_path / "journal.jsonl"
    with journal_path.open("wb") as handle:
        write_journal(journal, handle)
    result = run_audit(spark, list_archive(spark, str(folder)), str(journal_path),
                       scenario.triggers, partitions=2)
    assert result.passed, result.violations
