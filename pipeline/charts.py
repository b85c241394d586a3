"""Small SVG charts drawn in Python, for a report that needs nothing from the network."""

from __future__ import annotations

import math
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


def _frame(width: int, height: int, body: list[str], title: str, kind: str) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' class='chart' data-chart='{kind}' "
            f"width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' "
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
                            f"{values[i]:,} (from ts {starts[i]:.6g})</title></rect>")
    if starts:
        body.append(f"<text x='{left}' y='{height - 10}' {FONT}>ts {starts[0]:.6g}</text>")
        body.append(f"<text x='{left + plot_w}' y='{height - 10}' text-anchor='end' "
                    f"{FONT}>ts {starts[-1]:.6g}</text>")
    for n, outcome in enumerate(series):
        y = top + 4 + n * 16
        body.append(f"<rect x='{width - right + 10}' y='{y}' width='10' height='10' "
                    f"fill='{colour(outcome)}'/><text x='{width - right + 25}' y='{y + 9}' "
                    f"{FONT}>{escape(outcome)} ({sum(series[outcome]):,})</text>")
    return _frame(width, height, body, title, "timeline")


def histogram(title: str, values: list[float], unit: str = "s", bins: int = 30,
              width: int = 640, height: int = 220) -> str:
    """The distribution of `values` in equal-width bins."""
    left, right, top, bottom = 48, 16, 12, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    body = []
    if not values:
        body.append(f"<text x='{width / 2}' y='{height / 2}' text-anchor='middle' {FONT}>"
                    f"no completed joins</text>")
        return _frame(width, height, body, title, "histogram")
    low, high = min(values), max(values)
    span = (high - low) / bins or 1.0
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / span), bins - 1)] += 1
    peak = max(counts)
    ticks = _ticks(peak)
    scale = plot_h / max(peak, ticks[-1])
    for tick in ticks:
        y = top + plot_h - tick * scale
        body.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' "
                    f"stroke='#e0e0e0'/><text x='{left - 4}' y='{y + 4:.1f}' "
                    f"text-anchor='end' {FONT}>{_number(tick)}</text>")
    step = plot_w / bins
    for i, count in enumerate(counts):
        if count:
            h = count * scale
            body.append(f"<rect class='bar' x='{left + i * step + 1:.1f}' "
                        f"y='{top + plot_h - h:.1f}' width='{max(step - 2, 1):.1f}' "
                        f"height='{h:.1f}' fill='#3949ab'><title>{low + i * span:.4g}-"
                        f"{low + (i + 1) * span:.4g} {unit}: {count:,}</title></rect>")
    body.append(f"<text x='{left}' y='{height - 18}' {FONT}>{low:.4g} {unit}</text>")
    body.append(f"<text x='{left + plot_w}' y='{height - 18}' text-anchor='end' {FONT}>"
                f"{high:.4g} {unit}</text>")
    median = sorted(values)[len(values) // 2]
    body.append(f"<text x='{left + plot_w / 2}' y='{height - 4}' text-anchor='middle' "
                f"{FONT}>{len(values):,} joins, median {median:.4g} {unit}</text>")
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
