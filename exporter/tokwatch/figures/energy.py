"""Energy figures as pure functions: joules over a timed interval from power samples or an energy counter,
the idle baseline taken out, and joules per token (docs/methodology.md, "Cost and energy").

Power samples are (time in seconds, watts) on one clock; an energy counter is read in joules at the start and
end of the interval (DCGM's `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` is in millijoules: convert before).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

PowerSample = tuple[float, float]


def integrate_power(samples: Sequence[PowerSample], t0: float, t1: float) -> float | None:
    """Joules between `t0` and `t1` by the trapezoid rule over the samples, interpolated linearly at both
    ends. None when the samples do not cover the whole interval (a figure that would be extrapolated)."""
    if t1 <= t0 or len(samples) < 2:
        return None
    pts = sorted(samples)
    if pts[0][0] > t0 or pts[-1][0] < t1:
        return None
    joules = 0.0
    for (ta, pa), (tb, pb) in itertools.pairwise(pts):
        lo, hi = max(ta, t0), min(tb, t1)
        if hi <= lo or tb <= ta:
            continue
        p_lo = pa + (pb - pa) * (lo - ta) / (tb - ta)
        p_hi = pa + (pb - pa) * (hi - ta) / (tb - ta)
        joules += (p_lo + p_hi) / 2.0 * (hi - lo)
    return joules


def counter_energy(before_j: float | None, after_j: float | None) -> float | None:
    """Joules between two readings of a monotonic energy counter; None when either is missing or the counter
    went back (a reset: the device or exporter restarted in between)."""
    if before_j is None or after_j is None or after_j < before_j:
        return None
    return after_j - before_j


@dataclass(frozen=True, slots=True)
class RunEnergy:
    """One interval's energy: `total_j` measured, `idle_j` the baseline for the same time, `net_j` what the
    work added over idle."""

    total_j: float
    idle_j: float
    duration_s: float

    @property
    def net_j(self) -> float:
        """Energy above the idle baseline (never negative: a noisy baseline does not make work free)."""
        return max(self.total_j - self.idle_j, 0.0)


def run_energy(total_j: float, idle_watts: float | None, duration_s: float) -> RunEnergy:
    """Pair the measured energy with the idle baseline over the same duration (0 when none was measured)."""
    return RunEnergy(total_j=total_j, idle_j=max(idle_watts or 0.0, 0.0) * duration_s, duration_s=duration_s)


def joules_per_token(joules: float, tokens: int) -> float | None:
    """Joules per token; None without tokens."""
    return joules / tokens if tokens > 0 else None
