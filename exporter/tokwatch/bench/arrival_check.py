"""Whether a stream of arrival instants is the process that was asked for: the gaps against the exponential
distribution of a Poisson process (Kolmogorov-Smirnov), against the one gap of a constant rate, and the
gaps' lag-1 autocorrelation (0 for both; segments of one schedule whose clocks disagree make the merged
gaps alternate long-short, which shows as a negative value).

Used on the merged send stamps of a split run (`tokwatch bench report`) and, by benchmarks/bench_workers.py,
on a reference server's kernel arrival stamps.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tokwatch.figures.stats import percentile

_KS_TERMS = 100


@dataclass(frozen=True, slots=True)
class ArrivalCheck:
    """The gaps of `arrivals` instants against the requested `kind` at `rate` per second."""

    kind: str
    rate: float
    arrivals: int
    achieved_rate: float | None  # (arrivals - 1) / span
    gap_cv: float | None  # std / mean of the gaps: 1 for Poisson, 0 for constant
    lag1_autocorrelation: float | None
    ks_d: float | None = None  # Poisson: largest distance between the gaps' CDF and 1 - exp(-rate x)
    ks_p: float | None = None  # the probability of a distance at least ks_d from a true Poisson process
    gap_error_p99_s: float | None = None  # constant: p99 of |gap - 1/rate|

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def kolmogorov_p(d: float, n: int) -> float:
    """P(D_n >= d) for a fully specified distribution (Stephens' finite-n correction of the asymptote)."""
    if n <= 0:
        return 1.0
    root = math.sqrt(n)
    lam = (root + 0.12 + 0.11 / root) * d
    if lam < 0.2:
        return 1.0
    total = sum((-1) ** (j - 1) * math.exp(-2.0 * j * j * lam * lam) for j in range(1, _KS_TERMS))
    return min(1.0, max(0.0, 2.0 * total))


def ks_exponential(gaps: Sequence[float], rate: float) -> tuple[float, float]:
    """(D, p) of the gaps against the exponential distribution of mean 1/rate."""
    data = sorted(gaps)
    n = len(data)
    d = 0.0
    for i, x in enumerate(data):
        cdf = 1.0 - math.exp(-rate * x) if x > 0 else 0.0
        d = max(d, (i + 1) / n - cdf, cdf - i / n)
    return d, kolmogorov_p(d, n)


def _lag1(gaps: Sequence[float]) -> float | None:
    n = len(gaps)
    if n < 3:
        return None
    mean = math.fsum(gaps) / n
    var = math.fsum((g - mean) ** 2 for g in gaps)
    if var <= (1e-9 * mean) ** 2 * n:  # constant gaps up to rounding: no correlation to speak of
        return None
    return math.fsum((gaps[i] - mean) * (gaps[i + 1] - mean) for i in range(n - 1)) / var


def check_arrivals(times: Sequence[float], kind: str, rate: float) -> ArrivalCheck:
    """Check arrival instants (seconds, any origin, any order) against `kind` ('poisson', 'constant',
    'gamma': the shape-free figures only) at `rate` per second."""
    ordered = sorted(times)
    gaps = [b - a for a, b in itertools.pairwise(ordered)]
    n = len(ordered)
    span = ordered[-1] - ordered[0] if n > 1 else 0.0
    cv = None
    if len(gaps) > 1:
        mean = math.fsum(gaps) / len(gaps)
        std = math.sqrt(math.fsum((g - mean) ** 2 for g in gaps) / len(gaps))
        cv = std / mean if mean > 0 else None
    check = ArrivalCheck(
        kind=kind,
        rate=rate,
        arrivals=n,
        achieved_rate=(n - 1) / span if span > 0 else None,
        gap_cv=cv,
        lag1_autocorrelation=_lag1(gaps),
    )
    if len(gaps) < 2:
        return check
    if kind == "poisson":
        d, p = ks_exponential(gaps, rate)
        return ArrivalCheck(**{**check.to_dict(), "ks_d": d, "ks_p": p})
    if kind == "constant":
        error = percentile([abs(g - 1.0 / rate) for g in gaps], 99)
        return ArrivalCheck(**{**check.to_dict(), "gap_error_p99_s": error})
    return check
