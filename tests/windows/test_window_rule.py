"""The window rule's two forms held against each other: Python (in-memory window), SQL (SQLite, PostgreSQL).

Every kind of run (scheduled or on-demand; nothing set aside, its client tok/s set aside, only a latency set
aside beside a server tok/s; ok with or without a tok/s figure, failed), and runs stored before figures were
judged one by one, under every `schedule.window_includes`: the same runs count, the same samples feed the
same figures, and a run's status counts whatever its client timing.
"""

from __future__ import annotations

import itertools
import time
import typing

import pytest

from tokwatch.figures import stats
from tokwatch.figures.result import RunResult, Status, TimingSource
from tokwatch.figures.series import SeriesKey
from tokwatch.figures.stats import median
from tokwatch.settings.config import Config, EndpointSettings, ScheduleSettings
from tokwatch.storage.base import RunStore
from tokwatch.storage.rows import RunRow
from tokwatch.storage.window import window_figures
from tokwatch.windows.window import MemoryWindows
from tokwatch.windows.window_rule import WINDOW_INCLUDABLE, WindowRule

INCLUDES = [frozenset(c) for n in range(3) for c in itertools.combinations(WINDOW_INCLUDABLE, n)]
# What a client stall did to the run: nothing; set aside its client tok/s; set aside only its TTFT (its tok/s
# came from the server, which no client stall moves).
DISTURBANCE = {
    "clean": ({}, TimingSource.CLIENT_STREAM),
    "tps": ({"tokens_per_second": "client_stall", "ttft": "client_stall"}, TimingSource.CLIENT_STREAM),
    "ttft": ({"ttft": "client_stall"}, TimingSource.ENGINE),
}


def _runs(now: float) -> list[RunResult]:
    """One run of every kind, each ok run with its own tok/s so that a wrong sample moves the median."""
    out = []
    kinds = itertools.product(("scheduled", "on_demand"), DISTURBANCE, ("ok", "ok-no-figure", "timeout"))
    for i, (trigger, disturbance, what) in enumerate(kinds):
        set_aside, source = DISTURBANCE[disturbance]
        ok = what != "timeout"
        out.append(
            RunResult(
                endpoint="a",
                started_at=now - 600 - i * 60,
                status=Status.OK if ok else Status.TIMEOUT,
                tokens_per_second=10.0 + 7 * i if what == "ok" else None,
                ttft_s=0.05 + 0.01 * i if ok else None,
                source=source if what == "ok" else None,
                trigger=typing.cast("typing.Literal['scheduled', 'on_demand']", trigger),
                timing_disturbed=bool(set_aside) and ok,
                set_aside=dict(set_aside) if ok and what == "ok" else {},
            )
        )
    return out


def _legacy(now: float) -> list[RunRow]:
    """Runs stored before figures were judged one by one (`tps_set_aside` NULL): disturbed or not, with a
    client or a server tok/s."""
    out = []
    for i, (disturbed, source) in enumerate(itertools.product((False, True), ("client_stream", "engine"))):
        out.append(
            RunRow(
                run_id=f"legacy-{i}",
                time=now - 300 - i * 60,
                endpoint="legacy",
                status="ok",
                tokens_per_second=50.0 + 5 * i,
                timing_source=source,
                timing_disturbed=disturbed,
            )
        )
    return out


def _is_sample(row: RunRow, include: frozenset[str]) -> bool:
    """The rule written out by hand: an ok run's tok/s, unless set aside (old rows: disturbed and from the
    client) and `window_includes` does not name set-aside figures."""
    if row.status != "ok" or row.tokens_per_second is None:
        return False
    if row.tps_set_aside is None:
        set_aside = row.timing_disturbed and row.timing_source in ("client_stream", "client_wall")
    else:
        set_aside = row.tps_set_aside
    return "timing_disturbed" in include or not set_aside


