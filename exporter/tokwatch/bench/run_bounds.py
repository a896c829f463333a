"""How far the client's own lateness can have moved each latency figure a bench run publishes (summary.json
`metrics`: the mean and p50/p90/p95/p99 of TTFT, TBT, TPOT, TTOT and E2E), from its requests' own bounds
(docs/methodology.md, "Disturbance").

Each request's figure (each gap, for TBT) truly lies within [value - down, value + up]; a percentile and a
mean are monotone in every value, so the run's true figure lies between that figure of the values shifted
down and of the values shifted up. The `client timing` check fails a run when one of its figures may be
wrong by more than its tolerance: a share of requests with loose bounds does not, by itself, make a
published percentile wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokwatch.bench import arrays
from tokwatch.bench.aggregate import PERCENTILES, counted_records
from tokwatch.bench.arrays import Floats
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.settings.config import Tolerance

# The error a latency figure may carry from the client's own lateness: the probe's default `probe.tolerance`
# (the larger of 1 ms and 5 % of the figure): the bench judges its figures as the probe judges a run's.
CLIENT_TOLERANCE = Tolerance()
JUDGED_METRICS = ("ttft", "tbt", "tpot", "ttot", "e2e")
# TTFT and E2E end at a stamp and start at the send: they can only be late. TPOT and TTOT run between stamps.
_LATE_ONLY = frozenset({"ttft", "e2e"})


@dataclass(frozen=True, slots=True)
class FigureBound:
    """One published figure, the most the client's lateness can have moved it, and its tolerance (seconds)."""

    metric: str
    stat: str  # "mean" or "p50" .. "p99"
    value: float
    bound: float
    limit: float

    @property
    def beyond(self) -> bool:
        """The figure may be wrong by more than its tolerance."""
        return self.bound > self.limit

    @property
    def name(self) -> str:
        """`ttft p99`."""
        return f"{self.metric} {self.stat}"


def run_figure_bounds(
    records: Sequence[RequestRecord], tolerance: Tolerance = CLIENT_TOLERANCE
) -> list[FigureBound]:
    """Every judged figure of the run with its bound; [] when no request watched its own lateness (nothing to
    judge: a run read back from the store)."""
    if not any(r.max_stall_s is not None for r in counted_records(records, "e2e")):
        return []
    out: list[FigureBound] = []
    for metric in JUDGED_METRICS:
        values, down, up = _intervals(counted_records(records, metric), metric)
        if values.size:
            out.extend(_bounds(metric, values, down, up, tolerance))
    return out


def _intervals(counted: Sequence[RequestRecord], metric: str) -> tuple[Floats, Floats, Floats]:
    """The metric's values over the requests summary.json counts for it (`counted_records`), and how far each
    can be below and above its value."""
    if metric == "tbt":
        values = arrays.flat(r.tbt_s for r in counted)
        down, up = np.zeros_like(values), np.zeros_like(values)
        at = 0
        for r in counted:  # most requests have every gap exact: only the others are written
            n = len(r.tbt_s)
            if r.tbt_down_s:
                down[at : at + n], up[at : at + n] = r.tbt_down_s, r.tbt_up_s
            at += n
        return values, down, up
    pairs = [
        (v, getattr(r, f"{metric}_error_s") or 0.0) for r in counted if (v := r.scalar(metric)) is not None
    ]
    values = np.fromiter((v for v, _ in pairs), dtype=np.float64, count=len(pairs))
    err = np.fromiter((e for _, e in pairs), dtype=np.float64, count=len(pairs))
    # No figure is truly below 0 (a bound can exceed a small TPOT's value).
    down = np.minimum(err, values)
    return values, down, np.zeros_like(err) if metric in _LATE_ONLY else err


def _bounds(metric: str, values: Floats, down: Floats, up: Floats, tolerance: Tolerance) -> list[FigureBound]:
    """The mean's and each percentile's bound: the larger distance to the figure of the shifted values."""
    mean = float(values.mean())
    out = [
        FigureBound(metric, "mean", mean, float(max(down.mean(), up.mean())), tolerance.latency_limit(mean))
    ]
    mid = arrays.percentiles_sorted(np.sort(values), PERCENTILES)
    low = arrays.percentiles_sorted(np.sort(values - down), PERCENTILES)
    high = arrays.percentiles_sorted(np.sort(values + up), PERCENTILES)
    for q, m, lo, hi in zip(PERCENTILES, mid, low, high, strict=True):
        out.append(FigureBound(metric, f"p{q}", m, max(m - lo, hi - m), tolerance.latency_limit(m)))
    return out


def beyond_tolerance(bounds: Sequence[FigureBound]) -> list[FigureBound]:
    """The figures that may be wrong beyond their tolerance."""
    return [b for b in bounds if b.beyond]


def bounds_summary(bounds: Sequence[FigureBound], tolerance: Tolerance = CLIENT_TOLERANCE) -> dict[str, Any]:
    """summary.json `client_timing`: each published figure's bound (seconds) by metric and statistic, the
    tolerance, and the figures beyond it (`ttft p99`)."""
    out: dict[str, dict[str, float]] = {}
    for b in bounds:
        out.setdefault(b.metric, {})[b.stat] = b.bound
    return {
        "tolerance": {"floor_s": tolerance.latency_floor, "share": tolerance.latency},
        "bounds_s": out,
        "beyond_tolerance": [b.name for b in beyond_tolerance(bounds)],
    }
