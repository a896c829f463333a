"""The bench's statistics as they were before numpy (issue 23): the reference the numpy code is held equal
to in tests/bench/test_arrays.py and timed against in benchmarks/bench_summaries.py."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tokwatch.bench.aggregate import PERCENTILES
from tokwatch.figures.stats import percentile_sorted


def old_summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """aggregate.summarize before numpy."""
    n = len(values)
    out: dict[str, float | int | None] = {"count": n}
    if not n:
        out.update({k: None for k in ("mean", "std", "min", "max", *(f"p{q}" for q in PERCENTILES))})
        return out
    mean = math.fsum(values) / n
    out["mean"] = mean
    out["std"] = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n)
    data = sorted(values)
    out["min"] = float(data[0])
    out["max"] = float(data[-1])
    for q in PERCENTILES:
        out[f"p{q}"] = percentile_sorted(data, q)
    return out
