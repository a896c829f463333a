"""The window rule's two forms held against each other: Python (in-memory window), SQL (SQLite, PostgreSQL).

Every kind of run (scheduled or on-demand, disturbed or not, ok with or without a tok/s figure, failed) under
every `schedule.window_includes`: the same runs count, the same samples feed the same figures.
"""

from __future__ import annotations

import itertools
import time
import typing

import pytest

from tokwatch import stats
from tokwatch.config import Config, EndpointSettings, ScheduleSettings
from tokwatch.result import RunResult, Status, TimingSource
from tokwatch.series import SeriesKey
from tokwatch.storage.base import Store
from tokwatch.storage.rows import RunRow
from tokwatch.storage.window import window_figures
from tokwatch.window import MemoryWindows
from tokwatch.window_rule import WINDOW_INCLUDABLE, WindowRule

INCLUDES = [frozenset(c) for n in range(3) for c in itertools.combinations(WINDOW_INCLUDABLE, n)]


def _runs(now: float) -> list[RunResult]:
    """One run of every kind, each ok run with its own tok/s so that a wrong sample moves the median."""
    out = []
    kinds = itertools.product(("scheduled", "on_demand"), (False, True), ("ok", "ok-no-figure", "timeout"))
    for i, (trigger, disturbed, what) in enumerate(kinds):
        ok = what != "timeout"
        out.append(
            RunResult(
                endpoint="a",
                started_at=now - 600 - i * 60,
                status=Status.OK if ok else Status.TIMEOUT,
                tokens_per_second=10.0 + 7 * i if what == "ok" else None,
                ttft_s=0.05 + 0.01 * i if ok else None,
                source=TimingSource.ENGINE if what == "ok" else None,
                trigger=typing.cast("typing.Literal['scheduled', 'on_demand']", trigger),
                timing_disturbed=disturbed,
            )
        )
    return out


@pytest.mark.parametrize("include", INCLUDES, ids=lambda i: "+".join(sorted(i)) or "neither")
async def test_python_and_sql_count_the_same_runs(store: Store, include: frozenset[str]) -> None:
    now = time.time()
    runs = _runs(now)
    rows = [RunRow.from_result(r) for r in runs]
    await store.write_runs(rows)
    rule = WindowRule.of(include)

    counted_py = sorted(r.time for r in rows if rule.counts(r))
    counted_sql = sorted(p.time for p in (await store.recent_runs(0.0, None, rule=rule))[SeriesKey("a")])
    assert counted_sql == pytest.approx(counted_py)
    # the rule sets aside exactly what is not included, and nothing else
    expected = [
        r.time
        for r in rows
        if ("on_demand" in include or r.triggered_by == "scheduled")
        and ("timing_disturbed" in include or not r.timing_disturbed)
    ]
    assert counted_py == sorted(expected)

    from_store = (await window_figures(store, now, rule=rule))[SeriesKey("a")]
    memory = MemoryWindows()
    memory.configure([_ep("a")], 86400.0, rule)
    for r in runs:
        memory.add(r)
    from_memory = memory.snapshot().figures[SeriesKey("a")]
    samples = sorted(v for r in rows if rule.counts(r) and (v := rule.sample(r)) is not None)
    assert (from_store.runs, from_store.ok_runs) == (from_memory.runs, from_memory.ok_runs)
    assert from_store.runs == len(counted_py)
    assert from_store.ok_runs == sum(r.status == "ok" for r in rows if rule.counts(r))
    assert from_store.median == pytest.approx(from_memory.median) and from_memory.median is not None
    assert from_store.stddev == pytest.approx(from_memory.stddev)
    assert from_store.uptime == pytest.approx(from_memory.uptime)
    assert len(samples) == sum(1 for r in rows if rule.counts(r) and r.tokens_per_second is not None)
    assert from_store.decode_percentiles == from_memory.decode_percentiles
    assert from_store.ttft_percentiles == from_memory.ttft_percentiles
    ttft = [v for r in rows if rule.counts(r) and (v := rule.ttft_sample(r)) is not None]
    assert from_store.ttft_percentiles.samples == len(ttft) > 0
    assert from_store.decode_percentiles.p50 == pytest.approx(from_store.median)


async def test_percentiles_agree_between_sql_and_python_from_their_minimum_counts(store: Store) -> None:
    """120 runs: p50 and p90 from 10 samples, p99 only from 100; the store's SQL (percentile_cont on
    PostgreSQL) and the in-memory window give the same values over every configured window."""
    now = time.time()
    runs = [
        RunResult(
            endpoint="a",
            started_at=now - 30 - i * 60,  # no run on a window boundary
            status=Status.OK,
            tokens_per_second=50.0 + (i * 37) % 101,
            source=TimingSource.ENGINE,
            ttft_s=0.1 + ((i * 13) % 29) / 100,
            prompt_tokens=1000,
            prefill_tokens_per_second=1000.0 + (i * 7) % 53,
        )
        for i in range(120)
    ]
    await store.write_runs([RunRow.from_result(r) for r in runs])
    memory = MemoryWindows()
    memory.configure([_ep("a")], 86400.0, WindowRule(), windows=(1800.0, 3 * 3600.0))
    for r in runs:
        memory.add(r)
    snap = memory.snapshot()
    assert list(snap.windows) == ["30m", "3h", "24h"]
    for seconds, label, n in ((1800.0, "30m", 30), (3 * 3600.0, "3h", 120), (86400.0, "24h", 120)):
        stored = (await window_figures(store, now, rule=WindowRule(), window_s=seconds))[SeriesKey("a")]
        kept = snap.windows[label][SeriesKey("a")]
        assert stored.window == kept.window == label
        for attr in ("decode_percentiles", "prefill_percentiles", "ttft_percentiles"):
            got, want = getattr(stored, attr), getattr(kept, attr)
            assert got.samples == want.samples == n
            assert got.values == pytest.approx(want.values)
            assert (got.p90 is not None) == (n >= 10) and (got.p99 is not None) == (n >= 100)
        tps = sorted(r.tokens_per_second or 0.0 for r in runs if r.started_at >= now - seconds)
        assert stored.decode_percentiles.p50 == pytest.approx(stats.median(tps))


def test_the_rule_knows_the_names_the_config_accepts() -> None:
    field = ScheduleSettings.model_fields["window_includes"].annotation
    literal = typing.get_args(field)[0]
    assert typing.get_args(literal) == WINDOW_INCLUDABLE
    config = Config(schedule={"window_includes": ["on_demand"]})  # type: ignore[arg-type]
    assert WindowRule.of(config.schedule.window_includes) == WindowRule(frozenset({"on_demand"}))
    with pytest.raises(ValueError, match="window_includes: unknown cached"):
        WindowRule.of(["cached"])


def test_the_sql_form() -> None:
    assert WindowRule().where() == " AND r.triggered_by = 'scheduled' AND NOT r.timing_disturbed"
    assert WindowRule.of(WINDOW_INCLUDABLE).where("x") == ""
    assert WindowRule().sample_sql("x") == "x.status = 'ok' AND x.tokens_per_second IS NOT NULL"


def _ep(name: str) -> EndpointSettings:
    return EndpointSettings(name=name, kind="openai", base_url="http://127.0.0.1:1/v1", model="m")
