"""The arrival-process check: a seeded Poisson schedule passes, other processes and skewed unions do not."""

import itertools

import pytest

from tokwatch.bench.arrival_check import check_arrivals, kolmogorov_p, ks_exponential
from tokwatch.bench.arrivals import arrival_offsets
from tokwatch.bench.segments import Segment


def _schedule(kind, rate, n, seed=1):
    return list(itertools.islice(arrival_offsets(kind, rate, seed), n))


def test_a_poisson_schedule_is_poisson():
    check = check_arrivals(_schedule("poisson", 1000.0, 5000), "poisson", 1000.0)
    assert check.arrivals == 5000 and check.achieved_rate == pytest.approx(1000.0, rel=0.05)
    assert check.ks_p is not None and check.ks_p > 0.01
    assert check.gap_cv == pytest.approx(1.0, abs=0.05)
    assert abs(check.lag1_autocorrelation or 0.0) < 0.05


def test_the_union_of_segments_is_the_schedule_itself():
    whole = _schedule("poisson", 800.0, 4000, seed=3)
    union = [t for k in range(4) for _, t in Segment(k, 4).take(whole)]
    assert check_arrivals(union, "poisson", 800.0) == check_arrivals(whole, "poisson", 800.0)


def test_other_processes_fail_the_poisson_check():
    constant = check_arrivals(_schedule("constant", 1000.0, 2000), "poisson", 1000.0)
    assert constant.ks_d is not None and constant.ks_d > 0.3 and (constant.ks_p or 0.0) < 1e-6
    twice_as_fast = check_arrivals(_schedule("poisson", 2000.0, 2000), "poisson", 1000.0)
    assert (twice_as_fast.ks_p or 1.0) < 1e-6


def test_a_clock_skew_between_two_segments_shows_as_negative_lag1():
    whole = _schedule("constant", 1000.0, 2000)
    skewed = [t + (0.0003 if i % 2 else 0.0) for i, t in enumerate(whole)]
    fine = check_arrivals(whole, "constant", 1000.0)
    bad = check_arrivals(skewed, "constant", 1000.0)
    assert fine.gap_error_p99_s == pytest.approx(0.0, abs=1e-9) and fine.lag1_autocorrelation is None
    assert bad.gap_error_p99_s == pytest.approx(0.0003, rel=0.01)
    assert bad.lag1_autocorrelation is not None and bad.lag1_autocorrelation < -0.9


def test_kolmogorov_tail_matches_known_critical_values():
    # 1.36 / sqrt(n) is the 5 % critical value, 1.63 / sqrt(n) the 1 % one (large n)
    assert kolmogorov_p(1.36 / 100, 10_000) == pytest.approx(0.05, abs=0.003)
    assert kolmogorov_p(1.63 / 100, 10_000) == pytest.approx(0.01, abs=0.001)
    d, p = ks_exponential([0.001] * 10, 1000.0)
    assert d == pytest.approx(1 - 0.36787944, abs=1e-6) and p < 0.01


def test_too_few_arrivals_give_no_verdict():
    check = check_arrivals([0.5], "poisson", 10.0)
    assert (check.arrivals, check.achieved_rate, check.ks_d, check.gap_cv) == (1, None, None, None)
