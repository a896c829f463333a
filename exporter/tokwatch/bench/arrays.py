"""The bench's statistics over large inputs with numpy: a run's 10^5 requests and millions of per-token gaps,
and `bench compare`'s bootstrap resamples.

The percentile is `tokwatch.figures.stats.percentile`'s linear interpolation computed with the same float
operations
in the same order, element for element, so every value is bit for bit what the pure-Python function gives
(tests/bench/test_arrays.py compares them); only sorting and gathering move into numpy.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


def as_sorted(values: Sequence[float] | Floats) -> Floats:
    """The values as an ascending float64 array."""
    return np.sort(np.asarray(values, dtype=np.float64))


def flat(groups: Iterable[Sequence[float]]) -> Floats:
    """Several sequences of floats end to end as one array."""
    return np.fromiter(itertools.chain.from_iterable(groups), dtype=np.float64)


def _positions(n: int, qs: Sequence[float]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], Floats]:
    """Lower and upper index and position of each percentile among n sorted values (as percentile_sorted)."""
    pos = (n - 1) * np.asarray(qs, dtype=np.float64) / 100.0
    return np.floor(pos).astype(np.intp), np.ceil(pos).astype(np.intp), pos


def percentiles_sorted(data: Floats, qs: Sequence[float]) -> list[float]:
    """`stats.percentile_sorted(data, q)` for each q, over an ascending array; raises on empty input."""
    n = data.shape[0]
    if n == 0:
        raise ValueError("percentile of an empty sequence")
    if n == 1:
        return [float(data[0])] * len(qs)
    lo, hi, pos = _positions(n, qs)
    low = data[lo]
    values = np.where(lo == hi, low, low + (data[hi] - low) * (pos - lo))
    return [float(v) for v in values]


class Groups:
    """Values that come in groups (a request's per-token gaps): percentiles of all of them, and of a resample
    of the groups drawn with replacement (the bootstrap), without sorting each resample.

    The values are sorted once; a resample is how many times each group was drawn, so the k-th smallest value
    of the resample is where the running count of drawn values passes k. The percentile then interpolates
    between the same two values a sort of the resample would give, with the same arithmetic."""

    def __init__(self, groups: Sequence[Sequence[float]]) -> None:
        self.count = len(groups)
        lengths = np.fromiter((len(g) for g in groups), dtype=np.intp, count=self.count)
        values = flat(groups)
        order = np.argsort(values, kind="stable")
        self._sorted = values[order]
        self._group_of = np.repeat(np.arange(self.count, dtype=np.intp), lengths)[order]

    def percentiles(self, qs: Sequence[float]) -> list[float] | None:
        """Percentiles of every value (None when there is none)."""
        return percentiles_sorted(self._sorted, qs) if self._sorted.shape[0] else None

    def resampled(self, draws: npt.NDArray[np.intp], qs: Sequence[float]) -> list[float] | None:
        """Percentiles of the groups `draws` (indexes, repeats allowed) together; None if they hold none."""
        times = np.bincount(draws, minlength=self.count)
        running = np.cumsum(times[self._group_of])
        total = int(running[-1]) if running.shape[0] else 0
        if total == 0:
            return None
        if total == 1:
            only = float(self._sorted[int(np.searchsorted(running, 0, side="right"))])
            return [only] * len(qs)
        lo, hi, pos = _positions(total, qs)
        low = self._sorted[np.searchsorted(running, lo, side="right")]
        high = self._sorted[np.searchsorted(running, hi, side="right")]
        values = np.where(lo == hi, low, low + (high - low) * (pos - lo))
        return [float(v) for v in values]


def mean_and_std(data: Floats) -> tuple[float, float]:
    """Mean and population standard deviation, each sum exactly rounded (`math.fsum`, as before numpy)."""
    n = data.shape[0]
    mean = math.fsum(data.tolist()) / n
    dev = data - mean
    return mean, math.sqrt(math.fsum((dev * dev).tolist()) / n)
