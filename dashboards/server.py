"""Dashboard 2, "tokwatch — Server counters": what the inference servers' own /metrics (and Ollama) report."""

from __future__ import annotations

from grafanalib import core as g

from dashboards import common
from dashboards.panels import (
    AMBER,
    COUNT,
    GREEN,
    MIN_INTERVAL,
    MIRRORED_COUNTERS,
    MIRRORED_GAUGES,
    OLLAMA,
    OLLAMA_RELOADED,
    PREEMPTED,
    RATIO,
    RED,
    REF_SERVER,
    SCRAPE_FAILED,
    SECONDS,
    TOKS,
    Grid,
    by_ref,
    describe,
    prom,
    stat,
    steps,
    timeseries,
    value_mapping,
)
from dashboards.promql import LEGEND, SERVER_BY, SERVER_LEGEND, per_series, sel, wsel

UID = "tokwatch-server"
TITLE = "tokwatch — Server counters"


def _per_endpoint(metric: str) -> str:
    """A server gauge per endpoint and site (server counters have no workload)."""
    return f"max by ({SERVER_BY}) ({sel(metric)})"


def _increase(metric: str, by: str = SERVER_BY, window: str = "$__interval") -> str:
    return f"sum by ({by}) (increase({sel(metric)}[{window}]))"


def _scrape(grid: Grid) -> None:
    grid.row("Server /metrics scrape")
    grid.add(
        stat(
            "Server /metrics up",
            describe(
                "1 when the last scrape of the endpoint's /metrics succeeded. When it fails the server "
                "gauges below disappear rather than showing stale values.",
                REF_SERVER,
            ),
            [prom(_per_endpoint("tokwatch_server_up"), SERVER_LEGEND, instant=True)],
            unit="none",
            mappings=value_mapping({"0": ("DOWN", RED), "1": ("UP", GREEN)}),
            color_mode="background",
        ),
        w=8,
        h=6,
    )
    grid.add(
        timeseries(
            "Scrape errors",
            describe(
                "Failed /metrics scrapes per time bucket (timeout, malformed, truncated or oversized).",
                REF_SERVER,
                SCRAPE_FAILED,
            ),
            [prom(f"{_increase('tokwatch_server_scrape_errors_total')} > 0", SERVER_LEGEND)],
            unit=COUNT,
            draw="bars",
            fill=80,
            min_interval=MIN_INTERVAL,
        ),
        w=8,
        h=6,
    )
    grid.add(
        timeseries(
            "Scrape duration",
            describe("How long the last /metrics scrape of each server took.", REF_SERVER),
            [prom(_per_endpoint("tokwatch_server_scrape_duration_seconds"), SERVER_LEGEND)],
            unit=SECONDS,
        ),
        w=8,
        h=6,
    )


def _throughput(grid: Grid) -> None:
    grid.row("Throughput (all traffic on the server, not just probes)")
    grid.add(
        timeseries(
            "Server decode tok/s",
            describe(
                "Generated tokens per second from the server's own counters over the scrape interval. "
                "Includes every client's traffic; compare with the probe's single-stream figure.",
                REF_SERVER,
            ),
            [
                prom(
                    _per_endpoint("tokwatch_server_decode_tokens_per_second"),
                    f"{SERVER_LEGEND} server",
                    ref="A",
                ),
                prom(
                    per_series(wsel("tokwatch_probe_decode_tokens_per_second")),
                    f"{LEGEND} probe (last ok run)",
                    ref="B",
                ),
            ],
            unit=TOKS,
            overrides=[by_ref("B", **{"custom.lineStyle": {"fill": "dash", "dash": [10, 10]}})],
        ),
        w=12,
        h=8,
    )
    grid.add(
        timeseries(
            "Server prefill tok/s",
            describe("Prompt tokens processed per second, from the server's counters.", REF_SERVER),
            [prom(_per_endpoint("tokwatch_server_prefill_tokens_per_second"), SERVER_LEGEND)],
            unit=TOKS,
        ),
        w=12,
        h=8,
    )


