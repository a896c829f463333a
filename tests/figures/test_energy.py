"""Energy figures: the trapezoid over power samples, energy counters, the idle baseline, J/token."""

from __future__ import annotations

import pytest

from tokwatch.figures.energy import counter_energy, integrate_power, joules_per_token, run_energy


def test_a_constant_power_integrates_to_power_times_time() -> None:
    assert integrate_power([(0.0, 100.0), (10.0, 100.0)], 2.0, 5.0) == pytest.approx(300.0)


def test_a_ramp_is_integrated_exactly_and_interpolated_at_both_ends() -> None:
    samples = [(0.0, 0.0), (1.0, 100.0), (2.0, 100.0), (4.0, 0.0)]
    # 0.5..1: ramp 50->100 (37.5 J), 1..2: 100 J, 2..3: ramp 100->50 (75 J)
    assert integrate_power(samples, 0.5, 3.0) == pytest.approx(212.5)
    assert integrate_power(list(reversed(samples)), 0.5, 3.0) == pytest.approx(212.5)  # order does not matter


def test_an_interval_the_samples_do_not_cover_has_no_figure() -> None:
    assert integrate_power([(1.0, 50.0), (2.0, 50.0)], 0.5, 1.5) is None
    assert integrate_power([(1.0, 50.0), (2.0, 50.0)], 1.5, 2.5) is None
    assert integrate_power([(1.0, 50.0)], 1.0, 1.0) is None


def test_an_energy_counter_gives_its_difference_and_a_reset_gives_none() -> None:
    assert counter_energy(1000.0, 1250.5) == pytest.approx(250.5)
    assert counter_energy(1250.0, 10.0) is None
    assert counter_energy(None, 10.0) is None


def test_the_idle_baseline_is_taken_out_and_never_makes_work_negative() -> None:
    e = run_energy(total_j=500.0, idle_watts=60.0, duration_s=5.0)
    assert (e.idle_j, e.net_j) == (300.0, 200.0)
    assert run_energy(100.0, 60.0, 5.0).net_j == 0.0
    assert run_energy(100.0, None, 5.0).net_j == 100.0
    assert joules_per_token(200.0, 64) == pytest.approx(3.125)
    assert joules_per_token(200.0, 0) is None
