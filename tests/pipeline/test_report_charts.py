"""The audit report reads well: dated time axes, a log-scale join histogram, a width that
follows the window, the run's time and inputs, no debug line (no Spark needed here)."""

from __future__ import annotations

import re
from typing import Any

from onceflow.pipeline.audit_result import AuditResult
from onceflow.pipeline.charts import histogram, stacked_columns, time_label
from onceflow.pipeline.report import render

NOV_24 = 1_795_478_400.0  # 2026-11-24T00:00:00Z


def test_time_labels_are_dates_for_record_times_and_seconds_for_relative_times() -> None:
    assert time_label(NOV_24, 3 * 86_400) == "2026-11-24 00:00"
    assert time_label(NOV_24 + 3725, 7200) == "11-24 01:02"
    assert time_label(NOV_24 + 1.5, 10) == "00:00:01.500"
    assert time_label(42.0, 100) == "42 s"
    assert time_label(1e300, 1) == "1e+300 s"


def test_timeline_has_dated_ticks_and_follows_the_window() -> None:
    starts = [NOV_24 + 600 * i for i in range(12)]
    svg = stacked_columns("t", starts, {"processed": [3] * 12, "error": [1] * 12})
    assert "width='100%'" in svg and "viewBox='0 0 640 220'" in svg
    labels = re.findall(r"class='time'[^>]*>([^<]+)<", svg)
    assert len(labels) == 5 and labels[0] == "11-24 00:00" and labels[-1] == "11-24 02:00"
    assert svg.count("class='tick'") == 5


def test_join_time_histogram_is_on_a_log_scale() -> None:
    values = [0.0, 0.0, 0.002, 0.01, 0.5, 3.0, 40.0, 700.0]
    svg = histogram("joins", values)
    ticks = re.findall(r"<text class='tick'[^>]*>([^<]+)<", svg)
    assert ticks == ["0", "0.01 s", "0.1 s", "1 s", "10 s", "100 s"]
    assert "(log scale)" in svg
    bars = re.findall(r"<title>([^<]+)</title></rect>", svg)
    assert bars[0] == "0 s: 2"  # the members that came together
    assert sum(int(b.rsplit(": ", 1)[1]) for b in bars) == len(values)


def test_report_states_its_run_and_inputs_and_has_no_debug_line() -> None:
    result = AuditResult(records=10, first_ts=NOV_24, last_ts=NOV_24 + 60,
                         counts={("orders", "processed"): 10}, journal_records=10)
    html = render(result, archive="s3://bucket/archive", journal="/j/journal.jsonl",
                  written="2026-11-24 01:00:00 UTC")
    assert "audit run</td><td>2026-11-24 01:00:00 UTC" in html
    assert "archive (input)</td><td>s3://bucket/archive" in html
    assert "journal (input)</td><td>/j/journal.jsonl" in html
    assert "00:00:00.000 to 00:01:00.000" in html
    assert "Report data loaded" not in html and "not loaded" not in html


def test_spark_progress_shows_records_per_second_and_an_eta() -> None:
    from onceflow.pipeline.session import pace

    assert pace(0, 8, 5.0, 1000) == ""  # nothing finished yet: no guess
    assert pace(2, 8, 10.0, 8000) == ", ~200 records/s, ETA 30 s"
    assert pace(8, 8, 4.0, None) == ", ETA 0 s"


def test_the_record_count_of_a_local_archive_is_estimated(tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from onceflow.pipeline.archive import Archive, estimate_records

    (tmp_path / "a.jsonl").write_bytes(b'{"a":1}\n{"a":2}\n{"a":3}')
    pq.write_table(pa.table({"value": ["x"] * 5}), tmp_path / "b.parquet")
    files = (str(tmp_path / "a.jsonl"), "file:" + str(tmp_path / "b.parquet"))
    assert estimate_records(Archive(str(tmp_path), files)) == 8
    assert estimate_records(Archive("s3a://b/x", ("s3a://b/x/a.jsonl",))) is None
