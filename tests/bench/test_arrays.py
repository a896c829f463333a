"""The numpy forms of the bench's statistics give what the pure-Python implementations gave.

Percentiles bit for bit (`tokwatch.figures.stats.percentile`, the definition), summaries and throughput
windows
against the code they replaced (copied here), and `bench compare`'s bootstrap against a plain per-resample
computation with the same draws.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import numpy as np
import pytest

from tests.support.replaced_stats import old_summarize
from tokwatch.bench import arrays
from tokwatch.bench.aggregate import Window, summarize, throughput, window_throughput
from tokwatch.bench.compare import FIGURES, STATS, Run, compare
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures.stats import percentile, percentile_sorted

QS = [0, 0.1, 1, 2.5, 10, 25, 33.3, 50, 90, 95, 97.5, 99, 99.9, 100]


def _samples(rng: random.Random) -> list[float]:
    n = rng.choice([1, 2, 3, 7, 100, 1001, 5000])
    kind = rng.choice(["uniform", "lognormal", "ties", "tiny"])
    if kind == "uniform":
        return [rng.random() for _ in range(n)]
    if kind == "lognormal":
        return [rng.lognormvariate(-5, 2) for _ in range(n)]
    if kind == "ties":
        return [rng.choice([0.0, 0.001, 0.002, 1e9]) for _ in range(n)]
    return [rng.random() * 1e-300 for _ in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_percentiles_are_bit_for_bit_the_pure_python_ones(seed: int) -> None:
    values = _samples(random.Random(seed))
    data = sorted(values)
    assert arrays.percentiles_sorted(arrays.as_sorted(values), QS) == [percentile_sorted(data, q) for q in QS]


def test_percentile_of_nothing_raises_like_the_pure_python_one() -> None:
    with pytest.raises(ValueError, match="empty"):
        arrays.percentiles_sorted(arrays.as_sorted([]), [50])


@pytest.mark.parametrize("seed", range(40))
def test_summaries_equal_the_old_implementation(seed: int) -> None:
    values = _samples(random.Random(seed))
    new, old = summarize(values), old_summarize(values)
    std_new, std_old = new.pop("std"), old.pop("std")
    assert new == old  # count, mean (an exactly rounded sum either way), min, max, every percentile
    # x*x is correctly rounded; the old (x - mean) ** 2 went through pow(): a last-bit difference at most
    assert std_new == pytest.approx(std_old, rel=1e-14, abs=1e-300)
    assert summarize([]) == old_summarize([])


def _records(seed: int, n: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = RequestRecord(i, "chat", warmup=i < 3, sent_at_s=i * 0.01)
        r.ttft_s = rng.random() * 0.1
        r.tbt_s = [rng.random() * 0.02 for _ in range(rng.randint(0, 40))]
        r.completed_at_s = r.sent_at_s + r.ttft_s + sum(r.tbt_s)
        r.output_tokens = len(r.tbt_s) + 1
        out.append(r)
    return out


def _old_window_tokens(records: Sequence[RequestRecord], window: Window) -> int:
    measured = [r for r in records if not r.warmup]
    return sum(1 for r in measured for t in r.token_times_s() if window.start <= t <= window.end)


@pytest.mark.parametrize("seed", range(10))
def test_throughput_windows_count_the_tokens_the_old_way(seed: int) -> None:
    records = _records(seed, 300)
    # windows whose edges sit exactly on token times, as well as anywhere
    edges = [*[t for r in records[:20] for t in r.token_times_s()][:30], 0.0, 0.5, 1.7, 5.0]
    for start, end in itertools.product(edges[::3], edges[1::4]):
        window = Window(start, end)
        assert window_throughput(records, window)["tokens_received"] == _old_window_tokens(records, window)
    figures = throughput(records, 4.0)
    for key in ("overall", "last_30s", "steady_state"):
        w = Window(figures[key]["window_start_s"], figures[key]["window_end_s"])
        assert figures[key]["tokens_received"] == _old_window_tokens(records, w)


def _groups(rng: random.Random, n: int, lists: bool) -> list[list[float]]:
    if not lists:
        return [[rng.lognormvariate(-3, 1)] for _ in range(n)]
    return [[rng.random() * 0.05 for _ in range(rng.choice([0, 1, 5, 30]))] for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_a_resample_percentile_equals_sorting_the_resample(seed: int) -> None:
    rng = random.Random(seed)
    groups = _groups(rng, rng.choice([1, 2, 50, 400]), lists=seed % 2 == 0)
    g = arrays.Groups(groups)
    everything = [v for grp in groups for v in grp]
    assert g.percentiles(QS) == ([percentile(everything, q) for q in QS] if everything else None)
    draws_rng = np.random.default_rng(seed)
    for _ in range(20):
        draws = draws_rng.integers(0, len(groups), len(groups))
        resample = [v for i in draws for v in groups[int(i)]]
        expected = [percentile(resample, q) for q in QS] if resample else None
        assert g.resampled(draws, QS) == expected


def _run(name: str, rng: random.Random, n: int, scale: float) -> Run:
    values = {f: _groups(rng, n, lists=FIGURES[f][1]) for f in FIGURES}
    values = {f: [[v * scale for v in grp] for grp in gs] for f, gs in values.items()}
    return Run(name, values, None)


def test_the_bootstrap_is_the_plain_definition_with_the_same_draws() -> None:
    rng = random.Random(5)
    a, b = _run("a", rng, 60, 1.0), _run("b", rng, 45, 1.2)
    rows = compare(a, b, resamples=50, seed=11, gate=[("ttft", "p50")])
    # the same computation written out: each resample draws A's then B's requests, every statistic from it
    draws = np.random.default_rng(11)
    qs = list(STATS.values())
    expected = {}
    for figure in FIGURES:
        ga, gb = a.values[figure], b.values[figure]
        flat_a, flat_b = [v for g in ga for v in g], [v for g in gb for v in g]
        boot = []
        for _ in range(50):
            ra = [v for i in draws.integers(0, len(ga), len(ga)) for v in ga[int(i)]]
            rb = [v for i in draws.integers(0, len(gb), len(gb)) for v in gb[int(i)]]
            if ra and rb:
                boot.append(([percentile(ra, q) for q in qs], [percentile(rb, q) for q in qs]))
        for i, stat in enumerate(STATS):
            col_a = [x[i] for x, _ in boot]
            col_b = [y[i] for _, y in boot]
            diffs = [y - x for x, y in zip(col_a, col_b, strict=True)]
            expected[figure, stat] = (
                percentile(flat_a, qs[i]),
                (percentile(col_a, 2.5), percentile(col_a, 97.5)),
                percentile(flat_b, qs[i]),
                (percentile(col_b, 2.5), percentile(col_b, 97.5)),
                (percentile(diffs, 2.5), percentile(diffs, 97.5)),
            )
    assert {(r.figure, r.stat): (r.a, r.a_ci, r.b, r.b_ci, r.diff_ci) for r in rows} == expected
    assert [r.gated for r in rows].count(True) == 1
    assert compare(a, b, resamples=50, seed=11) == compare(a, b, resamples=50, seed=11)  # seeded: repeatable
