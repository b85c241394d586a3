"""Small SVG charts drawn in Python, for a report that needs nothing from the network."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape

OUTCOME_COLOURS = {
    "processed": "#2e7d32",
    "error": "#c62828",
    "duplicate": "#1565c0",
    "rejected": "#6a1b9a",
    "in-doubt": "#ef6c00",
    "join-expired": "#8d6e63",
    "join-discarded": "#90a4ae",
    "bad-input": "#ad1457",
    "duplicate-id": "#00838f",
}
FALLBACK = "#757575"
FONT = "font-family='system-ui, sans-serif' font-size='11'"


def colour(outcome: str) -> str:
    """The colour of an outcome, the same in every chart."""
    return OUTCOME_COLOURS.get(outcome, FALLBACK)


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.3g}"


def _ticks(top: float, count: int = 4) -> list[float]:
    if top <= 0:
        return [0.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step: float = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw),
                      default=raw)
    return [i * step for i in range(int(top // step) + 1)]


def time_label(ts: float, span: float) -> str:
    """A record time on an axis: a UTC date and time when it is one, else plain seconds.

    Record times before 1971 are taken for relative times (scenarios often count from 0).
    """
    if ts < 31_536_000 or ts > 253_402_300_799:
        return f"{ts:,.6g} s"
    moment = datetime.fromtimestamp(ts, tz=UTC)
    if span >= 2 * 86_400:
        return moment.strftime("%Y-%m-%d %H:%M")
    if span >= 120:
        return moment.strftime("%m-%d %H:%M")
    return moment.strftime("%H:%M:%S.%f")[:-3]


def _time_ticks(first: float, last: float, count: int = 5) -> list[float]:
    """Evenly spread times on [first, last] (just `first` when they are equal)."""
    if last <= first:
        return [first]
    return [first + (last - first) * i / (count - 1) for i in range(count)]


def _frame(width: int, height: int, body: list[str], title: str, kind: str) -> str:
    # The width follows the window (CSS scales the drawing; the viewBox keeps its shape).
    return (f"<svg xmlns='http://www.w3.org/2000/svg' class='chart' data-chart='{kind}' "
            f"width='100%' viewBox='0 0 {width} {height}' preserveAspectRatio='xMinYMin meet' "
            f"style='max-width:{width * 2}px' role='img' "
            f"aria-label='{escape(title, quote=True)}'><title>{escape(title)}</title>"
            + "".join(body) + "</svg>")


def stacked_columns(title: str, starts: list[float], series: dict[str, list[int]],
                    width: int = 640, height: int = 220) -> str:
    """Columns over time buckets, each stacked by outcome, with a legend."""
    left, right, top, bottom = 48, 190, 12, 32
    plot_w, plot_h = width - left - right, height - top - bottom
    buckets = len(starts)
    totals = [sum(values[i] for values in series.values()) for i in range(buckets)]
    peak = max(totals, default=0) or 1
    ticks = _ticks(peak)
    scale = plot_h / max(peak, ticks[-1])
    body = []
    for tick in ticks:
        y = top + plot_h - tick * scale
        body.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' "
                    f"stroke='#e0e0e0'/><text x='{left - 4}' y='{y + 4:.1f}' "
                    f"text-anchor='end' {FONT}>{_number(tick)}</text>")
    step = plot_w / max(buckets, 1)
    for i in range(buckets):
        base: float = top + plot_h
        for outcome, values in series.items():
            if values[i]:
                h = values[i] * scale
                base -= h
                body.append(f"<rect class='bar' x='{left + i * step + 1:.1f}' y='{base:.1f}' "
                            f"width='{max(step - 2, 1):.1f}' height='{h:.1f}' "
                            f"fill='{colour(outcome)}'><title>{escape(outcome)}: "
                            f"{values[i]:,} from "
                            f"{escape(time_label(starts[i], 3 * 86_400))}</title></rect>")
    if starts:
        # A time axis: ticks with dates (UTC) under the columns they fall on.
        end = starts[-1] + (starts[1] - starts[0] if buckets > 1 else 0)
        span = end - starts[0]
        for n, tick in enumerate(_time_ticks(starts[0], end)):
            x = left + (plot_w * (tick - starts[0]) / span if span else 0)
            anchor = "start" if n == 0 else ("end" if x >= left + plot_w - 1 else "middle")
            body.append(f"<line class='tick' x1='{x:.1f}' x2='{x:.1f}' y1='{top + plot_h}' "
                        f"y2='{top + plot_h + 4}' stroke='#9e9e9e'/><text class='time' "
                        f"x='{x:.1f}' y='{height - 12}' text-anchor='{anchor}' {FONT}>"
                        f"{escape(time_label(tick, span))}</text>")
        body.append(f"<text x='{left + plot_w}' y='{height}' text-anchor='end' {FONT} "
                    f"fill='#757575'>record time (UTC)</text>")
    for n, outcome in enumerate(series):
        y = top + 4 + n * 16
        body.append(f"<rect x='{width - right + 10}' y='{y}' width='10' height='10' "
                    f"fill='{colour(outcome)}'/><text x='{width - right + 25}' y='{y + 9}' "
                    f"{FONT}>{escape(outcome)} ({sum(series[outcome]):,})</text>")
    return _frame(width, height, body, title, "timeline")


def histogram(title: str, values: list[float], unit: str = "s", bins: int = 30,
              width: int = 640, height: int = 220) -> str:
    """The distribution of `values` in bins of equal width on a log scale.

    Join times span milliseconds to days, so the bins grow geometrically from the
    smallest positive value to the largest; values of 0 (members that came together)
    have a bin of their own at the left.
    """
    left, right, top, bottom = 48, 16, 12, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    body = []
    if not values:
        body.append(f"<text x='{width / 2}' y='{height / 2}' text-anchor='middle' {FONT}>"
                    f"no completed joins</text>")
        return _frame(width, height, body, title, "histogram")
    positive = [v for v in values if v > 0]
    zeros = len(values) - len(positive)
    low = min(positive) if positive else 1.0
    high = max(positive) if positive else 1.0
    ratio = high / low if high > low else 10.0
    edges = [low * ratio ** (i / bins) for i in range(bins + 1)]
    counts = [0] * bins
    log_low, log_span = math.log(low), math.log(ratio)
    for value in positive:
        counts[min(int((math.log(value) - log_low) / log_span * bins), bins - 1)] += 1
    columns = ([zeros] if zeros else []) + counts
    peak = max(columns)
    ticks = _ticks(peak)
    scale = plot_h / max(peak, ticks[-1])
    for tick in ticks:
        y = top + plot_h - tick * scale
        body.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' "
                    f"stroke='#e0e0e0'/><text x='{left - 4}' y='{y + 4:.1f}' "
                    f"text-anchor='end' {FONT}>{_number(tick)}</text>")
    step = plot_w / len(columns)
    labels = (["0"] if zeros else []) + [f"{edges[i]:.4g}-{edges[i + 1]:.4g}"
                                         for i in range(bins)]
    for i, count in enumerate(columns):
        if count:
            h = count * scale
            body.append(f"<rect class='bar' x='{left + i * step + 1:.1f}' "
                        f"y='{top + plot_h - h:.1f}' width='{max(step - 2, 1):.1f}' "
                        f"height='{h:.1f}' fill='#3949ab'><title>{labels[i]} {unit}: "
                        f"{count:,}</title></rect>")
    # Ticks at the powers of ten inside the range, placed on the log axis.
    first_bin = left + (step if zeros else 0)
    log_w = plot_w - (step if zeros else 0)
    if zeros:
        body.append(f"<text class='tick' x='{left + step / 2:.1f}' y='{height - 18}' "
                    f"text-anchor='middle' {FONT}>0</text>")
    marks = [10.0 ** e for e in range(math.floor(math.log10(low)),
                                      math.ceil(math.log10(high)) + 1)
             if low <= 10.0 ** e <= high] or [low, high]
    for mark in marks:
        x = first_bin + log_w * (math.log(mark) - log_low) / log_span
        body.append(f"<line class='tick' x1='{x:.1f}' x2='{x:.1f}' y1='{top + plot_h}' "
                    f"y2='{top + plot_h + 4}' stroke='#9e9e9e'/><text class='tick' "
                    f"x='{x:.1f}' y='{height - 18}' text-anchor='middle' {FONT}>"
                    f"{mark:.4g} {unit}</text>")
    median = sorted(values)[len(values) // 2]
    body.append(f"<text x='{left + plot_w / 2}' y='{height - 4}' text-anchor='middle' "
                f"{FONT}>{len(values):,} joins, median {median:.4g} {unit} (log scale)</text>")
    return _frame(width, height, body, title, "histogram")


def horizontal_bars(title: str, items: list[tuple[str, int]], width: int = 640) -> str:
    """One bar per labelled count, largest first."""
    left, right, row = 180, 60, 22
    height = max(len(items), 1) * row + 16
    body = []
    if not items:
        body.append(f"<text x='{width / 2}' y='{height / 2 + 4}' text-anchor='middle' "
                    f"{FONT}>none</text>")
        return _frame(width, height, body, title, "bars")
    peak = max(count for _, count in items) or 1
    plot_w = width - left - right
    for i, (label, count) in enumerate(items):
        y = 8 + i * row
        w = count / peak * plot_w
        body.append(f"<text x='{left - 6}' y='{y + 13}' text-anchor='end' {FONT}>"
                    f"{escape(label)}</text><rect class='bar' x='{left}' y='{y}' "
                    f"width='{max(w, 1):.1f}' height='{row - 6}' fill='#00838f'>"
                    f"<title>{escape(label)}: {count:,}</title></rect><text "
                    f"x='{left + w + 4:.1f}' y='{y + 13}' {FONT}>{count:,}</text>")
    return _frame(width, height, body, title, "bars")
