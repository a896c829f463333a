"""Inline SVG charts for the status page: tile sparklines and an endpoint's daily medians and uptime.

Seed 000's rules: the tok/s line breaks at a non-ok run rather than connecting through it, and each non-ok
run is drawn as a red dashed tick at its position.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence

from tokwatch.figures.wording import counted
from tokwatch.statuspage.model import Day
from tokwatch.storage.base import RunPoint

MIN_SPAN = 0.2  # the y axis spans at least 20 % of the data's level, so a 0.5 % wobble looks flat


def _scale(lo: float, hi: float, top: float, bottom: float) -> tuple[float, float]:
    """Offset and factor mapping [lo, hi] onto [bottom, top] with headroom (flat data centred)."""
    if hi <= 0:
        return (top + bottom) / 2, 0.0
    span = max((hi - lo) * 1.2, MIN_SPAN * hi)
    mid = (hi + lo) / 2
    lo, hi = mid - span / 2, mid + span / 2
    k = (top - bottom) / (hi - lo)
    return bottom - lo * k, k


def _line(points: Sequence[tuple[float, float] | None]) -> tuple[str, list[tuple[float, float]]]:
    """Path data with a new segment after every gap (None), and the isolated points a path cannot show."""
    d: list[str] = []
    lone: list[tuple[float, float]] = []
    segment: list[tuple[float, float]] = []
    for p in [*points, None]:
        if p is not None:
            segment.append(p)
            continue
        if len(segment) == 1:
            lone.append(segment[0])
        elif segment:
            d.append("M" + "L".join(f"{x:.1f} {y:.1f}" for x, y in segment))
        segment = []
    return "".join(d), lone


def sparkline(runs: Sequence[RunPoint], width: int = 260, height: int = 44) -> str:
    """Runs oldest first: the tok/s of ok runs as a line, non-ok runs as red dashed ticks."""
    label = f"{counted(len(runs), 'recent run')}, {sum(r.status != 'ok' for r in runs)} not ok"
    if not runs:
        return (
            f'<svg class="spark" viewBox="0 0 {width} {height}" role="img" aria-label="no runs yet">'
            f'<text x="{width / 2}" y="{height / 2 + 4}" text-anchor="middle" class="muted">'
            "no runs yet</text>"
            "</svg>"
        )
    t0, t1 = runs[0].time, runs[-1].time
    pad_x = 4.0
    span = t1 - t0

    def x_of(i: int, t: float) -> float:
        frac = (t - t0) / span if span > 0 else (i / (len(runs) - 1) if len(runs) > 1 else 0.5)
        return pad_x + frac * (width - 2 * pad_x)

    values = [r.tokens_per_second for r in runs if r.status == "ok" and r.tokens_per_second is not None]
    offset, k = _scale(min(values, default=0.0), max(values, default=0.0), 3.0, height - 3.0)
    points: list[tuple[float, float] | None] = []
    ticks: list[str] = []
    for i, r in enumerate(runs):
        x = x_of(i, r.time)
        if r.status == "ok" and r.tokens_per_second is not None:
            points.append((x, offset + k * r.tokens_per_second))
            continue
        points.append(None)  # an ok run without a figure breaks the line too, but is no failure
        if r.status != "ok":
            ticks.append(f'<line class="fail" x1="{x:.1f}" y1="1" x2="{x:.1f}" y2="{height - 1}"/>')
    d, lone = _line(points)
    dots = "".join(f'<circle class="dot" cx="{x:.1f}" cy="{y:.1f}" r="1.8"/>' for x, y in lone)
    path = f'<path class="line" d="{d}"/>' if d else ""
    return (
        f'<svg class="spark" viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="{html.escape(label)}">{"".join(ticks)}{path}{dots}</svg>'
    )


def daily_medians(days: Sequence[Day], width: int = 720, height: int = 160) -> str:
    """Daily median tok/s as a line with a point per day; days without an ok run leave a gap."""
    left, right, top, bottom = 48.0, 8.0, 8.0, height - 20.0
    values = [d.median for d in days if d.median is not None]
    if not values:
        return _empty(width, height, "no ok runs in this period")
    lo, hi = min(values), max(values)
    offset, k = _scale(lo, hi, top, bottom)
    step = (width - left - right) / max(1, len(days) - 1)
    points = [
        (left + i * step, offset + k * d.median) if d.median is not None else None for i, d in enumerate(days)
    ]
    d, _lone = _line(points)  # every day with a median gets its dot below, a lone one included
    dots = "".join(
        f'<circle class="dot" cx="{p[0]:.1f}" cy="{p[1]:.1f}" r="2"><title>{_day(day.start)}: '
        f"{day.median:.1f} tok/s</title></circle>"
        for p, day in zip(points, days, strict=True)
        if p is not None and day.median is not None
    )
    axis = (
        f'<text x="{left - 6}" y="{offset + k * hi + 4:.1f}" text-anchor="end">{hi:.1f}</text>'
        f'<text x="{left - 6}" y="{offset + k * lo + 4:.1f}" text-anchor="end">{lo:.1f}</text>'
        f'<text x="{left}" y="{height - 4}">{_day(days[0].start)}</text>'
        f'<text x="{width - right}" y="{height - 4}" text-anchor="end">{_day(days[-1].start)}</text>'
    )
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="daily median tok/s over {len(days)} days">{axis}'
        f'<path class="line" d="{d}"/>{dots}</svg>'
    )


def daily_uptime(days: Sequence[Day], width: int = 720, height: int = 70) -> str:
    """A bar per day, its height the day's uptime; green at 100 %, amber from 95 %, red below."""
    left, right, top, bottom = 48.0, 8.0, 4.0, height - 18.0
    if not any(d.runs for d in days):
        return _empty(width, height, "no runs in this period")
    step = (width - left - right) / max(1, len(days))
    bars = []
    for i, d in enumerate(days):
        if d.uptime is None:
            continue
        h = max(1.0, (bottom - top) * d.uptime)
        cls = "up-full" if d.uptime >= 1.0 else "up-some" if d.uptime >= 0.95 else "up-low"
        bars.append(
            f'<rect class="{cls}" x="{left + i * step:.1f}" y="{bottom - h:.1f}" '
            f'width="{max(1.0, step - 1):.1f}" height="{h:.1f}"><title>{_day(d.start)}: '
            f"{d.uptime * 100:.1f} % of {counted(d.runs, 'run')} ok</title></rect>"
        )
    axis = (
        f'<text x="{left - 6}" y="{top + 8}" text-anchor="end">100%</text>'
        f'<text x="{left - 6}" y="{bottom}" text-anchor="end">0%</text>'
        f'<text x="{left}" y="{height - 4}">{_day(days[0].start)}</text>'
        f'<text x="{width - right}" y="{height - 4}" text-anchor="end">{_day(days[-1].start)}</text>'
    )
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="daily uptime over {len(days)} days">{axis}{"".join(bars)}</svg>'
    )


