"""Dashboard 5, "tokwatch — Benchmarks": `tokwatch bench` runs stored in the PostgreSQL/TimescaleDB store.

One row per run in `bench_runs` (summary figures) and one per measured request in `bench_requests`; both
are written by `tokwatch bench --config tokwatch.yml` (docs/bench.md, "Storing runs"; tables:
docs/storage.md).
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
    SECONDS,
    TOKS,
    DocRef,
    Grid,
    describe,
    sql,
    steps,
    table,
    timeseries,
)

UID = "tokwatch-benchmarks"
TITLE = "tokwatch — Benchmarks"

REF_BENCH = DocRef("docs/bench.md", "Output directory")
REF_BENCH_STORE = DocRef("docs/bench.md", "Storing runs")

FILTER = "$__timeFilter(b.started_at) AND b.endpoint IN ($endpoint)"

RUNS = f"""SELECT
  b.started_at AS "time",
  b.endpoint AS "endpoint",
  b.model AS "model",
  b.load AS "load",
  CASE WHEN b.complete THEN 'yes' ELSE 'no (' || b.stop_reason || ')' END AS "complete",
  b.requests_ok || '/' || b.requests_measured AS "ok/measured",
  b.goodput_ratio AS "goodput",
  CASE WHEN b.all_slos_met IS NULL THEN '-' WHEN b.all_slos_met THEN 'met' ELSE 'MISSED' END AS "SLOs",
  b.ttft_p99_s AS "TTFT p99",
  b.tbt_p99_s AS "TBT p99",
  b.token_throughput AS "tok/s",
  b.request_throughput AS "req/s",
  b.id AS "run id"
FROM bench_runs b
WHERE {FILTER}
ORDER BY b.started_at DESC
LIMIT 500"""

LATENCY_P99 = f"""SELECT
  b.started_at AS "time",
  b.endpoint || ' TTFT p99' AS metric,
  b.ttft_p99_s AS value
FROM bench_runs b
WHERE {FILTER} AND b.ttft_p99_s IS NOT NULL
UNION ALL
SELECT b.started_at, b.endpoint || ' TBT p99', b.tbt_p99_s
FROM bench_runs b
WHERE {FILTER} AND b.tbt_p99_s IS NOT NULL
ORDER BY 1"""

THROUGHPUT = f"""SELECT
  b.started_at AS "time",
  b.endpoint || ' overall' AS metric,
  b.token_throughput AS value
FROM bench_runs b
WHERE {FILTER} AND b.token_throughput IS NOT NULL
UNION ALL
SELECT b.started_at, b.endpoint || ' steady state', b.token_throughput_steady
FROM bench_runs b
WHERE {FILTER} AND b.token_throughput_steady IS NOT NULL
ORDER BY 1"""

GOODPUT = f"""SELECT
  b.started_at AS "time",
  b.endpoint AS metric,
  b.goodput_ratio AS value
FROM bench_runs b
WHERE {FILTER} AND b.goodput_ratio IS NOT NULL
ORDER BY 1"""

# Request-level TTFT of the selected run: the histogram panel buckets the values itself.
RUN_TTFT = """SELECT
  q.sent_at AS "time",
  q.ttft_s AS "TTFT"
FROM bench_requests q
WHERE q.bench_run_id = '$run' AND q.status = 'ok' AND q.ttft_s IS NOT NULL
ORDER BY 1"""

RUN_TTFT_SUMMARY = """SELECT
  count(*) AS "requests",
  count(*) FILTER (WHERE q.status = 'ok') AS "ok",
  percentile_cont(0.5) WITHIN GROUP (ORDER BY q.ttft_s) AS "TTFT p50",
  percentile_cont(0.9) WITHIN GROUP (ORDER BY q.ttft_s) AS "TTFT p90",
  percentile_cont(0.99) WITHIN GROUP (ORDER BY q.ttft_s) AS "TTFT p99",
  max(q.ttft_s) AS "TTFT max"
FROM bench_requests q
WHERE q.bench_run_id = '$run'"""

ENDPOINTS = "SELECT DISTINCT endpoint FROM bench_runs ORDER BY 1"
RUN_CHOICES = """SELECT
  to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' ' || endpoint || ' ' || model
    || ' (' || load || ')' AS __text,
  id AS __value
