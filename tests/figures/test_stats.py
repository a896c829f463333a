"""Statistics helpers: percentiles equal numpy's default method, from one sort or many."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokwatch.figures.stats import percentile, percentile_sorted, percentiles


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
def test_percentiles_match_numpy(n: int) -> None:
    rng = random.Random(n)
    values = [rng.expovariate(10) for _ in range(n)]
    qs = [0, 2.5, 50, 90, 95, 99, 100]
    expected = [float(np.percentile(values, q)) for q in qs]
    assert percentiles(values, qs) == pytest.approx(expected)
    assert [percentile(values, q) for q in qs] == pytest.approx(expected)
    assert [percentile_sorted(sorted(values), q) for q in qs] == pytest.approx(expected)


def test_empty_input_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentiles([], [50])