def _empty(width: int, height: int, text: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{text}">'
        f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">{text}</text></svg>'
    )


def _day(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


def whisker(p50: float, p90: float | None, width: int = 120, height: int = 12) -> str:
    """The p50 as a dot on an axis from 0, the p90 as a whisker from it (absent below p90's minimum)."""
    top = max(p50, p90 or 0.0) * 1.1 or 1.0
    x50 = 2 + (width - 4) * p50 / top
    mid = height / 2
    label = f"p50 {p50:.1f}" + ("" if p90 is None else f", p90 {p90:.1f}")
    parts = [f'<line x1="2" y1="{mid}" x2="{width - 2}" y2="{mid}" class="axis"/>']
    if p90 is not None:
        x90 = 2 + (width - 4) * p90 / top
        parts.append(f'<line x1="{x50:.1f}" y1="{mid}" x2="{x90:.1f}" y2="{mid}" class="wh"/>')
        parts.append(f'<line x1="{x90:.1f}" y1="2" x2="{x90:.1f}" y2="{height - 2}" class="wh"/>')
    parts.append(f'<circle cx="{x50:.1f}" cy="{mid}" r="3" class="p50"/>')
    return (
        f'<svg class="whisker" viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(label)}">'
        f"{''.join(parts)}</svg>"
    )


PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#b76e00", "#8250df", "#1b7c83", "#bf3989", "#57606a")


def _colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _legend(names: Sequence[str], x: float, y: float) -> str:
    return "".join(
        f'<g class="key"><rect x="{x:.1f}" y="{y + 14 * i - 8:.1f}" width="10" height="10" '
        f'fill="{_colour(i)}"/><text x="{x + 14:.1f}" y="{y + 14 * i + 1:.1f}">{html.escape(n)}</text></g>'
        for i, n in enumerate(names)
    )


def ttft_by_prompt(
    workloads: Sequence[str], lines: Sequence[tuple[str, Sequence[float | None]]], width: int = 720
) -> str:
    """TTFT p50 (ms) by workload, the workloads in order of prompt size on the x axis: a line per series
    (its name, a TTFT in seconds or None per workload), a gap where a series has no figure."""
    legend_w = 190.0
    height = max(180, 40 + 14 * len(lines))
    left, right, top, bottom = 56.0, legend_w, 10.0, height - 24.0
    values = [v * 1000 for _, vs in lines for v in vs if v is not None]
    if not values or not workloads:
        return _empty(width, 120, "no TTFT figures in this window")
    hi = max(values) * 1.1 or 1.0
    step = (width - left - right) / max(1, len(workloads) - 1)

    def x_of(i: int) -> float:
        return left + (i * step if len(workloads) > 1 else (width - left - right) / 2)

    def y_of(v_ms: float) -> float:
        return bottom - (bottom - top) * v_ms / hi

    paths = []
    for n, (name, vs) in enumerate(lines):
        points = [(x_of(i), y_of(v * 1000)) if v is not None else None for i, v in enumerate(vs)]
        d, _ = _line(points)
        dots = "".join(
            f'<circle cx="{p[0]:.1f}" cy="{p[1]:.1f}" r="3" fill="{_colour(n)}"><title>{html.escape(name)} · '
            f"{html.escape(workloads[i])}: {v * 1000:,.0f} ms</title></circle>"
            for i, (p, v) in enumerate(zip(points, vs, strict=True))
            if p is not None and v is not None
        )
        paths.append(f'<path d="{d}" fill="none" stroke="{_colour(n)}" stroke-width="1.6"/>{dots}')
    axis = (
        f'<line class="axis" x1="{left}" y1="{bottom}" x2="{width - right}" y2="{bottom}"/>'
        f'<text x="{left - 6}" y="{top + 8}" text-anchor="end">{hi:,.0f} ms</text>'
        f'<text x="{left - 6}" y="{bottom}" text-anchor="end">0</text>'
        + "".join(
            f'<text x="{x_of(i):.1f}" y="{height - 6}" text-anchor="middle">{html.escape(w)}</text>'
            for i, w in enumerate(workloads)
        )
    )
    return (
        f'<svg class="chart cmp" id="ttft-by-prompt" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="TTFT p50 by prompt size, {len(lines)} series">{axis}{"".join(paths)}'
        f"{_legend([n for n, _ in lines], width - right + 12, top + 8)}</svg>"
    )


def decode_vs_ttft(points: Sequence[tuple[str, float, float]], width: int = 720, height: int = 240) -> str:
    """A point per series: its TTFT p50 (s, x) against its decode tok/s p50 (y); fast and responsive is up
    and to the left."""
    if not points:
        return _empty(width, 120, "no series with both figures in this window")
    left, right, top, bottom = 56.0, 190.0, 10.0, height - 30.0
    x_hi = max(t for _, t, _ in points) * 1000 * 1.15 or 1.0
    y_hi = max(d for _, _, d in points) * 1.15 or 1.0
    dots = "".join(
        f'<circle class="pt" cx="{left + (width - left - right) * t * 1000 / x_hi:.1f}" '
        f'cy="{bottom - (bottom - top) * d / y_hi:.1f}" r="5" fill="{_colour(i)}">'
        f"<title>{html.escape(name)}: TTFT {t * 1000:,.0f} ms, {d:.1f} tok/s</title></circle>"
        for i, (name, t, d) in enumerate(points)
    )
    axis = (
        f'<line class="axis" x1="{left}" y1="{bottom}" x2="{width - right}" y2="{bottom}"/>'
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>'
        f'<text x="{left - 6}" y="{top + 8}" text-anchor="end">{y_hi:,.0f}</text>'
        f'<text x="{left - 6}" y="{bottom}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 12}">0 ms</text>'
        f'<text x="{width - right}" y="{height - 12}" text-anchor="end">{x_hi:,.0f} ms</text>'
        f'<text x="{(left + width - right) / 2:.1f}" y="{height - 2}" text-anchor="middle">TTFT p50 →</text>'
        f'<text x="{left - 6}" y="{top + 22}" text-anchor="end">tok/s</text>'
    )
    return (
        f'<svg class="chart cmp" id="decode-vs-ttft" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="decode tok/s against TTFT, {len(points)} series">{axis}{dots}'
        f"{_legend([n for n, _, _ in points], width - right + 12, top + 8)}</svg>"
    )


def network_split(parts: Sequence[tuple[str, float]], width: int = 720, height: int = 34) -> str:
    """A stacked bar of where TTFT went (name, seconds), the set-up phases first."""
    total = sum(v for _, v in parts)
    if total <= 0:
        return _empty(width, height, "no network phases measured")
    x = 0.0
    bars = []
    for i, (name, v) in enumerate(parts):
        w = width * v / total
        bars.append(
            f'<rect class="ph" data-phase="{html.escape(name)}" x="{x:.1f}" y="4" width="{max(w, 0.5):.1f}" '
            f'height="18" fill="{_colour(i)}"><title>{html.escape(name)}: {v * 1000:,.1f} ms</title></rect>'
        )
        x += w
    return (
        f'<svg class="chart netbar" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="network and server time">{"".join(bars)}</svg>'
    )


def decode_vs_price(
    points: Sequence[tuple[str, float, float, str]], width: int = 720, height: int = 240
) -> str:
    """A point per priced series, as the leaderboards plot it: its blended price per Mtok (x, in its
    currency) against its decode tok/s p50 (y); fast and cheap is up and to the left."""
    if not points:
        return _empty(width, 120, "no priced series with a decode figure in this window")
    left, right, top, bottom = 56.0, 190.0, 10.0, height - 30.0
    x_hi = max(p for _, p, _, _ in points) * 1.15 or 1.0
    y_hi = max(d for _, _, d, _ in points) * 1.15 or 1.0
    currencies = sorted({c for _, _, _, c in points})
    unit = f"{currencies[0]}/Mtok" if len(currencies) == 1 else "per Mtok (" + ", ".join(currencies) + ")"
    dots = "".join(
        f'<circle class="pt" data-series="{html.escape(name)}" data-price="{p:.6g}" data-decode="{d:.6g}" '
        f'cx="{left + (width - left - right) * p / x_hi:.1f}" cy="{bottom - (bottom - top) * d / y_hi:.1f}" '
        f'r="5" fill="{_colour(i)}"><title>{html.escape(name)}: {p:,.3f} {html.escape(c)}/Mtok blended, '
        f"{d:.1f} tok/s</title></circle>"
        for i, (name, p, d, c) in enumerate(points)
    )
    axis = (
        f'<line class="axis" x1="{left}" y1="{bottom}" x2="{width - right}" y2="{bottom}"/>'
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>'
        f'<text x="{left - 6}" y="{top + 8}" text-anchor="end">{y_hi:,.0f}</text>'
        f'<text x="{left - 6}" y="{bottom}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 12}">0</text>'
        f'<text x="{width - right}" y="{height - 12}" text-anchor="end">{x_hi:,.2f}</text>'
        f'<text x="{(left + width - right) / 2:.1f}" y="{height - 2}" text-anchor="middle">'
        f"blended price, {html.escape(unit)} →</text>"
        f'<text x="{left - 6}" y="{top + 22}" text-anchor="end">tok/s</text>'
    )
    return (
        f'<svg class="chart cmp" id="decode-vs-price" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="decode tok/s against blended price, {len(points)} series">{axis}{dots}'
        f"{_legend([n for n, _, _, _ in points], width - right + 12, top + 8)}</svg>"
    )
