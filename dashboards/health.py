"""Dashboard 3, "tokwatch — Exporter health": the exporter itself, its scheduler and its storage."""

from __future__ import annotations

from grafanalib import core as g

from dashboards import common
from dashboards.panels import (
    AMBER,
    COUNT,
    GREEN,
    MIN_INTERVAL,
    RED,
    REF_SELF_METRICS,
    REF_SERVER,
    REF_STORAGE,
    SCRAPE_FAILED,
    SECONDS,
    Grid,
    by_ref,
    describe,
    prom,
    stat,
    steps,
    table,
    timeseries,
    value_mapping,
)
from dashboards.promql import SERVER_BY, SERVER_LEGEND, SITE

UID = "tokwatch-health"
TITLE = "tokwatch — Exporter health"
INSTANCE = 'instance=~"$instance"'


def _sel(metric: str, *matchers: str) -> str:
    return f"{metric}{{{', '.join((INSTANCE, *matchers))}}}"


def _per_bucket(metric: str, by: str = "instance", *matchers: str) -> str:
    return f"sum by ({by}) (increase({_sel(metric, *matchers)}[$__interval]))"


def _exporter(grid: Grid) -> None:
    grid.row("Exporter")
    grid.add(
        stat(
            "Scraped by Prometheus",
            "Prometheus' own `up` series for the tokwatch target: 0 means Prometheus cannot scrape the "
            "exporter, so every other panel is stale.",
            [prom(f"max by (instance) ({_sel('up')})", "{{instance}}", instant=True)],
            unit="none",
            mappings=value_mapping({"0": ("DOWN", RED), "1": ("UP", GREEN)}),
            color_mode="background",
        ),
        w=6,
        h=5,
    )
    grid.add(
        stat(
            "Config reload",
            describe(
                "Whether the last config load or reload succeeded; a failed reload keeps the previous "
                "config running.",
                REF_SELF_METRICS,
            ),
            [
                prom(
                    f"max by (instance) ({_sel('tokwatch_config_last_reload_successful')})",
                    "{{instance}}",
                    instant=True,
                )
            ],
            unit="none",
            mappings=value_mapping({"0": ("FAILED", RED), "1": ("OK", GREEN)}),
            color_mode="background",
        ),
        w=6,
        h=5,
    )
    grid.add(
        stat(
            "Config loaded",
            describe("Time since the config was last loaded successfully.", REF_SELF_METRICS),
            [
                prom(
                    f"time() - max by (instance) "
                    f"({_sel('tokwatch_config_last_reload_success_timestamp_seconds')})",
                    "{{instance}}",
                    instant=True,
                )
            ],
            unit=SECONDS,
            decimals=0,
        ),
        w=6,
        h=5,
    )
    grid.add(
        table(
            "Build",
            "tokwatch version and Python version of each exporter instance (tokwatch_build_info).",
            [
                prom(
                    f"max by (instance, version, python) ({_sel('tokwatch_build_info')})",
                    instant=True,
                    fmt="table",
                )
            ],
            transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}],
        ),
        w=6,
        h=5,
    )


def _scheduler(grid: Grid) -> None:
    grid.row("Scheduler")
    grid.add(
        timeseries(
            "Scheduler lag",
            describe(
                "How late the last probe round started against its planned time. Growing lag means rounds "
                "take longer than the interval.",
                REF_SELF_METRICS,
            ),
            [prom(f"max by (instance) ({_sel('tokwatch_scheduler_lag_seconds')})", "{{instance}}")],
            unit=SECONDS,
        ),
        w=8,
        h=7,
    )
    grid.add(
        timeseries(
            "Probes in flight",
            describe("Probes running right now (bounded by the schedule's parallelism).", REF_SELF_METRICS),
            [prom(f"sum by (instance) ({_sel('tokwatch_probes_in_flight')})", "{{instance}}")],
            unit=COUNT,
            draw="line",
        ),
        w=8,
        h=7,
    )
    grid.add(
        stat(
            "Round timing",
            describe(
                "Configured interval, time since the last round and until the next one.", REF_SELF_METRICS
            ),
            [
                prom(
                    f"max by (instance) ({_sel('tokwatch_scheduler_interval_seconds')})",
                    "{{instance}} interval",
                    ref="A",
                    instant=True,
                ),
                prom(
                    f"time() - max by (instance) ({_sel('tokwatch_scheduler_last_round_timestamp_seconds')})",
                    "{{instance}} since last round",
                    ref="B",
                    instant=True,
                ),
                prom(
                    f"max by (instance) ({_sel('tokwatch_scheduler_next_round_timestamp_seconds')}) - time()",
                    "{{instance}} until next round",
                    ref="C",
                    instant=True,
                ),
            ],
            unit=SECONDS,
            decimals=0,
        ),
        w=8,
        h=7,
    )


