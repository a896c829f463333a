"""What the status page shows, assembled from the store: tiles, the comparison strip, a workload's comparison,
an endpoint's history.

A `Tile` per series: each configured endpoint, with each of its workloads, from each site that stored runs
of it (the exporter's own site always); the page draws an endpoint's series as the rows of one tile.
Figures use the definitions of docs/methodology.md and the same window rule as the exported gauges and
`tokwatch report` (`tokwatch.windows.window_rule`: on-demand runs and set-aside tok/s figures left out
unless `schedule.window_includes` names them), through the same `window_figures`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tokwatch.figures.series import DEFAULT_WORKLOAD, NO_SITE, SeriesKey
from tokwatch.figures.stats import median
from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.storage.base import LastRun, RunPoint, RunStore
from tokwatch.storage.cost_figures import Pricer, SeriesCost, priced_only, series_cost, series_costs
from tokwatch.storage.network_time import NetworkTime, network_time
from tokwatch.storage.window import DAY_S, FLEET_WINDOW_S, WINDOW_S, window_figures
from tokwatch.windows.window import (
    FleetRanking,
    WindowFigures,
    primary_ranking,
    rank_series,
    window_label,
    window_lengths,
)
from tokwatch.windows.window_rule import WindowRule

SPARK_RUNS = 48  # runs on a tile's sparkline
HEADLINE_LOOKBACK = 8 * SPARK_RUNS  # first page of older runs searched for a headline during a long incident
HISTORY_DAYS = 90  # days on an endpoint page's daily charts
LAST_RUNS = 100  # rows in an endpoint page's run table
MAX_INCIDENTS = 50


@dataclass(frozen=True, slots=True)
class Tile:
    """One series (an endpoint's runs of one workload from one site; a row of its endpoint's tile): current
    status, 24 h figures, recent runs (oldest first) and the headline: the newest ok run among the runs the
    window figures take (scheduled, not set aside, unless `schedule.window_includes` names more), however
    old."""

    endpoint: EndpointSettings
    last: LastRun | None  # the newest run of any kind: the status pill
    day: WindowFigures | None
    spark: Sequence[RunPoint]
    headline: RunPoint | None = None
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE

    @property
    def key(self) -> SeriesKey:
        """(endpoint, workload, site)."""
        return SeriesKey(self.endpoint.name, self.workload, self.site)

    @property
    def status(self) -> str | None:
        """Status of the newest run, None before the first run."""
        return self.last.status if self.last else None


@dataclass(frozen=True, slots=True)
class Overview:
    """The whole status page: a tile per series and the ranked comparison strips (one per workload and
    site; `ranking` is the primary one: seed000's from the exporter's own site when measured)."""

    generated_at: float
    tiles: Sequence[Tile]
    ranking: FleetRanking  # 7-day median of ok runs, fastest first
    unranked: Sequence[str]  # endpoints without an ok run in 7 days (in the primary ranking)
    rankings: Sequence[FleetRanking] = ()


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
    """An endpoint's page for one of its series: daily medians and uptime, its last runs (newest first) and
    incidents; `series` lists every series of the endpoint to switch to."""

    generated_at: float
    endpoint: EndpointSettings
    days: Sequence[Day]
    runs: Sequence[RunPoint]
    incidents: Sequence[Incident] = field(default_factory=tuple)
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE
    series: Sequence[SeriesKey] = ()
    # Every series of the endpoint: its figures over each configured window, shortest first.
    windows: Mapping[SeriesKey, Sequence[WindowFigures]] = field(default_factory=dict)
    # The shown series' network vs server time over its last 24 h of counted runs (None without one).
    network: NetworkTime | None = None
    # The shown series' cost and energy over the same runs (storage.cost_figures; None, None: neither).
    cost: SeriesCost = (None, None)


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One endpoint in a workload's comparison: its figures over the comparison window by site."""

    endpoint: EndpointSettings
    by_site: Mapping[str, WindowFigures]


