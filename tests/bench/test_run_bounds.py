"""The bounds of a bench run's published latency figures (tokwatch.bench.run_bounds): sound against any true
values within the requests' own bounds, and only as loose as those bounds make them."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from tokwatch.bench.aggregate import metric_values, summarize
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.run_bounds import run_figure_bounds


def _late(r: RequestRecord, ttft_late: float, gap_late: list[float] | None = None) -> RequestRecord:
    """A record whose TTFT stamp (and E2E, TPOT with it) can be up to `ttft_late` late, and each gap by
    `gap_late`'s (down, up)."""
    r.max_stall_s = r.stamp_lateness_s = max(ttft_late, *(gap_late or [0.0]))
    r.ttft_error_s = r.e2e_error_s = ttft_late
    r.tpot_error_s = ttft_late / max(1, len(r.tbt_s))
    if gap_late is not None:
        r.tbt_down_s = [min(g, lat) for g, lat in zip(r.tbt_s, gap_late, strict=True)]
        r.tbt_up_s = list(gap_late)
    return r


@pytest.mark.parametrize("seed", range(20))
def test_the_true_figures_lie_within_the_bounds(make_record: Callable[..., RequestRecord], seed: int) -> None:
    # Measured values and their bounds at random; true values anywhere within each request's bounds (their
    # extremes included): every published mean and percentile of the truth is within its bound.
    rng = random.Random(seed)
    measured = []
    for i in range(rng.randint(1, 60)):
        r = make_record(
            i, ttft=rng.uniform(0.001, 0.2), gap=rng.uniform(0.001, 0.02), tokens=rng.randint(2, 9)
        )
        r.tbt_s = [g * rng.uniform(0.0, 2.0) for g in r.tbt_s]
        lateness = [rng.choice((0.0, rng.uniform(0.0, 0.02))) for _ in r.tbt_s]
        measured.append(_late(r, rng.choice((0.0, rng.uniform(0.0, 0.05))), lateness))
    truth = []
    for r in measured:
        t = make_record(r.request_id)
        pick = rng.choice((0.0, 1.0, rng.random()))
        t.ttft_s = (r.ttft_s or 0.0) - (r.ttft_error_s or 0.0) * pick
        t.e2e_s = (r.e2e_s or 0.0) - (r.e2e_error_s or 0.0) * rng.random()
        t.tpot_s = (r.tpot_s or 0.0) + (r.tpot_error_s or 0.0) * rng.uniform(-1.0, 1.0)
        t.tbt_s = [
            g + rng.choice((-d, u, rng.uniform(-d, u)))
            for g, d, u in zip(r.tbt_s, r.tbt_down_s, r.tbt_up_s, strict=True)
        ]
        truth.append(t)
    bounds = run_figure_bounds(measured)
    assert {b.metric for b in bounds} == {"ttft", "tbt", "tpot", "e2e"}  # no think phase: no TTOT
    for b in bounds:
        true = summarize(metric_values(truth, b.metric))[b.stat]
        assert true is not None and abs(true - b.value) <= b.bound + 1e-12, (b, true)


def test_loose_requests_outside_the_tail_leave_the_percentiles_exact(
    make_record: Callable[..., RequestRecord],
) -> None:
    # A fifth of the requests could be 20 ms late, but their TTFT is no higher than the others': the median
    # and the tail are exact, the mean is off by at most a fifth of 20 ms.
    records = [make_record(i, ttft=0.1) for i in range(40)]
    for r in records[:8]:
        _late(r, 0.02)
    for r in records[8:]:
        _late(r, 0.0)
    ttft = {b.stat: b for b in run_figure_bounds(records) if b.metric == "ttft"}
    assert [ttft[s].bound for s in ("p50", "p90", "p95", "p99")] == [0.0] * 4
    assert ttft["mean"].bound == pytest.approx(0.004) and not ttft["mean"].beyond


def test_late_requests_in_the_tail_move_it_beyond_tolerance(
    make_record: Callable[..., RequestRecord],
) -> None:
    # Ten of forty requests measured 20 ms slower, by at most their own lateness: the tail may be that late.
    records = [_late(make_record(i, ttft=0.1), 0.0) for i in range(30)]
    records += [_late(make_record(i, ttft=0.12), 0.02) for i in range(30, 40)]
    ttft = {b.stat: b for b in run_figure_bounds(records) if b.metric == "ttft"}
    assert ttft["p99"].value == pytest.approx(0.12) and ttft["p99"].bound == pytest.approx(0.02)
    assert ttft["p99"].beyond and ttft["p99"].limit == pytest.approx(0.006)  # 5 % of 120 ms
    assert ttft["p50"].bound == 0.0 and not ttft["p50"].beyond


def test_gaps_are_bounded_both_ways_and_small_figures_by_the_floor(
    make_record: Callable[..., RequestRecord],
) -> None:
    # 2 ms gaps, each of which may be 1.5 ms longer: beyond the 1 ms floor; 0.5 ms longer: within it.
    loose = [_late(make_record(i, gap=0.002, tokens=5), 0.0, [0.0015] * 4) for i in range(10)]
    tbt = {b.stat: b for b in run_figure_bounds(loose) if b.metric == "tbt"}
    assert tbt["p50"].bound == pytest.approx(0.0015) and tbt["p50"].limit == 0.001 and tbt["p50"].beyond
    tight = [_late(make_record(i, gap=0.002, tokens=5), 0.0, [0.0005] * 4) for i in range(10)]
    assert not any(b.beyond for b in run_figure_bounds(tight))


def test_a_run_without_watched_requests_is_not_judged(make_record: Callable[..., RequestRecord]) -> None:
    assert run_figure_bounds([make_record(i) for i in range(5)]) == []
