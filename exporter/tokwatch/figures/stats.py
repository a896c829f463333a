"""Small, dependency-free statistics shared by the exporter, storage reports and the benchmark."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); q in 0..100. Raises on empty input."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    return percentile_sorted(sorted(values), q)


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Several percentiles from one sort (a summary of 16,000 requests sorted once, not once per figure)."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    data = sorted(values)
    return [percentile_sorted(data, q) for q in qs]


def percentile_sorted(data: Sequence[float], q: float) -> float:
    """`percentile` of data that is already sorted ascending (no copy, no sort)."""
    if not data:
        raise ValueError("percentile of an empty sequence")
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return float(data[lo])
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def median(values: Sequence[float]) -> float:
    """Median (50th percentile)."""
    return percentile(values, 50.0)


def sample_stddev(values: Sequence[float]) -> float:
    """Sample standard deviation (n-1 denominator); 0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample stddev / mean (a fraction, not percent); None when undefined."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    if mean == 0:
        return None
    return sample_stddev(values) / mean
