"""Runs stored per series (endpoint x workload x site), on SQLite and a real PostgreSQL alike: window figures
keyed by series with the prefill median, the runs counted apart, last and recent runs by site and workload,
the hourly rollup per series, and a probe result's new fields through the row."""

from __future__ import annotations

import time

import pytest

from tokwatch.figures.result import PrefillSource, RunResult, Status, TimingSource
from tokwatch.figures.series import SeriesKey
from tokwatch.storage.base import RunStore
from tokwatch.storage.rows import RunRow
from tokwatch.storage.window import window_figures
from tokwatch.windows.window_rule import WindowRule

NOW = time.time() // 3600 * 3600 + 1800  # mid-hour: every run below falls in two known hours


def _row(ep: str, t: float, workload: str = "seed000", site: str = "", **kw: object) -> RunRow:
    fields: dict[str, object] = {"status": "ok", "tokens_per_second": 50.0, "timing_source": "engine"}
    fields.update(kw)
    run_id = f"{ep}-{workload}-{site}-{t}"
    return RunRow(run_id=run_id, time=t, endpoint=ep, workload=workload, site=site, **fields)  # type: ignore[arg-type]


async def test_window_figures_are_kept_apart_per_workload_and_site(store: RunStore) -> None:
    rows = [_row("a", NOW - 60 * i, tokens_per_second=100.0 + i) for i in range(3)]  # seed000, no site
    rows += [
        _row("a", NOW - 60 * i, "long", "eu", tokens_per_second=40.0, prefill_tokens_per_second=p)
        for i, p in enumerate((2000.0, 2200.0, 2400.0))
    ]
    # a cache-assisted long run: its decode counts, its prefill is counted apart
    flagged = {"cache_assisted": True, "cached_tokens": 9000, "prompt_size_missed": True}
    rows.append(_row("a", NOW - 200, "long", "eu", prefill_tokens_per_second=9000.0, **flagged))
    rows += [_row("a", NOW - 60 * i, "long", "us", prefill_tokens_per_second=1000.0) for i in range(2)]
    rows.append(_row("a", NOW - 300, "long", "us", status="timeout", tokens_per_second=None))
    assert await store.write_runs(rows) == len(rows)

    stats = await store.window_stats(NOW - 3600, NOW + 1, rule=WindowRule())
    assert set(stats) == {SeriesKey("a"), SeriesKey("a", "long", "eu"), SeriesKey("a", "long", "us")}
    seed = stats[SeriesKey("a")]
    assert (seed.runs, seed.median, seed.prefill_samples, seed.prefill_median) == (3, 101.0, 0, None)
    eu = stats[SeriesKey("a", "long", "eu")]
    assert (eu.runs, eu.ok_runs, eu.tps_samples) == (4, 4, 4)
    assert (eu.prefill_samples, eu.prefill_median) == (3, 2200.0)  # the cache-assisted 9000 left out
    assert (eu.cache_assisted, eu.prompt_size_missed) == (1, 1)
    us = stats[SeriesKey("a", "long", "us")]
    assert (us.runs, us.ok_runs, us.prefill_median, us.site) == (3, 2, 1000.0, "us")

    only_eu = await store.window_stats(NOW - 3600, NOW + 1, rule=WindowRule(), site="eu")
    assert set(only_eu) == {SeriesKey("a", "long", "eu")}
    figures = await window_figures(store, NOW + 1, rule=WindowRule(), site="us")
    fig = figures[SeriesKey("a", "long", "us")]
    assert (fig.workload, fig.site, fig.uptime, fig.prefill_median) == ("long", "us", 2 / 3, 1000.0)


async def test_last_and_recent_runs_per_series(store: RunStore) -> None:
    await store.write_runs(
        [
            _row("a", NOW - 100, cached_tokens=24, prompt_tokens=49),
            _row("a", NOW - 50, "long", "eu", prompt_tokens=10012, prefill_tokens_per_second=2100.0),
            _row("a", NOW - 10, "long", "us", status="timeout", tokens_per_second=None),
            _row("b", NOW - 20, site="us"),
        ]
    )
    last = await store.last_runs(0.0)
    long_eu, long_us = SeriesKey("a", "long", "eu"), SeriesKey("a", "long", "us")
    b_us = SeriesKey("b", site="us")
    assert set(last) == {SeriesKey("a"), long_eu, long_us, b_us}
    us = last[long_us]
    assert (us.status, us.ok_time, us.workload, us.site) == ("timeout", None, "long", "us")
    assert set(await store.last_runs(0.0, site="us")) == {long_us, b_us}

    recent = await store.recent_runs(0.0, None, endpoint="a", workload="long")
    assert set(recent) == {long_eu, long_us}
    (point,) = recent[long_eu]
    assert (point.workload, point.site, point.prompt_tokens) == ("long", "eu", 10012)
    assert point.prefill_tokens_per_second == 2100.0
    assert not point.cache_assisted and not point.prompt_size_missed
    (seed,) = (await store.recent_runs(0.0, None, endpoint="a", workload="seed000", site=""))[SeriesKey("a")]
    assert seed.cached_tokens == 24 and seed.prompt_tokens == 49


async def test_hourly_rollup_is_per_series_with_the_prefill_median(store: RunStore) -> None:
    await store.write_runs(
        [_row("a", NOW - 60 * i, "long", "eu", prefill_tokens_per_second=1000.0 * (i + 1)) for i in range(3)]
        + [_row("a", NOW - 60, tokens_per_second=80.0)]
    )
    rows = {(h["workload"], h["site"]): h for h in await store.hourly(NOW - 3600, NOW + 3600)}
    assert set(rows) == {("long", "eu"), ("seed000", "")}
    assert rows[("long", "eu")]["runs"] == 3 and rows[("long", "eu")]["prefill_tps_median"] == 2000.0
    assert rows[("seed000", "")]["tps_median"] == 80.0 and rows[("seed000", "")]["prefill_tps_median"] is None


async def test_a_probe_result_keeps_its_series_prompt_and_prefill_through_the_store(store: RunStore) -> None:
    result = RunResult(endpoint="a", started_at=NOW - 5, status=Status.OK, tokens_per_second=42.0)
    result.source, result.workload, result.site = TimingSource.ENGINE, "medium", "office"
    result.prompt_tokens, result.prompt_target_tokens, result.prompt_words = 1003, 1000, 760
    result.cached_tokens, result.prefill_source = 16, PrefillSource.CLIENT_TTFT
    result.prefill_tokens_per_second = 3100.0
    row = RunRow.from_result(result)
    assert RunRow.from_json(row.to_json()) == row  # the outbox keeps them too
    await store.write_runs([row])
    key = SeriesKey("a", "medium", "office")
    (point,) = (await store.recent_runs(0.0, None))[key]
    assert (point.prompt_tokens, point.cached_tokens, point.prefill_tokens_per_second) == (1003, 16, 3100.0)
    stats = (await store.window_stats(NOW - 60, NOW, rule=WindowRule()))[key]
    assert stats.prefill_median == pytest.approx(3100.0)
