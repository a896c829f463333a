"""The percentiles window figures publish (p50, p90, p99), each with the sample count beside it, and the
fewest samples each needs before it is shown (docs/methodology.md, "Percentiles over windows").

The estimator is tokwatch.figures.stats' linear interpolation (numpy's default, PostgreSQL's
percentile_cont), so
the store's SQL and the in-memory window agree. The p50 is shown from one sample (as the window median
always was); a tail percentile only when the window holds at least 1 / (1 - q) samples: below that the "p99"
of 20 runs is the interpolation between the two slowest, a maximum wearing a percentile's name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tokwatch.figures.stats import percentiles

QUANTILES = (0.5, 0.9, 0.99)
# Samples a percentile needs before it is shown: the median one; a tail percentile 1 / (1 - q), so that at
# least one sample is expected beyond it.
MIN_SAMPLES = {0.5: 1, 0.9: 10, 0.99: 100}
_EMPTY = (None,) * len(QUANTILES)


def percentile_label(q: float) -> str:
    """The `percentile` label value of a quantile: 50, 90, 99 (`quantile` is a summary's label, which
    promtool refuses on a gauge)."""
    return f"{q * 100:g}"


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50/p90/p99 of one figure over a window (None where the window has too few samples) and the count
    of samples they are taken over."""

    samples: int = 0
    values: tuple[float | None, ...] = _EMPTY

    @classmethod
    def of(cls, samples: Sequence[float]) -> Percentiles:
        """The percentiles of these samples (one sort), each shown from its minimum sample count."""
        if not samples:
            return cls()
        return cls.computed(len(samples), percentiles(samples, [q * 100.0 for q in QUANTILES]))

    @classmethod
    def computed(cls, samples: int, values: Sequence[float | None] | None) -> Percentiles:
        """Percentiles a database computed over `samples` values (in QUANTILES order, None or empty when
        it had none), each kept only from its minimum sample count."""
        got = list(values) if values else list(_EMPTY)
        shown = tuple(
            float(v) if v is not None and samples >= MIN_SAMPLES[q] else None
            for q, v in zip(QUANTILES, got, strict=True)
        )
        return cls(samples, shown)

    def at(self, q: float) -> float | None:
        """The percentile at quantile `q` (one of QUANTILES), None when not shown."""
        return self.values[QUANTILES.index(q)]

    @property
    def p50(self) -> float | None:
        """The median."""
        return self.values[0]

    @property
    def p90(self) -> float | None:
        """The 90th percentile (shown from MIN_SAMPLES[0.9] samples)."""
        return self.values[1]

    @property
    def p99(self) -> float | None:
        """The 99th percentile (shown from MIN_SAMPLES[0.99] samples)."""
        return self.values[2]

    def shown(self) -> Iterator[tuple[str, float]]:
        """(percentile label, value) of every percentile shown."""
        for q, v in zip(QUANTILES, self.values, strict=True):
            if v is not None:
                yield percentile_label(q), v


NO_PERCENTILES = Percentiles()  # a window without samples (frozen: one shared default)
