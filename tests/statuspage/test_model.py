"""Status page figures from a real store (SQLite and PostgreSQL): tiles, ranking, daily history, incidents."""

from __future__ import annotations

import pytest

from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.statuspage.model import (
    HEADLINE_LOOKBACK,
    HISTORY_DAYS,
    SPARK_RUNS,
    build_endpoint_page,
    build_overview,
    day_start,
    incidents,
)
from tokwatch.statuspage.render import render_overview
from tokwatch.storage.base import EndpointSpec, RunPoint, RunStore
from tokwatch.storage.rows import RunRow

NOW = 1_790_000_000.0  # fixed clock: a Wednesday, mid-day UTC
HOUR = 3600.0


def _ep(name: str, **kw: object) -> EndpointSettings:
    return EndpointSettings(name=name, kind="openai", base_url="http://127.0.0.1:1/v1", model="m", **kw)  # type: ignore[arg-type]


def _row(ep: str, t: float, status: str = "ok", tps: float | None = 50.0, **kw: object) -> RunRow:
    fields: dict[str, object] = {"timing_source": "engine" if status == "ok" else None, **kw}
    return RunRow(
        run_id=f"{ep}-{t}",
        time=t,
        endpoint=ep,
        status=status,
        tokens_per_second=tps if status == "ok" else None,
        **fields,  # type: ignore[arg-type]
    )


# A run whose client tok/s a client stall moved beyond the tolerance (set aside; its status counts).
SET_ASIDE: dict[str, object] = {
    "timing_disturbed": True,
    "tps_set_aside": True,
    "set_aside": "tokens_per_second",
    "timing_source": "client_stream",
}


async def test_tiles_cover_every_endpoint_and_keep_the_last_ok_run_during_an_incident(
    store: RunStore,
) -> None:
    config = Config(endpoints=(_ep("fast"), _ep("slow"), _ep("broken"), _ep("never-probed")))
    await store.sync_endpoints([EndpointSpec(e.name) for e in config.endpoints])
    rows = [_row("fast", NOW - i * HOUR - 60, tps=100.0 + i % 2) for i in range(30)]
    rows += [_row("slow", NOW - i * HOUR - 60, tps=80.0) for i in range(30)]
    # broken: ok runs a day ago, then failures only (an incident still ongoing)
    rows += [_row("broken", NOW - 30 * HOUR - i * HOUR, tps=40.0) for i in range(5)]
    rows += [
        _row(
            "broken", NOW - i * HOUR - 60, status="timeout", error_class="timeout", error_message="no answer"
        )
        for i in range(3)
    ]
    assert await store.write_runs(rows) == len(rows)

    ov = await build_overview(store, config, NOW)
    tiles = {t.endpoint.name: t for t in ov.tiles}
    assert list(tiles) == ["fast", "slow", "broken", "never-probed"]
    assert tiles["never-probed"].last is None and tiles["never-probed"].spark == []
    broken = tiles["broken"]
    assert broken.status == "timeout"
    assert broken.last is not None and broken.last.ok_tokens_per_second == pytest.approx(40.0)
    assert broken.last.ok_timing_source == "engine"
    assert broken.day is not None and broken.day.uptime == 0.0 and broken.day.median is None
    fast = tiles["fast"]
    assert fast.day is not None and fast.day.runs == 24 and fast.day.uptime == 1.0
    assert fast.day.median == pytest.approx(100.5) and fast.day.cv is not None and fast.day.cv < 0.05
    assert len(fast.spark) == 30 and fast.spark[0].time < fast.spark[-1].time  # oldest first
    # ranking by 7-day median, fastest first; pairs compare neighbours
    assert [name for name, _ in ov.ranking.ranked] == ["fast", "slow", "broken"]
    assert ov.unranked == ["never-probed"]
    pairs = [(c.fastest, c.slowest, round(c.percent_faster)) for c in ov.ranking.neighbours()]
    assert pairs == [("fast", "slow", 26), ("slow", "broken", 100)]


