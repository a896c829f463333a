"""What the status page shows, assembled from the store: tiles, the comparison strip, an endpoint's history.

Figures use the definitions of docs/methodology.md and the same window rule as the exported gauges and
`tokwatch report` (`tokwatch.window_rule`: on-demand runs and set-aside tok/s figures left out unless
`schedule.window_includes` names them), through the same `window_figures`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tokwatch.config import Config, EndpointSettings
from tokwatch.stats import median
from tokwatch.storage.base import LastRun, RunPoint, Store
from tokwatch.storage.window import DAY_S, FLEET_WINDOW_S, WINDOW_S, window_figures
from tokwatch.window import FleetRanking, WindowFigures, rank_fleet, window_label
from tokwatch.window_rule import WindowRule

SPARK_RUNS = 48  # runs on a tile's sparkline
HEADLINE_LOOKBACK = 8 * SPARK_RUNS  # first page of older runs searched for a headline during a long incident
HISTORY_DAYS = 90  # days on an endpoint page's daily charts
LAST_RUNS = 100  # rows in an endpoint page's run table
MAX_INCIDENTS = 50


@dataclass(frozen=True, slots=True)
class Tile:
    """One endpoint's tile: current status, 24 h figures, recent runs (oldest first) and the headline: the
    newest ok run whose tok/s the window figures take (scheduled, not set aside, unless
    `schedule.window_includes` names more), however old."""

    endpoint: EndpointSettings
    last: LastRun | None  # the newest run of any kind: the status pill
    day: WindowFigures | None
    spark: Sequence[RunPoint]
    headline: RunPoint | None = None

    @property
    def status(self) -> str | None:
        """Status of the newest run, None before the first run."""
        return self.last.status if self.last else None


@dataclass(frozen=True, slots=True)
class Overview:
    """The whole status page: a tile per configured endpoint and the ranked comparison strip."""

    generated_at: float
    tiles: Sequence[Tile]
    ranking: FleetRanking  # 7-day median of ok runs, fastest first
    unranked: Sequence[str]  # endpoints without an ok run in 7 days


@dataclass(frozen=True, slots=True)
class Day:
    """One UTC day of an endpoint's history."""

    start: float
    runs: int
    ok_runs: int
    median: float | None

    @property
    def uptime(self) -> float | None:
        """ok runs / runs, None on a day without runs."""
        return self.ok_runs / self.runs if self.runs else None


@dataclass(frozen=True, slots=True)
class Incident:
    """A maximal stretch of consecutive non-ok runs."""

    start: float
    end: float | None  # time of the next ok run; None while ongoing
    runs: int
    statuses: Sequence[str]
    error: str | None  # first run's error class and message


@dataclass(frozen=True, slots=True)
class EndpointPage:
    """An endpoint's page: daily medians and uptime, its last runs (newest first) and incidents."""

    generated_at: float
    endpoint: EndpointSettings
    days: Sequence[Day]
    runs: Sequence[RunPoint]
    incidents: Sequence[Incident] = field(default_factory=tuple)


async def build_overview(store: Store, config: Config, now: float | None = None) -> Overview:
    """Query the store for every endpoint of the (whole-fleet) config."""
    now = time.time() if now is None else now
    rule = WindowRule.of(config.schedule.window_includes)
    names = [e.name for e in config.endpoints]
    # Concurrent: PostgreSQL answers them on separate pooled connections (SQLite serialises them anyway).
    day, week, last, recent = await asyncio.gather(
        window_figures(store, now, rule=rule, window_s=WINDOW_S, endpoints=names),
        window_figures(store, now, rule=rule, window_s=FLEET_WINDOW_S, endpoints=names),
        store.last_runs(0.0),
        store.recent_runs(now - FLEET_WINDOW_S, SPARK_RUNS, rule=rule),
    )
    headlines = {name: _newest_ok(runs, rule) for name, runs in recent.items()}

    def look_further(name: str) -> bool:
        """Runs that count in the last 7 days but none ok: an incident longer than the sparkline. No run at
        all in 7 days: a paused endpoint. Recent runs none of which counts (an endpoint probed only through
        /probe) have no headline, as they have no figures, and cost no search through their history."""
        lr = last.get(name)
        if headlines.get(name) is not None or lr is None or lr.ok_time is None:
            return False
        return bool(recent.get(name)) or lr.time < now - FLEET_WINDOW_S

    older = [e.name for e in config.endpoints if look_further(e.name)]
    if older:
        found = await asyncio.gather(*(_headline_before(store, name, rule) for name in older))
        headlines.update(zip(older, found, strict=True))
    tiles = [
        Tile(
            e,
            last.get(e.name),
            day.get(e.name),
            _plotted(reversed(recent.get(e.name, [])), rule),
            headlines.get(e.name),
        )
        for e in config.endpoints
    ]
    ranking = rank_fleet({n: f.median for n, f in week.items()}, window_label(FLEET_WINDOW_S))
    ranked = {n for n, _ in ranking.ranked}
    return Overview(now, tiles, ranking, [n for n in names if n not in ranked])


