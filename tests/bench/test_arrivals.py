import asyncio
import math
import statistics
import time

import pytest

from tokwatch.bench.arrivals import achieved_rate, arrival_offsets, interarrival_gaps, sleep_until


def _take(it, n):
    return [next(it) for _ in range(n)]


def test_constant_schedule_is_exact_absolute_offsets():
    offsets = _take(arrival_offsets("constant", 8.0, seed=1), 1001)
    assert offsets[0] == 0.0
    assert offsets[1000] == pytest.approx(125.0, rel=1e-12)
    assert achieved_rate(offsets) == pytest.approx(8.0, rel=1e-9)


@pytest.mark.parametrize("kind", ["poisson", "gamma"])
def test_random_schedules_achieve_requested_rate(kind):
    offsets = _take(arrival_offsets(kind, 20.0, seed=7, burstiness=0.5), 20001)
    assert achieved_rate(offsets) == pytest.approx(20.0, rel=0.03)


def test_poisson_gaps_are_exponential():
    gaps = _take(interarrival_gaps("poisson", 4.0, seed=3), 20000)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.25, rel=0.03)
    assert statistics.stdev(gaps) / mean == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1


@pytest.mark.parametrize(("burstiness", "cv"), [(0.25, 2.0), (1.0, 1.0), (4.0, 0.5)])
def test_gamma_burstiness_sets_coefficient_of_variation(burstiness, cv):
    gaps = _take(interarrival_gaps("gamma", 10.0, seed=11, burstiness=burstiness), 40000)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.1, rel=0.04)
    assert statistics.stdev(gaps) / mean == pytest.approx(cv, rel=0.06)  # CV = 1/sqrt(shape)
    assert math.isclose(cv, 1 / math.sqrt(burstiness))


def test_schedules_are_deterministic_for_a_seed():
    a = _take(arrival_offsets("poisson", 5.0, seed=42), 50)
    b = _take(arrival_offsets("poisson", 5.0, seed=42), 50)
    c = _take(arrival_offsets("poisson", 5.0, seed=43), 50)
    assert a == b
    assert a != c


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="rate"):
        next(interarrival_gaps("poisson", 0.0, seed=1))
    with pytest.raises(ValueError, match="burstiness"):
        next(interarrival_gaps("gamma", 1.0, seed=1, burstiness=0))


async def test_sleep_until_never_returns_early():
    deadline = time.perf_counter() + 0.02
    await sleep_until(deadline)
    assert time.perf_counter() >= deadline
    # A deadline in the past returns at once without sleeping.
    await asyncio.wait_for(sleep_until(time.perf_counter() - 1), timeout=1)