def _queue_and_cache(grid: Grid) -> None:
    grid.row("Queue and KV cache")
    grid.add(
        timeseries(
            "Requests running / waiting",
            describe(
                "Requests in the server's batch and in its queue. Waiting > 0 means probes (and users) queue "
                "before decoding starts, which shows up as TTFT.",
                REF_SERVER,
            ),
            [
                prom(_per_endpoint("tokwatch_server_requests_running"), f"{SERVER_LEGEND} running", ref="A"),
                prom(_per_endpoint("tokwatch_server_requests_waiting"), f"{SERVER_LEGEND} waiting", ref="B"),
            ],
            unit=COUNT,
            overrides=[by_ref("B", **{"custom.lineStyle": {"fill": "dash", "dash": [10, 10]}})],
        ),
        w=8,
        h=8,
    )
    grid.add(
        timeseries(
            "KV-cache usage",
            describe(
                "Fraction of the server's KV-cache blocks in use (1 = full; preemption follows).", REF_SERVER
            ),
            [prom(_per_endpoint("tokwatch_server_kv_cache_usage_ratio"), SERVER_LEGEND)],
            unit=RATIO,
        ),
        w=8,
        h=8,
    )
    grid.add(
        timeseries(
            "Prefix-cache hit ratio",
            describe("Share of prompt tokens served from the prefix cache.", REF_SERVER),
            [prom(_per_endpoint("tokwatch_server_prefix_cache_hit_ratio"), SERVER_LEGEND)],
            unit=RATIO,
        ),
        w=8,
        h=8,
    )


def _evictions(grid: Grid) -> None:
    grid.row("Preemptions, evictions, reloads")
    grid.add(
        timeseries(
            "Preemptions per bucket",
            describe(
                "Requests the server preempted (vLLM) or retracted (SGLang) per time bucket; tokwatch keeps "
                "the counter monotonic across server restarts.",
                REF_SERVER,
                PREEMPTED,
            ),
            [prom(f"{_increase('tokwatch_server_preemptions_total')} > 0", SERVER_LEGEND)],
            unit=COUNT,
            draw="bars",
            fill=80,
            min_interval=MIN_INTERVAL,
        ),
        w=12,
        h=8,
    )
    grid.add(
        timeseries(
            "Mirrored counters per bucket",
            describe(
                "Increase of extra server counters mirrored from /metrics (e.g. "
                "output_critical_eviction_events_total), by metric.",
                REF_SERVER,
                MIRRORED_COUNTERS,
            ),
            [
                prom(
                    f"{_increase('tokwatch_server_mirrored_total', by=f'{SERVER_BY}, metric')} > 0",
                    f"{SERVER_LEGEND} {{{{metric}}}}",
                )
            ],
            unit=COUNT,
            draw="bars",
            fill=80,
            min_interval=MIN_INTERVAL,
        ),
        w=12,
        h=8,
    )
    grid.add(
        timeseries(
            "Mirrored gauges",
            describe("Extra server gauges mirrored from /metrics, by metric.", REF_SERVER, MIRRORED_GAUGES),
            [
                prom(
                    f"max by ({SERVER_BY}, metric) ({sel('tokwatch_server_mirrored_value')})",
                    f"{SERVER_LEGEND} {{{{metric}}}}",
                )
            ],
            unit="none",
        ),
        w=8,
        h=8,
    )
    grid.add(
        timeseries(
            "Ollama model reloads",
            describe(
                "Hot runs that had to load the model first (load_duration > 0): the model had been evicted. "
                "Counted as evictions.",
                REF_SERVER,
                OLLAMA_RELOADED,
            ),
            [prom(f"{_increase('tokwatch_server_model_reloads_total')} > 0", SERVER_LEGEND)],
            unit=COUNT,
            draw="bars",
            fill=80,
            min_interval=MIN_INTERVAL,
        ),
        w=8,
        h=8,
    )
    grid.add(
        stat(
            "Ollama model in VRAM",
            describe(
                "size_vram / size of the loaded model from /api/ps; below 100 % part of the model runs "
                "from system memory and decode slows down.",
                REF_SERVER,
                OLLAMA,
            ),
            [prom(_per_endpoint("tokwatch_server_model_vram_ratio"), SERVER_LEGEND, instant=True)],
            unit=RATIO,
            decimals=0,
            thresholds=steps((RED, None), (AMBER, 0.9), (GREEN, 0.999)),
        ),
        w=8,
        h=8,
    )


def build() -> g.Dashboard:
    """The Server counters dashboard."""
    grid = Grid()
    _scrape(grid)
    _throughput(grid)
    _queue_and_cache(grid)
    _evictions(grid)
    return common.dashboard(
        title=TITLE,
        uid=UID,
        description="Inference servers' own counters via tokwatch: throughput, queue, KV cache, evictions.",
        panels=grid.panels,
        variables=[
            common.datasource_variable(),
            common.query_variable("endpoint", "Endpoint", "label_values(tokwatch_endpoint_info, endpoint)"),
            common.site_variable(),
            common.workload_variable(),
        ],
        time_from="now-6h",
    )
