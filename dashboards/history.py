"""Dashboard 4, "tokwatch — Run history": every stored run, from the PostgreSQL/TimescaleDB store.

Prometheus only keeps the last run per gauge; the store keeps each run, so this is where a run's own tok/s,
its error class and exact window statistics over any time range live. Tables: docs/storage.md.
"""

from __future__ import annotations

from typing import Any

from grafanalib import core as g

from dashboards import common
from dashboards.panels import (
    AMBER,
    COUNT,
    GREEN,
    POSTGRES,
    RATIO,
    RED,
    REF_LATENCY,
    REF_NETWORK,
    REF_STATUS,
    REF_TIMING,
    REF_WINDOW,
    SECONDS,
    TOKS,
    Grid,
    by_ref,
    describe,
    sql,
    steps,
    table,
    timeseries,
)

UID = "tokwatch-history"
TITLE = "tokwatch — Run history"

# Runs are stored under a stable endpoint id; joining on it keeps history continuous across renames.
RUNS = "runs r JOIN endpoints e ON e.id = r.endpoint_id"
# Every run belongs to one series: endpoint, workload (the prompt) and site (the vantage point); no panel
# mixes two workloads' or two sites' runs under one name.
FILTER = "$__timeFilter(r.time) AND e.name IN ($endpoint) AND r.workload IN ($workload) AND r.site IN ($site)"


def series_name(alias: str) -> str:
    """`endpoint @ site · workload` of a runs (or runs_hourly) row (no `@` part for runs without a site)."""
    site = f"CASE WHEN {alias}.site <> '' THEN ' @ ' || {alias}.site ELSE '' END"
    return f"e.name || {site} || ' · ' || {alias}.workload"


SERIES = series_name("r")

TPS_PER_RUN = f"""SELECT
  r.time AS "time",
  {SERIES} AS metric,
  CASE WHEN r.status = 'ok' THEN r.tokens_per_second END AS value
FROM {RUNS}
WHERE {FILTER}
ORDER BY 1"""

FAILED_PER_BUCKET = f"""SELECT
  $__timeGroupAlias(r.time, $__interval),
  {SERIES} || ' failed runs' AS metric,
  count(*) AS value
FROM {RUNS}
WHERE {FILTER} AND r.status <> 'ok'
GROUP BY 1, 2
ORDER BY 1"""

SUMMARY = f"""SELECT
  e.name AS "endpoint",
  r.site AS "site",
  r.workload AS "workload",
  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.tokens_per_second)
    FILTER (WHERE r.status = 'ok') AS "median tok/s",
  stddev_samp(r.tokens_per_second) FILTER (WHERE r.status = 'ok') AS "stddev tok/s",
  stddev_samp(r.tokens_per_second) FILTER (WHERE r.status = 'ok')
    / NULLIF(avg(r.tokens_per_second) FILTER (WHERE r.status = 'ok'), 0) AS "CV",
  count(*) FILTER (WHERE r.status = 'ok')::double precision / count(*) AS "uptime",
  count(*) AS "runs",
  count(*) FILTER (WHERE r.status <> 'ok') AS "failed runs",
  max(r.time) AS "last run"
FROM {RUNS}
WHERE {FILTER}
GROUP BY e.name, r.site, r.workload
ORDER BY 4 DESC NULLS LAST"""

RECENT_FAILURES = f"""SELECT
  r.time AS "time",
  e.name AS "endpoint",
  r.site AS "site",
  r.workload AS "workload",
  upper(replace(r.status, '_', ' ')) AS "status",
  r.http_status AS "HTTP",
  r.error_class AS "error class",
  r.error_message AS "error (redacted)",
  r.duration_s AS "duration"
FROM {RUNS}
WHERE {FILTER} AND r.status <> 'ok'
ORDER BY r.time DESC
LIMIT 200"""

