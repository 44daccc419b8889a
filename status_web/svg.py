"""Charts as inline SVG, drawn on the server: no JS library, no CDN (the lab LAN may be offline).

Pure: numbers in, markup out. Every text that reaches the markup goes through markupsafe.escape,
so a stage or metric name from a config or a log can never become markup.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from markupsafe import Markup, escape


def nice_step(span: float, target: int = 5) -> float:
    """A 1/2/5 x 10^k step giving about `target` ticks over span."""
    if not span > 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 10000:
        return f"{v / 1000:.0f}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    if a >= 0.01:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.1e}"


def downsample(points: Sequence[tuple[float, float]], limit: int = 300) -> list[tuple[float, float]]:
    """At most `limit` points, evenly thinned, always keeping the first and the last."""
    pts = list(points)
    if len(pts) <= limit:
        return pts
    step = (len(pts) - 1) / (limit - 1)
    return [pts[round(i * step)] for i in range(limit)]


def line_chart(points: Sequence[tuple[float, float]], *, title: str, x_label: str, y_label: str,
               width: int = 480, height: int = 180, css_class: str = "chart", y_from_zero: bool = True) -> Markup:
    """A line chart with axes and ticks; `points` are (x, y) with finite numbers, in x order."""
    pts = [(float(x), float(y)) for x, y in points if _finite(x) and _finite(y)]
    if not pts:
        return Markup(f'<p class="nodata">{escape(title)}: no data yet</p>')
    pts = downsample(pts)
    left, right, top, bottom = 48, 10, 22, 34
    pw, ph = width - left - right, height - top - bottom
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = (min(0.0, min(ys)) if y_from_zero else min(ys)), max(ys)
    if y1 == y0:
        y1 = y0 + (abs(y0) or 1.0)
    ystep = nice_step(y1 - y0, 4)
    y1 = math.ceil(y1 / ystep) * ystep
    if not y_from_zero:
        y0 = math.floor(y0 / ystep) * ystep

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg class="{escape(css_class)}" viewBox="0 0 {width} {height}" role="img" '
           f'data-first-y="{pts[0][1]:.6g}" data-last-y="{pts[-1][1]:.6g}" data-points="{len(pts)}" '
           f'preserveAspectRatio="xMidYMid meet"><title>{escape(title)}</title>',
           f'<text class="ctitle" x="{left}" y="14">{escape(title)}</text>']
    y = y0
    while y <= y1 + ystep / 2:
        py = sy(y)
        out.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{py:.1f}" y2="{py:.1f}"/>'
                   f'<text class="tick" x="{left - 5}" y="{py + 3:.1f}" text-anchor="end">{fmt_num(y)}</text>')
        y += ystep
    xstep = nice_step(x1 - x0, 5)
    x = math.ceil(x0 / xstep) * xstep
    while x <= x1 + 1e-9:
        out.append(f'<text class="tick" x="{sx(x):.1f}" y="{top + ph + 14}" text-anchor="middle">{fmt_num(x)}</text>')
        x += xstep
    out.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}"/>'
               f'<line class="axis" x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}"/>')
    out.append(f'<text class="alabel" x="{left + pw}" y="{height - 4}" text-anchor="end">{escape(x_label)}</text>'
               f'<text class="alabel" x="12" y="{top + ph / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 12 {top + ph / 2:.0f})">{escape(y_label)}</text>')
    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(a):.1f},{sy(b):.1f}" for i, (a, b) in enumerate(pts))
    out.append(f'<path class="line" d="{path}"/>')
    if len(pts) <= 80:
        out.extend(f'<circle class="dot" cx="{sx(a):.1f}" cy="{sy(b):.1f}" r="2.2"/>' for a, b in pts)
    last = pts[-1]
    out.append(f'<text class="lastval" x="{min(sx(last[0]), left + pw - 2):.1f}" y="{max(sy(last[1]) - 6, 10):.1f}" '
               f'text-anchor="end">{fmt_num(last[1])}</text>')
    out.append("</svg>")
    return Markup("".join(out))


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# -- the pipeline timeline (Gantt strip) ---------------------------------------------------------

TIME_STEPS = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def gantt(timeline: dict, *, width: int = 1000) -> Markup:
    """timeline: model.timeline()'s dict (rows of segments, start/end/now, pipeline finish)."""
    rows = timeline.get("rows") or []
    if not rows:
        return Markup('<p class="nodata">no stages</p>')
    t0, t1, now = timeline["start"], timeline["end"], timeline["now"]
    label_w, row_h, top = 150, 24, 22
    pw = width - label_w - 10
    height = top + row_h * len(rows) + 26

    def sx(t: float) -> float:
        return label_w + (t - t0) / (t1 - t0) * pw

    out = [f'<svg class="gantt" viewBox="0 0 {width} {height}" role="img" preserveAspectRatio="xMinYMin meet">'
           '<title>pipeline timeline</title>']
    step = next((s for s in TIME_STEPS if (t1 - t0) / s <= 8), 86400 * math.ceil((t1 - t0) / 86400 / 8))
    t = math.ceil(t0 / step) * step
    while t <= t1:
        x = sx(t)
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top - 4}" y2="{height - 22}"/>'
                   f'<text class="tick" x="{x:.1f}" y="{height - 8}" text-anchor="middle">'
                   f'{time.strftime("%H:%M", time.localtime(t))}</text>')
        t += step
    for i, row in enumerate(rows):
        y = top + i * row_h
        out.append(f'<text class="rowlabel" x="{label_w - 8}" y="{y + 16}" text-anchor="end">'
                   f'{escape(row["stage"])}</text>')
        for seg in row["segments"]:
            a, b = max(seg["start"], t0), min(seg["end"], t1)
            if b < a:
                continue
            w = max(sx(b) - sx(a), 2.0)
            tip = escape(seg.get("tip", ""))
            out.append(f'<rect class="seg {escape(seg["kind"])}" x="{sx(a):.1f}" y="{y + 4}" width="{w:.1f}" '
                       f'height="{row_h - 8}" rx="3"><title>{tip}</title></rect>')
            if seg.get("low") is not None and seg.get("high") is not None:
                lo, hi = sx(max(seg["low"], t0)), sx(min(seg["high"], t1))
                yc = y + row_h / 2
                out.append(f'<line class="range" x1="{lo:.1f}" x2="{hi:.1f}" y1="{yc:.1f}" y2="{yc:.1f}"/>'
                           f'<line class="range" x1="{hi:.1f}" x2="{hi:.1f}" y1="{yc - 5:.1f}" y2="{yc + 5:.1f}"/>')
        if row.get("note"):
            out.append(f'<text class="rownote" x="{label_w + 4}" y="{y + 16}">{escape(row["note"])}</text>')
    x = sx(now)
    out.append(f'<line class="now" x1="{x:.1f}" x2="{x:.1f}" y1="{top - 8}" y2="{height - 22}"/>'
               f'<text class="nowlabel" x="{x - 4:.1f}" y="{top - 10}" text-anchor="end">now</text>')
    fin = timeline.get("finish")
    if fin:
        x = sx(min(fin.at, t1))
        out.append(f'<line class="finish" x1="{x:.1f}" x2="{x:.1f}" y1="{top - 8}" y2="{height - 22}"/>'
                   f'<text class="finlabel" x="{x + 4:.1f}" y="{top - 10}" text-anchor="start">pipeline done '
                   f'{time.strftime("%H:%M", time.localtime(fin.at))}</text>')
    out.append("</svg>")
    return Markup("".join(out))
