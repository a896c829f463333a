"""Seed 003's workload throughput: Total / New / Cached prompt and completion tokens per second, Overall,
over the last 30 s and in the steady state (first 20 % of the wall time dropped), from a timeline of
cumulative tokens at each request's completion (workload_timeline.json, workload_throughput.json).

Definitions (docs/methodology.md, "Workload throughput"): a measured `ok` request adds its tokens when it
completes; new prompt = prompt - cached (at least 0), cached = the server's cached_tokens (0 when it reports
none); t is seconds since the first measured request was sent; a window's rate is the growth of the
cumulative count between the latest point at or before the window start and the last point, over that time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokwatch.bench.request_metrics import RequestRecord

SCHEMA_VERSION = 1  # tokwatch's own key beside evalscope's (bench.md, "Output directory")
LAST_WINDOW_S = 30.0
WARMUP_FRAC = 0.2
ROWS = ("Total Prompt tok/s", "New Prompt tok/s", "Cached Prompt tok/s", "Completion tok/s")


@dataclass(frozen=True, slots=True)
class Point:
    """Cumulative tokens when one request completed, `t` seconds after the first measured send."""

    t: float
    cum_completion: int
    cum_new_prompt: int
    cum_cached_prompt: int


_ORIGIN = Point(0.0, 0, 0, 0)


def timeline(records: Sequence[RequestRecord]) -> tuple[float | None, list[Point]]:
    """(perf seconds of the first measured send, the cumulative points in completion order)."""
    measured = [r for r in records if not r.warmup]
    if not measured:
        return None, []
    start = min(r.sent_at_s for r in measured)
    done = sorted(
        (r for r in measured if r.ok and r.completed_at_s is not None and r.completed_at_s >= start),
        key=lambda r: r.completed_at_s or 0.0,
    )
    points: list[Point] = []
    completion = new = cached = 0
    for r in done:
        prompt = r.prompt_tokens or 0
        hit = r.cached_tokens or 0
        completion += r.generated_tokens
        new += max(prompt - hit, 0)
        cached += hit
        points.append(Point((r.completed_at_s or 0.0) - start, completion, new, cached))
    return start, points


def _rates(anchor: Point, last: Point) -> list[float]:
    dt = last.t - anchor.t
    if dt <= 0:
        return [0.0] * 4
    new = last.cum_new_prompt - anchor.cum_new_prompt
    cached = last.cum_cached_prompt - anchor.cum_cached_prompt
    return [(new + cached) / dt, new / dt, cached / dt, (last.cum_completion - anchor.cum_completion) / dt]


def _anchor(points: list[Point], t: float) -> Point:
    """The latest point at or before `t` (the first point when none is)."""
    chosen = points[0]
    for p in points:
        if p.t > t:
            break
        chosen = p
    return chosen


def workload_throughput(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """workload_throughput.json: n_samples, wall_time_s, last_window_s, warmup_frac and one row per figure
    (metric, overall, last_window, steady_state), tokens per second."""
    _, points = timeline(records)
    overall = last = steady = [0.0] * 4
    wall = points[-1].t if points else 0.0
    if points:
        end = points[-1]
        overall = _rates(_ORIGIN, end)
        # A run shorter than the window gives its overall rate (a 30 s tail of a 5 s run means nothing).
        last = overall if wall <= LAST_WINDOW_S else _rates(_anchor(points, wall - LAST_WINDOW_S), end)
        head = _anchor(points, wall * WARMUP_FRAC)
        steady = overall if head is end else _rates(head, end)
    return {
        "schema_version": SCHEMA_VERSION,
        "n_samples": len(points),
        "wall_time_s": round(wall, 4),
        "last_window_s": LAST_WINDOW_S,
        "warmup_frac": WARMUP_FRAC,
        "rows": [
            {"metric": name, "overall": overall[i], "last_window": last[i], "steady_state": steady[i]}
            for i, name in enumerate(ROWS)
        ],
    }


def workload_timeline(records: Sequence[RequestRecord], started_at_unix: float) -> dict[str, Any]:
    """workload_timeline.json: `wall_start` (unix seconds of the first measured send) and every point."""
    start, points = timeline(records)
    return {
        "schema_version": SCHEMA_VERSION,
        "wall_start": None if start is None else started_at_unix + start,
        "points": [
            {
                "t": round(p.t, 6),
                "cum_completion": p.cum_completion,
                "cum_new_prompt": p.cum_new_prompt,
                "cum_cached_prompt": p.cum_cached_prompt,
            }
            for p in points
        ],
    }