async def test_sparkline_holds_the_last_runs_that_count_in_figures(store: RunStore) -> None:
    config = Config(endpoints=(_ep("a"),))
    rows = [_row("a", NOW - 60.0 - i * 60.0) for i in range(SPARK_RUNS + 10)]
    rows.append(_row("a", NOW - 30.0, tps=999.0, triggered_by="on_demand"))
    rows.append(_row("a", NOW - 20.0, tps=998.0, **SET_ASIDE))
    await store.write_runs(rows)
    ov = await build_overview(store, config, NOW + 1)
    spark = ov.tiles[0].spark
    assert len(spark) == SPARK_RUNS
    # on-demand left out by default; the run whose tok/s was set aside counts, as an ok run without a figure
    assert all(p.tokens_per_second == 50.0 for p in spark[:-1])
    assert (spark[-1].time, spark[-1].status, spark[-1].tokens_per_second) == (NOW - 20.0, "ok", None)
    # the headline takes the same runs as the sparkline and the 24 h figures beside it...
    headline = ov.tiles[0].headline
    assert headline is not None and headline.tokens_per_second == 50.0 and headline.time == NOW - 60.0
    day = ov.tiles[0].day
    assert day is not None and day.median == 50.0 and (day.disturbed_runs, day.tps_set_aside) == (1, 1)
    # ...while the status pill is the newest run of any kind
    last = ov.tiles[0].last
    assert last is not None and last.time == NOW - 20.0

    included = Config(endpoints=(_ep("a"),), schedule={"window_includes": ["on_demand", "timing_disturbed"]})  # type: ignore[arg-type]
    tile = (await build_overview(store, included, NOW + 1)).tiles[0]
    assert [p.tokens_per_second for p in tile.spark[-2:]] == [999.0, 998.0]
    assert tile.headline is not None and tile.headline.tokens_per_second == 998.0
    on_demand = Config(endpoints=(_ep("a"),), schedule={"window_includes": ["on_demand"]})  # type: ignore[arg-type]
    tile = (await build_overview(store, on_demand, NOW + 1)).tiles[0]
    assert tile.headline is not None and tile.headline.tokens_per_second == 999.0


async def test_headline_survives_an_incident_longer_than_the_sparkline(store: RunStore) -> None:
    """The last ok run that counts is found however far back it is; on-demand or disturbed ok runs during
    the incident do not replace it, and an endpoint whose only ok runs are on-demand has no headline."""
    names = ("down", "probed-only", "never-ok", "paused", "probe-driven")
    config = Config(endpoints=tuple(_ep(n) for n in names))
    await store.sync_endpoints([EndpointSpec(e.name) for e in config.endpoints])
    incident = 3 * HEADLINE_LOOKBACK  # hourly failures: far beyond the sparkline and the 7-day window
    rows = [_row("down", NOW - (incident + 10 - i) * HOUR, tps=60.0 + i) for i in range(3)]
    rows += [
        _row("down", NOW - (incident - i) * HOUR, status="unreachable", error_class="connect")
        for i in range(incident)
    ]
    rows.append(_row("down", NOW - 2 * HOUR + 600, tps=500.0, triggered_by="on_demand"))
    rows.append(_row("down", NOW - 3 * HOUR + 600, tps=400.0, **SET_ASIDE))
    rows.append(_row("probed-only", NOW - HOUR, tps=70.0, triggered_by="on_demand"))
    rows.append(_row("probed-only", NOW - 30.0, status="timeout", error_class="timeout"))
    rows.append(_row("never-ok", NOW - 30.0, status="auth_failure", error_class="http_401"))
    rows += [_row("paused", NOW - 10 * 86400 - i * HOUR, tps=33.0 - i) for i in range(3)]  # nothing since
    rows.append(_row("probe-driven", NOW - 60.0, tps=90.0, triggered_by="on_demand"))  # /probe only
    assert await store.write_runs(rows) == len(rows)

    tiles = {t.endpoint.name: t for t in (await build_overview(store, config, NOW)).tiles}
    down = tiles["down"]
    assert down.status == "unreachable"
    # the incident, and the ok run whose tok/s a client stall set aside: its status counts, its figure not
    assert [p.time for p in down.spark if p.status != "unreachable"] == [NOW - 3 * HOUR + 600]
    assert all(p.tokens_per_second is None for p in down.spark)
    assert down.headline is not None and down.headline.tokens_per_second == 62.0
    assert down.headline.time == NOW - (incident + 8) * HOUR and down.headline.timing_source == "engine"
    assert down.last is not None and down.last.ok_tokens_per_second == 500.0  # what the old headline showed
    assert tiles["probed-only"].headline is None and tiles["probed-only"].status == "timeout"
    assert tiles["never-ok"].headline is None and tiles["never-ok"].status == "auth_failure"
    paused = tiles["paused"]
    assert paused.spark == [] and paused.headline is not None and paused.headline.tokens_per_second == 33.0
    assert tiles["probe-driven"].headline is None and tiles["probe-driven"].status == "ok"

    html = render_overview(await build_overview(store, config, NOW), config)
    assert '<span class="tps">62.0</span> tok/s' in html and "500.0" not in html
    assert html.count("no ok run yet") == 3