@dataclass(frozen=True, slots=True)
class Comparison:
    """Who is fastest for this model: one workload's endpoints side by side over FLEET_WINDOW_S (sites as
    columns), and every workload's figures of the same endpoints for the TTFT-by-prompt-size chart."""

    generated_at: float
    workload: str
    workloads: Sequence[str]  # every workload of the fleet, in config order
    sites: Sequence[str]  # the exporter's own first, then the others with stored runs
    window: str
    rows: Sequence[ComparisonRow]  # endpoints that run the workload, config order
    every_workload: Mapping[SeriesKey, WindowFigures]
    input_tokens: Mapping[str, int | None]  # workload -> its prompt size (None: seed000's configured prompt)
    # The workload's priced or metered series: cost and energy over their last 24 h (storage.cost_figures).
    costs: Mapping[SeriesKey, SeriesCost] = field(default_factory=dict)


def series_of(config: Config, seen: Sequence[SeriesKey] = ()) -> list[SeriesKey]:
    """Every series the page shows: each endpoint of the config with each of its workloads, from the
    exporter's own site and from every other site in `seen` (series with stored runs), side by side."""
    sites: dict[str, set[str]] = {}
    for key in seen:
        sites.setdefault(key.endpoint, set()).add(key.site)
    out = []
    for ep in config.endpoints:
        others = sorted(sites.get(ep.name, set()) - {config.site_name})
        for w in config.workloads_for(ep):
            out += [SeriesKey(ep.name, w.name, site) for site in (config.site_name, *others)]
    return out


async def build_overview(store: RunStore, config: Config, now: float | None = None) -> Overview:
    """Query the store for every series of the (whole-fleet) config, from every site."""
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
    keys = series_of(config, list(last))
    headlines = {key: _newest_ok(runs, rule) for key, runs in recent.items()}

    def look_further(key: SeriesKey) -> bool:
        """Runs that count in the last 7 days but none ok: an incident longer than the sparkline. No run at
        all in 7 days: a paused endpoint. Recent runs none of which counts (an endpoint probed only through
        /probe) have no headline, as they have no figures, and cost no search through their history."""
        lr = last.get(key)
        if headlines.get(key) is not None or lr is None or lr.ok_time is None:
            return False
        return bool(recent.get(key)) or lr.time < now - FLEET_WINDOW_S

    older = [key for key in keys if look_further(key)]
    if older:
        found = await asyncio.gather(*(_headline_before(store, key, rule) for key in older))
        headlines.update(zip(older, found, strict=True))
    endpoints = {e.name: e for e in config.endpoints}
    tiles = [
        Tile(
            endpoints[key.endpoint],
            last.get(key),
            day.get(key),
            _plotted(reversed(recent.get(key, [])), rule),
            headlines.get(key),
            key.workload,
            key.site,
        )
        for key in keys
    ]
    label = window_label(FLEET_WINDOW_S)
    wanted = set(keys)
    rankings = rank_series({k: f for k, f in week.items() if k in wanted}, label)
    own = [r for r in rankings if r.site == config.site_name]
    ranking = primary_ranking(own or rankings, label)
    ranked = {n for n, _ in ranking.ranked}
    return Overview(now, tiles, ranking, [n for n in names if n not in ranked], rankings)