@pytest.mark.parametrize("include", INCLUDES, ids=lambda i: "+".join(sorted(i)) or "neither")
async def test_python_and_sql_count_the_same_runs(store: RunStore, include: frozenset[str]) -> None:
    now = time.time()
    runs = _runs(now)
    rows = [RunRow.from_result(r) for r in runs]
    legacy = _legacy(now)
    await store.write_runs(rows + legacy)
    rule = WindowRule.of(include)

    for name, these in (("a", rows), ("legacy", legacy)):
        counted_py = sorted(r.time for r in these if rule.counts(r))
        counted_sql = sorted(p.time for p in (await store.recent_runs(0.0, None, rule=rule))[SeriesKey(name)])
        assert counted_sql == pytest.approx(counted_py)
        # only on-demand runs are set aside whole: a run's status counts whatever its client timing
        expected = [r.time for r in these if "on_demand" in include or r.triggered_by == "scheduled"]
        assert counted_py == sorted(expected)
        samples = sorted(v for r in these if rule.counts(r) and (v := rule.sample(r)) is not None)
        assert samples == sorted(
            r.tokens_per_second for r in these if rule.counts(r) and _is_sample(r, include)
        )
        from_store = (await window_figures(store, now, rule=rule))[SeriesKey(name)]
        assert from_store.runs == len(counted_py)
        assert from_store.ok_runs == sum(r.status == "ok" for r in these if rule.counts(r))
        assert from_store.disturbed_runs == sum(r.timing_disturbed for r in these if rule.counts(r))
        assert from_store.tps_set_aside == sum(rule.set_aside(r) for r in these if rule.counts(r))
        assert samples and from_store.median == pytest.approx(median(samples))

    from_store = (await window_figures(store, now, rule=rule))[SeriesKey("a")]
    memory = MemoryWindows()
    memory.configure([_ep("a")], 86400.0, rule)
    for r in runs:
        memory.add(r)
    from_memory = memory.snapshot().figures[SeriesKey("a")]
    assert (from_store.runs, from_store.ok_runs) == (from_memory.runs, from_memory.ok_runs)
    assert (from_store.disturbed_runs, from_store.tps_set_aside) == (
        from_memory.disturbed_runs,
        from_memory.tps_set_aside,
    )
    assert from_store.median == pytest.approx(from_memory.median) and from_memory.median is not None
    assert from_store.stddev == pytest.approx(from_memory.stddev)
    assert from_store.uptime == pytest.approx(from_memory.uptime)
    # the set-aside client tok/s figures are samples exactly when window_includes names them
    tps_aside = [r for r in rows if r.tps_set_aside and rule.counts(r)]
    assert tps_aside and from_store.tps_set_aside == (0 if "timing_disturbed" in include else len(tps_aside))
    assert from_store.decode_percentiles == from_memory.decode_percentiles
    assert from_store.ttft_percentiles == from_memory.ttft_percentiles
    ttft = [v for r in rows if rule.counts(r) and (v := rule.ttft_sample(r)) is not None]
    assert from_store.ttft_percentiles.samples == len(ttft) > 0
    assert from_store.decode_percentiles.p50 == pytest.approx(from_store.median)


async def test_percentiles_agree_between_sql_and_python_from_their_minimum_counts(store: RunStore) -> None:
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
    assert WindowRule().where() == " AND r.triggered_by = 'scheduled'"
    assert WindowRule.of(WINDOW_INCLUDABLE).where("x") == ""
    assert WindowRule().sample_sql("x") == (
        "x.status = 'ok' AND x.tokens_per_second IS NOT NULL AND NOT COALESCE(x.tps_set_aside, "
        "x.timing_disturbed AND x.timing_source IN ('client_stream', 'client_wall'), FALSE)"
    )
    assert WindowRule.of(["timing_disturbed"]).sample_sql("x") == (
        "x.status = 'ok' AND x.tokens_per_second IS NOT NULL"
    )


def _ep(name: str) -> EndpointSettings:
    return EndpointSettings(name=name, kind="openai", base_url="http://127.0.0.1:1/v1", model="m")


@pytest.mark.parametrize(
    "include", [frozenset(), frozenset({"timing_disturbed"})], ids=["default", "included"]
)
async def test_prefill_median_leaves_out_a_prefill_set_aside_with_its_ttft(
    store: RunStore, include: frozenset[str]
) -> None:
    """A client prefill figure divides by the TTFT: set aside with it, it is no sample of the prefill
    median (unless window_includes names set-aside figures); a cache-assisted run never is. Store and memory
    agree."""
    now = time.time()
    runs = [
        RunResult(endpoint="a", started_at=now - 300, status=Status.OK, prefill_tokens_per_second=100.0),
        RunResult(
            endpoint="a",
            started_at=now - 200,
            status=Status.OK,
            prefill_tokens_per_second=200.0,
            timing_disturbed=True,
            set_aside={"ttft": "client_stall", "prefill": "client_stall"},
        ),
        RunResult(
            endpoint="a",
            started_at=now - 100,
            status=Status.OK,
            prefill_tokens_per_second=900.0,
            cache_assisted=True,
        ),
    ]
    await store.write_runs([RunRow.from_result(r) for r in runs])
    rule = WindowRule.of(include)
    from_store = (await window_figures(store, now, rule=rule))[SeriesKey("a")]
    memory = MemoryWindows()
    memory.configure([_ep("a")], 86400.0, rule)
    for r in runs:
        memory.add(r)
    from_memory = memory.snapshot().figures[SeriesKey("a")]
    expected = (2, 150.0) if include else (1, 100.0)
    assert (from_store.prefill_runs, from_store.prefill_median) == expected
    assert (from_memory.prefill_runs, from_memory.prefill_median) == expected