# The rollup holds one row per endpoint, workload, site and hour.
HOURLY_MEDIAN = f"""SELECT
  h.bucket AS "time",
  {series_name("h")} AS metric,
  h.tps_median AS value
FROM runs_hourly h JOIN endpoints e ON e.id = h.endpoint_id
WHERE $__timeFilter(h.bucket) AND e.name IN ($endpoint) AND h.workload IN ($workload) AND h.site IN ($site)
ORDER BY 1"""

LATENCY_PER_RUN = f"""SELECT
  r.time AS "time",
  {SERIES} || ' TTFT' AS metric,
  r.ttft_s AS value
FROM {RUNS}
WHERE {FILTER} AND r.ttft_s IS NOT NULL
UNION ALL
SELECT r.time, {SERIES} || ' ITL p99', r.itl_p99_s
FROM {RUNS}
WHERE {FILTER} AND r.itl_p99_s IS NOT NULL
ORDER BY 1"""

# Where each series' time to first byte goes, from the phases stored with every run that got a response.
NETWORK_PHASES = f"""SELECT
  e.name AS "endpoint",
  r.site AS "site",
  r.workload AS "workload",
  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.phase_resolve_s) AS "resolve p50",
  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.phase_connect_s) AS "connect p50",
  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.phase_tls_s) AS "TLS p50",
  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.phase_processing_s) AS "processing p50",
  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.network_rtt_s) AS "network RTT p50",
  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.ttft_s - r.network_rtt_s) AS "server TTFT p50",
  avg(CASE WHEN r.connection_reused THEN 1.0 ELSE 0.0 END) AS "connection kept open",
  count(*) AS "runs with phases"
FROM {RUNS}
WHERE {FILTER} AND r.phase_processing_s IS NOT NULL
GROUP BY e.name, r.site, r.workload
ORDER BY 1, 2, 3"""

ENDPOINTS = "SELECT name FROM endpoints ORDER BY name"
# run_series holds one row per endpoint, workload and site that has runs; a run without a site has ''.
WORKLOADS = "SELECT DISTINCT workload FROM run_series ORDER BY 1"
SITES = """SELECT DISTINCT
  CASE WHEN site = '' THEN '(no site)' ELSE site END AS __text,
  site AS __value
FROM run_series
ORDER BY 1"""


def _override(name: str, **properties: Any) -> dict[str, Any]:
    return {
        "matcher": {"id": "byName", "options": name},
        "properties": [{"id": key, "value": value} for key, value in properties.items()],
    }


def _runs(grid: Grid) -> None:
    grid.row("Every run")
    grid.add(
        timeseries(
            "tok/s per run, failed runs as red bars",
            describe(
                "One point per stored run: tok/s of ok runs; a non-ok run is a null, so the line breaks at "
                "incidents. Red bars (right axis) count non-ok runs per time bucket.",
                REF_TIMING,
            ),
            [sql(TPS_PER_RUN, fmt="time_series"), sql(FAILED_PER_BUCKET, ref="B", fmt="time_series")],
            unit=TOKS,
            points="always",
            datasource=POSTGRES,
            overrides=[
                by_ref(
                    "B",
                    **{
                        "custom.drawStyle": "bars",
                        "custom.fillOpacity": 80,
                        "custom.axisPlacement": "right",
                        "custom.axisLabel": "failed runs",
                        "color": {"mode": "fixed", "fixedColor": "red"},
                        "unit": COUNT,
                        "decimals": 0,
                    },
                )
            ],
        ),
        w=24,
        h=9,
    )
    grid.add(
        table(
            "Window figures over the selected time range",
            describe(
                "The tile numbers recomputed from every stored run in the dashboard's time range: median, "
                "sample stddev and CV of ok-run tok/s, uptime (ok / all); one row per endpoint, site and "
                "workload.",
                REF_WINDOW,
            ),
            [sql(SUMMARY)],
            datasource=POSTGRES,
            overrides=[
                _override("median tok/s", unit=TOKS, decimals=1),
                _override("stddev tok/s", unit=TOKS, decimals=2),
                _override(
                    "CV",
                    unit=RATIO,
                    decimals=1,
                    thresholds={
                        "mode": "absolute",
                        "steps": steps((GREEN, None), (AMBER, 0.05), (RED, 0.15)),
                    },
                    **{"custom.cellOptions": {"type": "color-text"}},
                ),
                _override(
                    "uptime",
                    unit=RATIO,
                    decimals=2,
                    thresholds={
                        "mode": "absolute",
                        "steps": steps((RED, None), (AMBER, 0.95), (GREEN, 0.99)),
                    },
                    **{"custom.cellOptions": {"type": "color-text"}},
                ),
                _override("last run", unit="dateTimeAsIso"),
            ],
        ),
        w=24,
        h=7,
    )


