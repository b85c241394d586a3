"""The audit report: one self-contained HTML file (inline SVG and script, no network)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

import orjson
from onceflow.journal import OUTCOME_ORDER, TERMINAL

from .audit_result import AuditResult
from .charts import OUTCOME_COLOURS, histogram, horizontal_bars, stacked_columns, time_label

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #212121; }
h1 { margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #ddd; }
.verdict { font-size: 20px; font-weight: 600; padding: 8px 12px; display: inline-block; }
.passed { background: #e8f5e9; color: #1b5e20; } .failed { background: #ffebee; color: #b71c1c; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #757575; } .charts svg { display: block; margin: 8px 0 16px; height: auto; }
"""

SCRIPT = """
(function () {
  try {
    var data = JSON.parse(document.getElementById('audit-data').textContent);
    var charts = document.querySelectorAll('svg.chart');
    var bars = document.querySelectorAll('svg.chart .bar').length;
    var total = 0;
    data.counts.forEach(function (c) { total += c.count; });
    if (total !== data.journal_records) {
      throw new Error('counts add up to ' + total + ', not ' + data.journal_records);
    }
    document.body.setAttribute('data-loaded', 'yes');
    document.body.setAttribute('data-records', String(data.records));
    document.body.setAttribute('data-charts', String(charts.length));
    document.body.setAttribute('data-bars', String(bars));
  } catch (error) {
    document.body.setAttribute('data-error', String(error));
    var problem = document.getElementById('problem');
    problem.textContent = 'The report data does not add up: ' + error;
    problem.hidden = false;
  }
})();
"""


def _table(head: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    out = ["<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = "" if value is None else (f"{value:,}" if isinstance(value, int)
                                             and not isinstance(value, bool) else str(value))
            cls = " class='n'" if i in numeric else ""
            cells.append(f"<td{cls}>{escape(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _counts_table(result: AuditResult) -> str:
    triggers = sorted({t for t, _ in result.counts}, key=lambda t: (t is None, t or ""))
    outcomes = [o for o in OUTCOME_ORDER if any((t, o) in result.counts for t in triggers)]
    outcomes += sorted({o for _, o in result.counts} - set(outcomes))
    rows = [[t or "(ingress)"] + [result.counts.get((t, o), 0) or None for o in outcomes]
            for t in triggers]
    return _table(["trigger", *outcomes], rows, set(range(1, len(outcomes) + 1)))


def _timeline_charts(result: AuditResult) -> str:
    by_trigger: dict[str, dict[str, dict[float, int]]] = defaultdict(lambda: defaultdict(dict))
    starts: set[float] = set()
    for point in result.timeline:
        by_trigger[point["trigger"]][point["outcome"]][point["start"]] = point["count"]
        starts.add(point["start"])
    if not by_trigger:
        return "<p class='muted'>No terminal outcomes with a time.</p>"
    width = result.timeline[0]["width"]
    first = result.first_ts or min(starts)
    buckets = [first + i * width for i in range(round((max(starts) - first) / width) + 1)]
    charts = []
    for trigger in sorted(by_trigger):
        outcomes = by_trigger[trigger]
        ordered = [o for o in OUTCOME_COLOURS if o in outcomes] + sorted(
            set(outcomes) - set(OUTCOME_COLOURS))
        series = {o: [outcomes[o].get(b, 0) for b in buckets] for o in ordered}
        charts.append(f"<h3>{escape(trigger)}</h3>" + stacked_columns(
            f"terminal outcomes over record time for {trigger}", buckets, series))
    return "".join(charts)


def _record_time(result: AuditResult) -> str:
    first, last = result.first_ts, result.last_ts
    if first is None or last is None:
        return "none"
    span = last - first
    return f"{time_label(first, span)} to {time_label(last, span)}"


def render(result: AuditResult, *, archive: str, journal: str,
           written: str | None = None) -> str:
    """The report as one HTML document (`written`: the run's time, default now)."""
    verdict = ("<span class='verdict passed'>PASSED: every guarantee held</span>"
               if result.passed else
               f"<span class='verdict failed'>FAILED: {result.violation_count:,} "
               f"violation(s)</span>")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>onceflow audit</title><style>", STYLE, "</style></head><body>",
        "<h1>onceflow audit</h1>", verdict,
        "<p id='problem' class='failed' hidden></p>",
        _table(["", ""], [["audit run", written or datetime.now(tz=UTC).strftime(
                              "%Y-%m-%d %H:%M:%S UTC")],
                          ["archive (input)", archive], ["journal (input)", journal],
                          ["input records", result.records],
                          ["journal records", result.journal_records],
                          ["record time", _record_time(result)],
                          ["waiting in open joins at the end (allowed)",
                           result.exempt_pending],
                          ["held after a trigger suspended (allowed)", result.exempt_held]]),
        "<h2>Guarantees</h2>",
        "<p>Every input record has exactly one terminal outcome per trigger that takes it "
        "(or one at ingress); no service ran twice for one identity within its history "
        "TTL.</p>",
    ]
    if result.violations:
        shown = result.violations
        parts.append(_table(["check", "trigger", "record"],
                            [[v.check, v.trigger, v.message] for v in shown]))
        if result.violation_count > len(shown):
            parts.append(f"<p class='muted'>{result.violation_count - len(shown):,} more "
                         f"not listed.</p>")
    else:
        parts.append("<p>No violations.</p>")
    parts += ["<h2>Outcomes by trigger</h2>", _counts_table(result),
              "<h2>Outcomes over time</h2><div class='charts'>", _timeline_charts(result),
              "</div><h2>Join completion time</h2><div class='charts'>"]
    if result.join_times:
        for trigger, values in sorted(result.join_times.items()):
            parts.append(f"<h3>{escape(trigger)}</h3>" + histogram(
                f"time from the first to the last document of each join of {trigger} "
                f"(log scale)",
                values))
    else:
        parts.append("<p class='muted'>No All-join trigger completed a join.</p>")
    parts += ["</div><h2>Top duplicate sources</h2><div class='charts'>",
              horizontal_bars("duplicates, rejected copies and duplicate-ids by "
                              "topic/partition", result.duplicate_sources), "</div>"]
    columns = ["trigger", "identity", "activation", "ts", "topic", "partition", "offset",
               "reason"]
    for title, rows, outcome in (("In-doubt documents", result.in_doubt, "in-doubt"),
                                 ("Error documents", result.errors, "error")):
        total = sum(n for (_, o), n in result.counts.items() if o == outcome)
        parts.append(f"<h2>{title} ({total:,})</h2>")
        parts.append(_table(columns, [[r.get(c) for c in columns] for r in rows])
                     if rows else "<p>None.</p>")
        if total > len(rows):
            parts.append(f"<p class='muted'>First {len(rows):,} by time.</p>")
    data = {
        "records": result.records, "journal_records": result.journal_records,
        "passed": result.passed, "violations": result.violation_count,
        "counts": [{"trigger": t, "outcome": o, "count": n,
                    "terminal": o in TERMINAL} for (t, o), n in result.counts.items()],
        "timeline": result.timeline, "duplicate_sources": result.duplicate_sources,
        "join_runs": {t: len(v) for t, v in result.join_times.items()},
    }
    payload = orjson.dumps(data).decode().replace("</", "<\\/")
    parts += [f"<script type='application/json' id='audit-data'>{payload}</script>",
              f"<script>{SCRIPT}</script></body></html>"]
    return "".join(parts)


def write_report(result: AuditResult, path: str, *, archive: str, journal: str) -> None:
    """Write the report file."""
    Path(path).write_text(render(result, archive=archive, journal=journal), encoding="utf-8")
