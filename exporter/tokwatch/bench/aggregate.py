"""Run-level figures from request records: percentile summaries, throughput windows, error counts."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokwatch.bench import arrays
from tokwatch.bench.arrays import Floats
from tokwatch.bench.request_metrics import LIST_METRICS, SCALAR_METRICS, RequestRecord
from tokwatch.figures.result import Status
from tokwatch.figures.stats import percentile

PERCENTILES = (50, 90, 95, 99)
SEND_METRICS = ("scheduling_lag", "queue_time", "connect")  # client-side, before the latency clock starts
LAST_WINDOW_S = 30.0
STEADY_STATE_SKIP = 0.2  # fraction of wall time dropped as ramp-up


def summarize(values: Sequence[float] | Floats) -> dict[str, float | int | None]:
    """count, mean, std (population), min, max and p50/p90/p95/p99; figures are None when empty.

    Sorted once with numpy; the percentiles are `stats.percentile`'s, bit for bit (tokwatch.bench.arrays)."""
    n = len(values)
    out: dict[str, float | int | None] = {"count": n}
    if not n:
        out.update({k: None for k in ("mean", "std", "min", "max", *(f"p{q}" for q in PERCENTILES))})
        return out
    data = arrays.as_sorted(values)
    out["mean"], out["std"] = arrays.mean_and_std(data)
    out["min"] = float(data[0])
    out["max"] = float(data[-1])
    for q, value in zip(PERCENTILES, arrays.percentiles_sorted(data, PERCENTILES), strict=True):
        out[f"p{q}"] = value
    return out


def counted_records(records: Sequence[RequestRecord], name: str) -> list[RequestRecord]:
    """The requests whose values of metric `name` count: measured `ok` ones; for the send-side figures every
    measured one, including those that failed afterwards."""
    if name in SEND_METRICS:
        return [r for r in records if not r.warmup]
    if name not in SCALAR_METRICS and name not in LIST_METRICS:
        raise KeyError(f"unknown metric {name!r}")
    return [r for r in records if r.ok and not r.warmup]


def metric_values(records: Sequence[RequestRecord], name: str) -> list[float]:
    """All observed values of one metric over the measured (non-warm-up) `ok` requests."""
    counted = counted_records(records, name)
    if name in LIST_METRICS:
        return [v for r in counted for v in r.series(name)]
    return [v for r in counted if (v := r.scalar(name)) is not None]


def metric_array(records: Sequence[RequestRecord], name: str) -> Floats:
    """`metric_values` as a numpy array, built without copying each request's per-token list."""
    counted = counted_records(records, name)
    if name in LIST_METRICS:
        attr = f"{name}_s"
        return arrays.flat(getattr(r, attr) for r in counted)
    return np.fromiter((v for r in counted if (v := r.scalar(name)) is not None), dtype=np.float64)


def all_summaries(records: Sequence[RequestRecord]) -> dict[str, dict[str, float | int | None]]:
    """Summary statistics of every metric."""
    return {name: summarize(metric_array(records, name)) for name in (*SCALAR_METRICS, *LIST_METRICS)}


@dataclass(frozen=True, slots=True)
class Window:
    """A wall-time window of the run, seconds since the run start."""

    start: float
    end: float

    @property
    def length(self) -> float:
        """Window length in seconds."""
        return max(0.0, self.end - self.start)


def window_throughput(records: Sequence[RequestRecord], window: Window) -> dict[str, float | int | None]:
    """Requests completed and tokens received inside the window, per second of the window."""
    return _window_figures(records, window, _token_times(records))


def _token_times(records: Sequence[RequestRecord]) -> Floats:
    """Receive time of every generated token of the measured requests, ascending (computed once per run)."""
    times = arrays.flat(r.token_times_s() for r in records if not r.warmup)
    times.sort()
    return times


def _window_figures(
    records: Sequence[RequestRecord], window: Window, token_times: Floats
) -> dict[str, float | int | None]:
    measured = [r for r in records if not r.warmup]
    done = [
        r for r in measured if r.completed_at_s is not None and window.start <= r.completed_at_s <= window.end
    ]
    ok_done = [r for r in done if r.ok]
    # tokens with start <= t <= end, counted on the sorted times
    first = np.searchsorted(token_times, window.start, side="left")
    after = np.searchsorted(token_times, window.end, side="right")
    tokens = max(0, int(after - first))
    length = window.length
    return {
        "window_start_s": window.start,
        "window_end_s": window.end,
        "completed_requests": len(done),
        "ok_requests": len(ok_done),
        "tokens_received": tokens,
        "requests_per_s": len(ok_done) / length if length > 0 else None,
        "tokens_per_s": tokens / length if length > 0 else None,
    }


def throughput(records: Sequence[RequestRecord], wall_s: float) -> dict[str, Any]:
    """Overall, last-30-s and steady-state (first 20 % of wall time dropped) throughput."""
    measured = [r for r in records if not r.warmup and r.ok]
    start = min((r.sent_at_s for r in records if not r.warmup), default=0.0)
    overall = Window(start, wall_s)
    times = _token_times(records)
    last = Window(max(start, wall_s - LAST_WINDOW_S), wall_s)
    steady = Window(start + STEADY_STATE_SKIP * overall.length, wall_s)
    out: dict[str, Any] = {
        "overall": _window_figures(records, overall, times),
        "last_30s": _window_figures(records, last, times),
        "steady_state": _window_figures(records, steady, times),
    }
    # Usage-based totals: what the server says it generated, over the whole measured span.
    gen = sum(r.generated_tokens for r in measured)
    out["overall"]["generated_tokens"] = gen
    out["overall"]["output_tokens"] = sum(r.output_tokens or 0 for r in measured)
    out["overall"]["think_tokens"] = sum(r.think_tokens or 0 for r in measured)
    out["overall"]["prompt_tokens"] = sum(r.prompt_tokens or 0 for r in measured)
    out["overall"]["generated_tokens_per_s"] = gen / overall.length if overall.length > 0 else None
    return out


def error_counts(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Measured requests by status, every status present (0 when none)."""
    counts = Counter(r.status.value for r in records if not r.warmup)
    return {s.value: counts.get(s.value, 0) for s in Status}


def prefill_stats(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """TTFT grouped by target prompt length (seed 002's prefill_stats.json).

    With more than 16 distinct lengths (random ranges) the groups are power-of-two buckets, keyed by
    their upper bound, so each group holds enough requests for a percentile.
    """
    pairs = [
        (r.prompt_tokens_target if r.prompt_tokens_target is not None else (r.prompt_tokens or 0), r.ttft_s)
        for r in records
        if r.ok and not r.warmup and r.ttft_s is not None
    ]
    bucketed = len({k for k, _ in pairs}) > 16
    groups: dict[int, list[float]] = {}
    for key, ttft in pairs:
        if bucketed:
            key = 1 << max(0, key - 1).bit_length()
        groups.setdefault(key, []).append(ttft)
    return {
        "metric": "ttft",
        "group_by": "prompt_tokens_target_pow2_bucket" if bucketed else "prompt_tokens_target",
        "groups": {
            str(k): {
                "count": len(v),
                "mean": math.fsum(v) / len(v),
                "p50": percentile(v, 50),
                "p99": percentile(v, 99),
            }
            for k, v in sorted(groups.items())
        },
    }