FROM bench_runs
ORDER BY started_at DESC
LIMIT 200"""


def _override(name: str, **properties: Any) -> dict[str, Any]:
    return {
        "matcher": {"id": "byName", "options": name},
        "properties": [{"id": key, "value": value} for key, value in properties.items()],
    }


def _color_text(unit: str, decimals: int, *pairs: tuple[str, float | None]) -> dict[str, Any]:
    return {
        "unit": unit,
        "decimals": decimals,
        "thresholds": {"mode": "absolute", "steps": steps(*pairs)},
        "custom.cellOptions": {"type": "color-text"},
    }


def _runs(grid: Grid) -> None:
    grid.row("Bench runs")
    grid.add(
        table(
            "Bench runs",
            describe(
                "Every stored `tokwatch bench` run in the time range, newest first: load, whether it ran to "
                "the end, goodput (requests meeting every SLO over measured requests), SLO verdict, p99 "
                "latencies and overall token throughput.",
                REF_BENCH_STORE,
            ),
            [sql(RUNS)],
            datasource=POSTGRES,
            overrides=[
                _override("time", unit="dateTimeAsIso"),
                _override("goodput", **_color_text(RATIO, 1, (RED, None), (AMBER, 0.9), (GREEN, 0.99))),
                _override("TTFT p99", unit=SECONDS, decimals=3),
                _override("TBT p99", unit=SECONDS, decimals=4),
                _override("tok/s", unit=TOKS, decimals=1),
                _override("req/s", unit="reqps", decimals=2),
            ],
        ),
        w=24,
        h=9,
    )


def _trends(grid: Grid) -> None:
    grid.row("Run to run")
    grid.add(
        timeseries(
            "TTFT and TBT p99 per run",
            describe("Each run's 99th percentile of TTFT and of time between tokens.", REF_BENCH),
            [sql(LATENCY_P99, fmt="time_series")],
            unit=SECONDS,
            points="always",
            datasource=POSTGRES,
        ),
        w=8,
        h=8,
    )
    grid.add(
        timeseries(
            "Token throughput per run",
            describe(
                "Tokens received per second over the whole run and in steady state (first 20 % of the "
                "wall time dropped as ramp-up).",
                REF_BENCH,
            ),
            [sql(THROUGHPUT, fmt="time_series")],
            unit=TOKS,
            points="always",
            datasource=POSTGRES,
        ),
        w=8,
        h=8,
    )
    grid.add(
        timeseries(
            "Goodput per run",
            describe(
                "Share of measured requests that met every SLO (errored requests count as misses).", REF_BENCH
            ),
            [sql(GOODPUT, fmt="time_series")],
            unit=RATIO,
            points="always",
            datasource=POSTGRES,
        ),
        w=8,
        h=8,
    )


def histogram(title: str, description: str, targets: list[g.Target], unit: str) -> g.Histogram:
    """The current (non-Angular) histogram panel: buckets the query's values itself."""
    return g.Histogram(
        title=title,
        description=description,
        dataSource=POSTGRES,
        targets=targets,
        fillOpacity=80,
        legendDisplayMode="list",
        thresholds=steps((GREEN, None)),
        overrides=[
            {"matcher": {"id": "byName", "options": "TTFT"}, "properties": [{"id": "unit", "value": unit}]}
        ],
    )


def _selected_run(grid: Grid) -> None:
    grid.row("Selected run ($run)")
    grid.add(
        histogram(
            "Request TTFT distribution",
            describe("TTFT of every ok measured request of the selected run, bucketed.", REF_BENCH),
            [sql(RUN_TTFT)],
            unit=SECONDS,
        ),
        w=16,
        h=8,
    )
    grid.add(
        table(
            "Request TTFT summary",
            describe("Requests of the selected run and the percentiles of their TTFT.", REF_BENCH),
            [sql(RUN_TTFT_SUMMARY)],
            datasource=POSTGRES,
            overrides=[
                _override(name, unit=SECONDS, decimals=3)
                for name in ("TTFT p50", "TTFT p90", "TTFT p99", "TTFT max")
            ]
            + [_override("requests", unit=COUNT), _override("ok", unit=COUNT)],
        ),
        w=8,
        h=8,
    )


def variables() -> list[g.Template]:
    """`$endpoint` from the stored bench runs, `$run` (one run id, newest first) for the request panels."""
    return [
        g.Template(
            name="endpoint",
            label="Endpoint",
            query=ENDPOINTS,
            dataSource=POSTGRES,
            multi=True,
            includeAll=True,
            default="$__all",
            refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
            sort=g.SORT_ALPHA_IGNORE_CASE_ASC,
        ),
        g.Template(
            name="run",
            label="Run",
            query=RUN_CHOICES,
            dataSource=POSTGRES,
            multi=False,
            includeAll=False,
            refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
            sort=g.SORT_DISABLED,  # the query's order: newest run first
        ),
    ]


def build() -> g.Dashboard:
    """The Benchmarks dashboard (PostgreSQL datasource)."""
    grid = Grid()
    _runs(grid)
    _trends(grid)
    _selected_run(grid)
    return common.dashboard(
        title=TITLE,
        uid=UID,
        description="tokwatch bench runs from the PostgreSQL store: latency, throughput, goodput per run.",
        panels=grid.panels,
        variables=variables(),
        time_from="now-30d",
        refresh="5m",
    )