async def build_endpoint_page(
    store: RunStore,
    config: Config,
    endpoint: EndpointSettings,
    now: float | None = None,
    *,
    workload: str | None = None,
    site: str | None = None,
    pricing: Pricer = lambda _: None,
) -> EndpointPage:
    """Daily figures over HISTORY_DAYS, the last LAST_RUNS runs and the incidents of one endpoint's series:
    `workload` (its first when None) from `site` (the exporter's own when None)."""
    now = time.time() if now is None else now
    rule = WindowRule.of(config.schedule.window_includes)
    since = day_start(now) - (HISTORY_DAYS - 1) * DAY_S
    workload = workload or config.workloads_for(endpoint)[0].name
    site = config.site_name if site is None else site
    key = SeriesKey(endpoint.name, workload, site)
    lengths = window_lengths(config.schedule.window, config.schedule.windows)
    history, latest, last, per_window = await asyncio.gather(
        store.recent_runs(since, None, endpoint=endpoint.name, rule=rule, workload=workload, site=site),
        store.recent_runs(0.0, LAST_RUNS, endpoint=endpoint.name, workload=workload, site=site),
        store.last_runs(0.0),
        asyncio.gather(
            *(window_figures(store, now, rule=rule, window_s=s, endpoints=[endpoint.name]) for s in lengths)
        ),
    )
    oldest_first = list(reversed(history.get(key, [])))
    series = [k for k in series_of(config, list(last)) if k.endpoint == endpoint.name]
    windows = {
        k: figs
        for k in series
        if (figs := [f[k] for f in per_window if k in f])  # windows with runs
    }
    day_runs = [r for r in oldest_first if r.time >= now - WINDOW_S]
    return EndpointPage(
        now,
        endpoint,
        daily(oldest_first, since, now, rule),
        latest.get(key, []),
        incidents(oldest_first)[-MAX_INCIDENTS:][::-1],
        workload,
        site,
        series,
        windows,
        network_time(day_runs),
        series_cost(
            day_runs[::-1],
            pricing(endpoint.name),
            bool(endpoint.power_metrics_url),
            config.pricing.blend_parts,
        ),
    )


def fleet_workloads(config: Config) -> list[str]:
    """Every workload some endpoint runs, in config order."""
    seen: dict[str, None] = {}
    for ep in config.endpoints:
        for w in config.workloads_for(ep):
            seen.setdefault(w.name)
    return list(seen)


async def build_comparison(
    store: RunStore,
    config: Config,
    workload: str,
    now: float | None = None,
    pricing: Pricer = lambda _: None,
) -> Comparison:
    """One workload's endpoints over the fleet window from every site, and every workload's figures."""
    now = time.time() if now is None else now
    rule = WindowRule.of(config.schedule.window_includes)
    names = [e.name for e in config.endpoints]
    week, last = await asyncio.gather(
        window_figures(store, now, rule=rule, window_s=FLEET_WINDOW_S, endpoints=names),
        store.last_runs(0.0),
    )
    keys = series_of(config, list(last))
    others = sorted({k.site for k in keys} - {config.site_name})
    sites = [config.site_name, *others]
    rows = [
        ComparisonRow(
            ep,
            {k.site: week[k] for k in keys if k.endpoint == ep.name and k.workload == workload and k in week},
        )
        for ep in config.endpoints
        if config.workload_for(ep, workload) is not None
    ]
    sizes: dict[str, int | None] = {}
    for ep in config.endpoints:
        for w in config.workloads_for(ep):
            sizes.setdefault(w.name, w.input_tokens)
    wanted = set(keys)
    costs, capacities = await series_costs(store, config, now, pricing)
    for row in rows:  # a priced endpoint without runs in 24 h still shows its prices
        key = SeriesKey(row.endpoint.name, workload, config.site_name)
        only = priced_only(row.endpoint, config, pricing, capacities.get(row.endpoint.name))
        if key not in costs and only != (None, None):
            costs[key] = only
    return Comparison(
        now,
        workload,
        fleet_workloads(config),
        sites,
        window_label(FLEET_WINDOW_S),
        rows,
        {k: f for k, f in week.items() if k in wanted},
        sizes,
        {k: c for k, c in costs.items() if k.workload == workload},
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


async def _headline_before(store: RunStore, key: SeriesKey, rule: WindowRule) -> RunPoint | None:
    """The newest ok run under the window rule at any age: pages of growing size until one is found or the
    history ends, so a long incident costs a few index range scans and a healthy endpoint none."""
    limit = HEADLINE_LOOKBACK
    while True:
        found_runs = await store.recent_runs(
            0.0, limit, endpoint=key.endpoint, rule=rule, workload=key.workload, site=key.site
        )
        runs = found_runs.get(key, [])
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