async def build_endpoint_page(
    store: Store, config: Config, endpoint: EndpointSettings, now: float | None = None
) -> EndpointPage:
    """Daily figures over HISTORY_DAYS, the last LAST_RUNS runs and the incidents of one endpoint."""
    now = time.time() if now is None else now
    rule = WindowRule.of(config.schedule.window_includes)
    since = day_start(now) - (HISTORY_DAYS - 1) * DAY_S
    history, latest = await asyncio.gather(
        store.recent_runs(since, None, endpoint=endpoint.name, rule=rule),
        store.recent_runs(0.0, LAST_RUNS, endpoint=endpoint.name),
    )
    oldest_first = list(reversed(history.get(endpoint.name, [])))
    return EndpointPage(
        now,
        endpoint,
        daily(oldest_first, since, now, rule),
        latest.get(endpoint.name, []),
        incidents(oldest_first)[-MAX_INCIDENTS:][::-1],
    )


def _plotted(runs: Iterable[RunPoint], rule: WindowRule) -> list[RunPoint]:
    """Counted runs as the sparkline draws them: an ok run whose tok/s the rule set aside is an ok run
    without a figure (no failure tick, and no point the median does not hold either)."""
    return [
        r._replace(tokens_per_second=None) if r.status == "ok" and rule.sample(r) is None else r for r in runs
    ]


def _newest_ok(runs_newest_first: Sequence[RunPoint], rule: WindowRule) -> RunPoint | None:
    """The newest run that gives the window figures a tok/s sample (runs already counted by `rule`)."""
    return next((r for r in runs_newest_first if rule.sample(r) is not None), None)


async def _headline_before(store: Store, name: str, rule: WindowRule) -> RunPoint | None:
    """The newest ok run under the window rule at any age: pages of growing size until one is found or the
    history ends, so a long incident costs a few index range scans and a healthy endpoint none."""
    limit = HEADLINE_LOOKBACK
    while True:
        runs = (await store.recent_runs(0.0, limit, endpoint=name, rule=rule)).get(name, [])
        found = _newest_ok(runs, rule)
        if found is not None or len(runs) < limit:
            return found
        limit *= 8


def day_start(t: float) -> float:
    """Start of the UTC day containing unix time `t`."""
    return float(int(t // DAY_S) * DAY_S)


def daily(runs: Sequence[RunPoint], since: float, now: float, rule: WindowRule) -> list[Day]:
    """One Day per UTC day from `since` to `now` (days without runs included), from runs oldest first that
    `rule` counts; the median over its samples."""
    first, last = day_start(since), day_start(now)
    buckets: dict[float, list[RunPoint]] = {}
    for r in runs:
        buckets.setdefault(day_start(r.time), []).append(r)
    out = []
    start = first
    while start <= last:
        rs = buckets.get(start, [])
        tps = [v for r in rs if (v := rule.sample(r)) is not None]
        out.append(Day(start, len(rs), sum(r.status == "ok" for r in rs), median(tps) if tps else None))
        start += DAY_S
    return out


def incidents(runs: Sequence[RunPoint]) -> list[Incident]:
    """Stretches of consecutive non-ok runs, oldest first, from runs oldest first."""
    out: list[Incident] = []
    current: list[RunPoint] = []
    for r in runs:
        if r.status != "ok":
            current.append(r)
            continue
        if current:
            out.append(_incident(current, r.time))
            current = []
    if current:
        out.append(_incident(current, None))
    return out


def _incident(runs: Sequence[RunPoint], end: float | None) -> Incident:
    statuses = sorted({r.status for r in runs})
    first = runs[0]
    error = ": ".join(x for x in (first.error_class, first.error_message) if x) or None
    return Incident(first.time, end, len(runs), statuses, error)