async def test_endpoint_page_keeps_one_history_across_a_rename(store: RunStore) -> None:
    await store.sync_endpoints([EndpointSpec("old")])
    day0 = day_start(NOW)
    old_rows = [_row("old", day0 - 10 * 86400 + i * HOUR, tps=60.0) for i in range(4)]
    await store.write_runs(old_rows)
    await store.sync_endpoints([EndpointSpec("new", ("old",))])
    new_rows = [
        _row("new", day0 - 86400 + 0 * HOUR, tps=70.0),
        _row(
            "new",
            day0 - 86400 + 1 * HOUR,
            status="provider_error",
            error_class="http_500",
            error_message="boom",
        ),
        _row("new", day0 - 86400 + 2 * HOUR, status="timeout", error_class="timeout"),
        _row("new", day0 - 86400 + 3 * HOUR, tps=72.0),
        _row("new", day0 + 60, status="unreachable", error_class="connect"),
    ]
    await store.write_runs(new_rows)
    ep = _ep("new", renamed_from=("old",))
    page = await build_endpoint_page(store, Config(endpoints=(ep,)), ep, NOW)

    assert len(page.days) == HISTORY_DAYS and page.days[-1].start == day0
    by_day = {d.start: d for d in page.days}
    assert by_day[day0 - 10 * 86400].median == pytest.approx(60.0)  # runs under the old name
    yesterday = by_day[day0 - 86400]
    assert (yesterday.runs, yesterday.ok_runs, yesterday.median) == (4, 2, pytest.approx(71.0))
    assert by_day[day0].uptime == 0.0 and by_day[day0 - 2 * 86400].uptime is None
    assert len(page.runs) == 9 and page.runs[0].status == "unreachable"  # newest first
    assert [(i.runs, i.end is None) for i in page.incidents] == [(1, True), (2, False)]  # newest first
    assert page.incidents[1].statuses == ["provider_error", "timeout"]
    assert page.incidents[1].error == "http_500: boom"


def test_incidents_are_maximal_stretches_of_non_ok_runs() -> None:
    def p(t: float, status: str) -> RunPoint:
        return RunPoint(
            t, status, 1.0 if status == "ok" else None, None, None, None, None, None, None, "scheduled", False
        )

    runs = [p(1, "timeout"), p(2, "ok"), p(3, "ok"), p(4, "rate_limited"), p(5, "rate_limited"), p(6, "ok")]
    found = incidents(runs)
    assert [(i.start, i.end, i.runs) for i in found] == [(1, 2, 1), (4, 6, 2)]
    assert incidents([p(1, "ok")]) == []