def _storage(grid: Grid) -> None:
    grid.row("Storage")
    grid.add(
        stat(
            "Store reachable",
            describe(
                "1 while the last operation on the run store (sqlite, postgres or timescaledb) succeeded.",
                REF_STORAGE,
            ),
            [
                prom(
                    f"max by (instance, backend) ({_sel('tokwatch_storage_up')})",
                    "{{instance}} ({{backend}})",
                    instant=True,
                )
            ],
            unit="none",
            mappings=value_mapping({"0": ("DOWN", RED), "1": ("UP", GREEN)}),
            color_mode="background",
        ),
        w=6,
        h=7,
    )
    grid.add(
        timeseries(
            "Write queue and outbox",
            describe(
                "Runs waiting in the in-memory write queue, and runs parked in the durable outbox while the "
                "database is unreachable (replayed in order when it returns).",
                REF_STORAGE,
            ),
            [
                prom(
                    f"sum by (instance) ({_sel('tokwatch_storage_queue_depth')})",
                    "{{instance}} queue",
                    ref="A",
                ),
                prom(
                    f"sum by (instance) ({_sel('tokwatch_storage_outbox_runs')})",
                    "{{instance}} outbox",
                    ref="B",
                ),
            ],
            unit=COUNT,
        ),
        w=6,
        h=7,
    )
    grid.add(
        timeseries(
            "Writes, write errors and dropped runs per bucket",
            describe(
                "Runs written to the store, failed write attempts (their runs go to the outbox) and runs "
                "lost because the outbox itself could not be written, per time bucket.",
                REF_STORAGE,
            ),
            [
                prom(
                    _per_bucket("tokwatch_storage_writes_total"),
                    "{{instance}} writes",
                    ref="A",
                ),
                prom(
                    _per_bucket("tokwatch_storage_write_errors_total"),
                    "{{instance}} errors",
                    ref="B",
                ),
                prom(
                    _per_bucket("tokwatch_storage_dropped_runs_total"),
                    "{{instance}} dropped (lost)",
                    ref="C",
                ),
            ],
            overrides=[
                by_ref("B", color={"mode": "fixed", "fixedColor": "orange"}),
                by_ref("C", color={"mode": "fixed", "fixedColor": "red"}),
            ],
            unit=COUNT,
            draw="bars",
            fill=80,
            min_interval=MIN_INTERVAL,
        ),
        w=6,
        h=7,
    )
    grid.add(
        stat(
            "Oldest unwritten run",
            describe(
                "Age of the oldest run not yet in the database (0 when everything is written).", REF_STORAGE
            ),
            [
                prom(
                    f"max by (instance) ({_sel('tokwatch_storage_oldest_unwritten_age_seconds')})",
                    "{{instance}}",
                    instant=True,
                )
            ],
            unit=SECONDS,
            decimals=0,
            thresholds=steps((GREEN, None), (AMBER, 300.0), (RED, 3600.0)),
        ),
        w=6,
        h=7,
    )


def _scrapes(grid: Grid) -> None:
    grid.row("Scrapes")
    grid.add(
        timeseries(
            "Server /metrics scrape errors per bucket",
            describe(
                "Failed scrapes of the inference servers' /metrics, by endpoint and site.",
                REF_SERVER,
                SCRAPE_FAILED,
            ),
            [
                prom(
                    f"{_per_bucket('tokwatch_server_scrape_errors_total', SERVER_BY, SITE)} > 0",
                    SERVER_LEGEND,
                )
            ],
            unit=COUNT,
            draw="bars",
            fill=80,
            min_interval=MIN_INTERVAL,
        ),
        w=12,
        h=7,
    )
    grid.add(
        timeseries(
            "Exporter scrape duration",
            "How long Prometheus' scrape of tokwatch's /metrics takes (Prometheus' scrape_duration_seconds). "
            "Collectors read in-memory snapshots only, so this should stay in the milliseconds.",
            [prom(f"max by (instance) ({_sel('scrape_duration_seconds')})", "{{instance}}")],
            unit=SECONDS,
        ),
        w=12,
        h=7,
    )


def build() -> g.Dashboard:
    """The Exporter health dashboard."""
    grid = Grid()
    _exporter(grid)
    _scheduler(grid)
    _storage(grid)
    _scrapes(grid)
    return common.dashboard(
        title=TITLE,
        uid=UID,
        description="tokwatch's own health: build, config reloads, scheduler, storage queue/outbox, scrapes.",
        panels=grid.panels,
        variables=[
            common.datasource_variable(),
            common.query_variable("instance", "Exporter", "label_values(tokwatch_build_info, instance)"),
            common.site_variable(),
        ],
        time_from="now-6h",
    )