def _details(grid: Grid) -> None:
    grid.row("Failures and latency")
    grid.add(
        table(
            "Recent non-ok runs",
            describe(
                "The latest failed runs with their HTTP status and error class; messages are redacted "
                "before they are stored.",
                REF_STATUS,
            ),
            [sql(RECENT_FAILURES)],
            datasource=POSTGRES,
            overrides=[_override("duration", unit=SECONDS)],
        ),
        w=24,
        h=8,
    )
    grid.add(
        timeseries(
            "Hourly median tok/s (rollup)",
            describe(
                "Median tok/s of ok runs per endpoint, site, workload and hour, from the runs_hourly rollup.",
                REF_TIMING,
            ),
            [sql(HOURLY_MEDIAN, fmt="time_series")],
            unit=TOKS,
            datasource=POSTGRES,
        ),
        w=12,
        h=8,
    )
    grid.add(
        timeseries(
            "TTFT and ITL p99 per run",
            describe("Each stored run's TTFT and its own 99th-percentile inter-token gap.", REF_LATENCY),
            [sql(LATENCY_PER_RUN, fmt="time_series")],
            unit=SECONDS,
            points="always",
            datasource=POSTGRES,
        ),
        w=12,
        h=8,
    )


def _network(grid: Grid) -> None:
    grid.row("Network")
    seconds = [
        "resolve p50",
        "connect p50",
        "TLS p50",
        "processing p50",
        "network RTT p50",
        "server TTFT p50",
    ]
    grid.add(
        table(
            "Network phases over the selected time range",
            describe(
                "Medians over the stored runs of each endpoint, site and workload: DNS resolve, TCP connect "
                "and TLS handshake of the connection a run was sent on (0 when it was kept open from an "
                "earlier round), processing (request sent to first response byte), one network round trip, "
                "and the server's share of TTFT (TTFT minus that round trip); and how often the connection "
                "was kept open.",
                REF_NETWORK,
            ),
            [sql(NETWORK_PHASES)],
            datasource=POSTGRES,
            overrides=[_override(name, unit=SECONDS, decimals=4) for name in seconds]
            + [_override("connection kept open", unit=RATIO, decimals=0)],
        ),
        w=24,
        h=7,
    )


def endpoint_variable() -> g.Template:
    """`$endpoint` from the store's endpoints table (current names; renamed endpoints keep their history)."""
    return store_variable("endpoint", "Endpoint", ENDPOINTS)


def store_variable(name: str, label: str, query: str) -> g.Template:
    """A multi-value variable (All included) whose choices a query of the store lists."""
    return g.Template(
        name=name,
        label=label,
        query=query,
        dataSource=POSTGRES,
        multi=True,
        includeAll=True,
        default="$__all",
        refresh=g.REFRESH_ON_DASHBOARD_LOAD,
        sort=g.SORT_ALPHA_IGNORE_CASE_ASC,
    )


def build() -> g.Dashboard:
    """The Run history dashboard (PostgreSQL datasource)."""
    grid = Grid()
    _runs(grid)
    _details(grid)
    _network(grid)
    return common.dashboard(
        title=TITLE,
        uid=UID,
        description="Every probe run from tokwatch's PostgreSQL/TimescaleDB store: per-run tok/s, failures.",
        panels=grid.panels,
        variables=[
            endpoint_variable(),
            store_variable("site", "Site", SITES),
            store_variable("workload", "Workload", WORKLOADS),
        ],
        time_from="now-7d",
        refresh="5m",
    )
