"""Dashboard 1, "tokwatch — Endpoints overview": tiles, trend with incidents, status, latency, reasoning, cost
and energy."""

from __future__ import annotations

from grafanalib import core as g

from dashboards import common
from dashboards.cost import cost_row
from dashboards.panels import (
    AMBER,
    COUNT,
    GREEN,
    HISTOGRAMS,
    MIN_INTERVAL,
    RATIO,
    RED,
    REF_LATENCY,
    REF_NETWORK,
    REF_PERCENTILES,
    REF_STATUS,
    REF_TIMING,
    REF_TOKENS,
    REF_WINDOW,
    SECONDS,
    TOKS,
    Grid,
    bargauge,
    by_ref,
    describe,
    heatmap,
    prom,
    stacked_bars,
    stat,
    state_timeline,
    steps,
    table,
    timeseries,
    value_mapping,
)
from dashboards.promql import (
    BY,
    LEGEND,
    SERVER_BY,
    SITE,
    STATUS_CODES,
    STATUS_COLORS,
    STATUS_TEXT,
    WORKLOAD,
    histogram_mean,
    histogram_quantile,
    per_series,
    sel,
    status_code,
    with_endpoint_info,
    wsel,
)
from tokwatch.settings.config import ScheduleSettings
from tokwatch.windows.window import window_label

# Defaults follow the exporter's own defaults, so a stock install shows data without touching variables.
DEFAULT_SCHEDULE = ScheduleSettings.model_validate({})
DEFAULT_WINDOW = window_label(DEFAULT_SCHEDULE.window)

UID = "tokwatch-overview"
TITLE = "tokwatch — Endpoints overview"

IN_WINDOW = 'window="$window"'
RUN = (WORKLOAD,)  # matchers of the per-run histograms
LATENCY_WINDOW = "$latency_window"
# Network phases, in the order a request goes through them; `proxy_connect` (a CONNECT through an HTTP
# proxy) is stacked where the exporter reports it.
PHASES = ("resolve", "connect", "proxy_connect", "tls", "processing")
STATUS_LEGEND = f"{LEGEND} — {{{{kind}}}} · {{{{model}}}}"


def window_figure(metric: str) -> str:
    """A window gauge per endpoint, site and workload for the selected `$window` (24h unless configured
    otherwise)."""
    return per_series(wsel(metric, IN_WINDOW))


def status_mappings() -> list[dict[str, object]]:
    """Status code -> pill text and colour (TIMEOUT, RATE LIMITED, ...)."""
    return value_mapping(
        {str(code): (STATUS_TEXT[status], STATUS_COLORS[status]) for status, code in STATUS_CODES.items()}
    )


def failed_runs_expr(window: str) -> str:
    """Non-ok timed runs per endpoint in each `window` bucket; only buckets with failures return a sample."""
    runs = wsel("tokwatch_probe_runs_total", 'status!="ok"')
    return f"sum by ({BY}) (increase({runs}[{window}])) > 0"


def ok_tps_expr() -> str:
    """Last ok tok/s per endpoint, hidden while the latest run is not ok so the line breaks at incidents."""
    tps = per_series(wsel("tokwatch_probe_decode_tokens_per_second"))
    ok = f"{per_series(wsel('tokwatch_probe_success'))} == 1"
    return f"{tps} and on ({BY}) ({ok})"


def fleet_expr(metric: str, by: str = f"{BY}, window") -> str:
    """A fleet-wide figure: every endpoint, whatever `$endpoint` selects (the strip ranks the whole fleet),
    per site and workload (each site ranks its own measurements)."""
    return f"max by ({by}) ({metric}{{{SITE}, {WORKLOAD}}})"


def _tiles(grid: Grid) -> None:
    """Seed 000's wall: one row of tiles per endpoint, repeated over `$endpoint`."""
    grid.row("$endpoint", repeat="endpoint")
    grid.add(
        stat(
            "Status",
            describe(
                "Status of the most recent timed run (exactly one per run): an incident shows here, never as "
                "a missing tok/s number. NO RUNS until the endpoint's first run. Under it: the endpoint's "
                "kind and model.",
                REF_STATUS,
            ),
            [prom(with_endpoint_info(status_code(RUN)), STATUS_LEGEND, instant=True)],
            unit="none",
            mappings=status_mappings(),
            color_mode="background",
            text_mode="value_and_name",
            no_value="NO RUNS",
        ),
        w=3,
        h=5,
    )
    grid.add(
        stat(
            "Last ok run",
            describe(
                "Decode tok/s of the most recent ok run and its timing source (engine, vllm_metrics, "
                "server_wall, client_stream, client_wall). A single sample; it stays during an incident.",
                REF_TIMING,
            ),
            [
                prom(
                    per_series(wsel("tokwatch_probe_decode_tokens_per_second"), "source"),
                    f"{LEGEND} ({{{{source}}}})",
                    instant=True,
                )
            ],
            unit=TOKS,
            decimals=1,
            no_value="no ok run yet",
        ),
        w=4,
        h=5,
    )
    grid.add(
        stat(
            "$window median",
            describe(
                "Median tok/s of ok runs in the window (seed 000's 'avg'): median rather than mean, so "
                "routing outliers do not move it.",
                REF_WINDOW,
            ),
            [
                prom(
                    window_figure("tokwatch_window_decode_tokens_per_second_median"),
                    LEGEND,
                    instant=True,
                )
            ],
            unit=TOKS,
            decimals=1,
            no_value="—",
        ),
        w=3,
        h=5,
    )
    grid.add(
        stat(
            "CV ($window)",
            describe(
                "Coefficient of variation of ok-run tok/s: sample stddev / mean. The band: below 5 % tight "
                "(green), 5-15 % typical for shared infrastructure (amber), above 15 % jittery (red).",
                REF_WINDOW,
            ),
            [
                prom(
                    window_figure("tokwatch_window_decode_tokens_per_second_cv_ratio"),
                    LEGEND,
                    instant=True,
                )
            ],
            unit=RATIO,
            decimals=1,
            thresholds=steps((GREEN, None), (AMBER, 0.05), (RED, 0.15)),
            color_mode="background",
            no_value="— (2+ ok runs)",
        ),
        w=3,
        h=5,
    )
    grid.add(
        stat(
            "± stddev",
            describe("Sample standard deviation of ok-run tok/s in the window, in raw units.", REF_WINDOW),
            [
                prom(
                    window_figure("tokwatch_window_decode_tokens_per_second_stddev"),
                    LEGEND,
                    instant=True,
                )
            ],
            unit=TOKS,
            decimals=1,
            no_value="—",
        ),
        w=2,
        h=5,
    )
    grid.add(
        stat(
            "Uptime ($window)",
            describe(
                "ok runs / all timed runs in the window. Every non-ok status (timeout, rate_limited, "
                "provider_error, auth_failure, unreachable, degraded) lowers it.",
                REF_WINDOW,
            ),
            [prom(window_figure("tokwatch_window_uptime_ratio"), LEGEND, instant=True)],
            unit=RATIO,
            decimals=1,
            thresholds=steps((RED, None), (AMBER, 0.95), (GREEN, 0.99)),
            no_value="—",
        ),
        w=3,
        h=5,
    )
    grid.add(
        timeseries(
            "Recent runs",
            describe(
                "Sparkline: tok/s of the last ok run, breaking while the latest run is not ok; red bars mark "
                "non-ok runs in each bucket.",
                REF_TIMING,
            ),
            [
                prom(ok_tps_expr(), f"{LEGEND} tok/s", ref="A"),
                prom(failed_runs_expr("$__interval"), f"{LEGEND} failed runs", ref="B"),
            ],
            unit=TOKS,
            min_interval=MIN_INTERVAL,
            legend=False,
            overrides=[
                by_ref(
                    "B",
                    **{
                        "custom.drawStyle": "bars",
                        "custom.fillOpacity": 80,
                        "custom.axisPlacement": "hidden",
                        "color": {"mode": "fixed", "fixedColor": "red"},
                        "unit": COUNT,
                        "decimals": 0,
                    },
                )
            ],
        ),
        w=6,
        h=5,
    )


_PERCENTILES = (
    (
        "Decode tok/s p50 / p90 / p99 ($window)",
        "tokwatch_window_decode_percentile_tokens_per_second",
        "tok/s of the ok runs the window counts",
        TOKS,
    ),
    (
        "Prefill tok/s p50 / p90 / p99 ($window)",
        "tokwatch_window_prefill_percentile_tokens_per_second",
        "prefill tok/s of the ok runs the prefix cache did not help",
        TOKS,
    ),
    (
        "TTFT p50 / p90 / p99 ($window)",
        "tokwatch_window_ttft_percentile_seconds",
        "TTFT of the ok runs the prefix cache did not help",
        SECONDS,
    ),
)


def _percentiles(grid: Grid) -> None:
    """p50/p90/p99 over the selected window (one sample per run, as Artificial Analysis' and OpenRouter's
    published percentiles), with the sample counts beside them."""
    grid.row("Percentiles over $window")
    for title, metric, what, unit in _PERCENTILES:
        grid.add(
            timeseries(
                title,
                describe(
                    f"Percentiles of the {what} in the window, one sample per run (linear interpolation). "
                    "p90 appears from 10 samples, p99 from 100: below that the series is absent, not "
                    "guessed. The sample counts are in the table beside.",
                    REF_PERCENTILES,
                ),
                [
                    prom(
                        per_series(wsel(metric, IN_WINDOW), "percentile"),
                        f"{LEGEND} p{{{{percentile}}}}",
                    )
                ],
                unit=unit,
                min_interval=MIN_INTERVAL,
            ),
            w=6,
            h=8,
        )
    counts = (
        ("tokwatch_window_decode_samples", "decode"),
        ("tokwatch_window_prefill_samples", "prefill"),
        ("tokwatch_window_ttft_samples", "TTFT"),
    )
    refs = "ABC"
    grid.add(
        table(
            "Samples behind the percentiles ($window)",
            describe(
                "How many runs each endpoint's percentiles are taken over in the window: the count "
                "OpenRouter publishes beside each percentile.",
                REF_PERCENTILES,
            ),
            [
                prom(window_figure(metric), ref=ref, instant=True, fmt="table")
                for ref, (metric, _) in zip(refs, counts, strict=True)
            ],
            transformations=[
                {"id": "merge", "options": {}},  # one row per endpoint, site and workload
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "indexByName": {"endpoint": 0, "site": 1, "workload": 2},
                        "renameByName": {
                            f"Value #{ref}": name for ref, (_, name) in zip(refs, counts, strict=True)
                        },
                    },
                },
            ],
        ),
        w=6,
        h=8,
    )


def _comparison(grid: Grid) -> None:
    """Seed 000's comparison strip over the whole fleet: ranked 7-day medians and each neighbouring pair."""
    grid.row("Comparison — 7-day median of ok runs, whole fleet, per site and workload")
    grid.add(
        bargauge(
            "Ranking (7-day median tok/s)",
            describe(
                "Every endpoint with an ok run in 7 days, fastest first, each site's and workload's "
                "ranking apart. A longer window than the tiles, so one bad hour does not reorder it.",
                REF_WINDOW,
            ),
            [
                prom(
                    f"sort_desc({fleet_expr('tokwatch_fleet_median_tokens_per_second')})",
                    LEGEND,
                    instant=True,
                )
            ],
            unit=TOKS,
            thresholds=steps((GREEN, None)),
        ),
        w=12,
        h=8,
    )
    grid.add(
        table(
            "X is N % faster than the next",
            describe(
                "Each endpoint against the next slower one in its site's and workload's ranking (the row "
                "below it): 7-day median ratio - 1.",
                REF_WINDOW,
            ),
            [
                prom(
                    f"{fleet_expr('tokwatch_fleet_faster_than_next_ratio')} - 1",
                    "",
                    ref="A",
                    instant=True,
                    fmt="table",
                ),
                prom(fleet_expr("tokwatch_fleet_rank"), "", ref="B", instant=True, fmt="table"),
            ],
            transformations=[
                {"id": "merge", "options": {}},
                {"id": "sortBy", "options": {"sort": [{"field": "Value #B"}]}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True, "window": True},
                        "indexByName": {
                            "site": 0,
                            "workload": 1,
                            "Value #B": 2,
                            "endpoint": 3,
                            "Value #A": 4,
                        },
                        "renameByName": {
                            "site": "Site",
                            "workload": "Workload",
                            "Value #B": "Rank",
                            "endpoint": "Endpoint",
                            "Value #A": "is faster than the next by",
                        },
                    },
                },
            ],
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "is faster than the next by"},
                    "properties": [{"id": "unit", "value": "percentunit"}, {"id": "decimals", "value": 0}],
                }
            ],
        ),
        w=8,
        h=8,
    )
    grid.add(
        stat(
            "Fastest vs slowest",
            describe(
                "How much faster the fastest endpoint is than the slowest, by 7-day median tok/s of ok runs "
                "(fastest / slowest - 1), per site and workload; which endpoints they are is the top and the "
                "bottom of the ranking beside.",
                REF_WINDOW,
            ),
            [
                prom(
                    f"{fleet_expr('tokwatch_fleet_fastest_vs_slowest_ratio', 'site, workload, window')} - 1",
                    "fastest vs slowest @ {{site}} · {{workload}}",
                    instant=True,
                )
            ],
            unit=RATIO,
            decimals=0,
        ),
        w=4,
        h=8,
    )


def _trend(grid: Grid) -> None:
    grid.row("Trend and incidents")
    grid.add(
        timeseries(
            "Decode tok/s and failed runs",
            describe(
                "Lines: tok/s of the last ok run per endpoint; the line breaks while the latest run is not "
                "ok. Red bars (right axis): non-ok runs in each time bucket, so incidents stay visible.",
                REF_TIMING,
            ),
            [
                prom(ok_tps_expr(), LEGEND, ref="A"),
                prom(failed_runs_expr("$__interval"), f"{LEGEND} failed runs", ref="B"),
            ],
            unit=TOKS,
            min_interval=MIN_INTERVAL,
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
        state_timeline(
            "Status timeline",
            describe("Status of the latest run per endpoint over time.", REF_STATUS),
            [prom(status_code(RUN), LEGEND)],
            mappings=status_mappings(),
            min_interval=MIN_INTERVAL,
        ),
        w=24,
        h=7,
    )


def _latency(grid: Grid) -> None:
    grid.row("Latency")
    grid.add(
        timeseries(
            "TTFT per run and p50 ($window)",
            describe(
                "Time to first token: request sent to the first content or reasoning token. Points: each "
                "endpoint's last run (tokwatch_probe_ttft_seconds, one sample per run); dashed: the exact "
                "p50 over the window's runs (tokwatch_window_ttft_percentile_seconds, not a histogram "
                "estimate).",
                REF_LATENCY,
            ),
            [
                prom(per_series(wsel("tokwatch_probe_ttft_seconds")), f"{LEGEND} last run", ref="A"),
                prom(
                    per_series(wsel("tokwatch_window_ttft_percentile_seconds", IN_WINDOW, 'percentile="50"')),
                    f"{LEGEND} p50 ($window)",
                    ref="B",
                ),
            ],
            unit=SECONDS,
            points="always",
            min_interval=MIN_INTERVAL,
            overrides=[by_ref("B", **{"custom.lineStyle": {"fill": "dash", "dash": [10, 10]}})],
        ),
        w=12,
        h=8,
    )
    grid.add(
        timeseries(
            "E2E latency per run",
            describe(
                "Request sent to last byte of each endpoint's last completed run "
                "(tokwatch_probe_e2e_seconds), and the run's wall time until it completed or failed "
                "(tokwatch_probe_duration_seconds, dashed).",
                REF_LATENCY,
            ),
            [
                prom(per_series(wsel("tokwatch_probe_e2e_seconds")), LEGEND, ref="A"),
                prom(per_series(wsel("tokwatch_probe_duration_seconds")), f"{LEGEND} duration", ref="B"),
            ],
            unit=SECONDS,
            points="always",
            overrides=[by_ref("B", **{"custom.lineStyle": {"fill": "dash", "dash": [10, 10]}})],
        ),
        w=12,
        h=8,
    )

    def quantiles(histogram: str, qs: tuple[float, ...]) -> list[g.Target]:
        refs = "ABCDEFG"
        return [
            prom(
                histogram_quantile(q, histogram, LATENCY_WINDOW, matchers=RUN),
                f"{LEGEND} p{q * 100:g}",
                ref=refs[i],
            )
            for i, q in enumerate(qs)
        ]

    grid.add(
        timeseries(
            "Inter-token latency p50 / p99 (histogram)",
            describe(
                "Gap before each token after the first; a chunk of k tokens counts its gap once and k-1 "
                "zero gaps (tokwatch_inter_token_latency_seconds over $latency_window; bucket boundaries "
                "1 ms … 10 s).",
                REF_LATENCY,
                HISTOGRAMS,
            ),
            quantiles("tokwatch_inter_token_latency_seconds", (0.5, 0.99)),
            unit=SECONDS,
        ),
        w=8,
        h=8,
    )
    grid.add(
        timeseries(
            "TPOT p50 / p95 / mean (histogram)",
            describe(
                "Time per output token per run: (E2E - TTFT) / (tokens - 1) "
                "(tokwatch_time_per_output_token_seconds over $latency_window); mean = histogram sum / "
                "count.",
                REF_LATENCY,
                HISTOGRAMS,
            ),
            [
                *quantiles("tokwatch_time_per_output_token_seconds", (0.5, 0.95)),
                prom(
                    histogram_mean("tokwatch_time_per_output_token_seconds", LATENCY_WINDOW, matchers=RUN),
                    f"{LEGEND} mean",
                    ref="C",
                ),
            ],
            unit=SECONDS,
        ),
        w=8,
        h=8,
    )
    grid.add(_last_run_table(), w=8, h=8)
    itl_buckets = wsel("tokwatch_inter_token_latency_seconds_bucket")
    grid.add(
        heatmap(
            "Inter-token latency distribution (histogram)",
            describe(
                "How the per-token gaps of the selected endpoints spread over the histogram buckets in "
                "each time bucket; darker = more tokens. Stalls show as cells high above the band.",
                REF_LATENCY,
                HISTOGRAMS,
            ),
            f"sum by (le) (increase({itl_buckets}[$__interval]))",
            unit=SECONDS,
        ),
        w=24,
        h=8,
    )


def _last_run_table() -> g.Table:
    columns = [
        ("tokwatch_probe_ttft_seconds", "TTFT", SECONDS),
        ("tokwatch_probe_e2e_seconds", "E2E", SECONDS),
        ("tokwatch_probe_duration_seconds", "Duration", SECONDS),
        ("tokwatch_probe_output_tokens", "Output tokens", COUNT),
        ("tokwatch_probe_think_tokens", "Think tokens", COUNT),
    ]
    refs = "ABCDE"
    targets = [
        prom(per_series(wsel(metric)), ref=ref, instant=True, fmt="table")
        for ref, (metric, _, _) in zip(refs, columns, strict=True)
    ]
    rename = {f"Value #{ref}": name for ref, (_, name, _) in zip(refs, columns, strict=True)}
    return table(
        "Last run",
        describe("Figures of each endpoint's most recent run (any status that produced them).", REF_STATUS),
        targets,
        transformations=[
            {"id": "merge", "options": {}},  # one row per endpoint, site and workload
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "indexByName": {"endpoint": 0, "site": 1, "workload": 2},
                    "renameByName": rename,
                },
            },
        ],
        overrides=[
            {
                "matcher": {"id": "byName", "options": name},
                "properties": [{"id": "unit", "value": unit}],
            }
            for _, name, unit in columns
        ],
    )


def phases_expr() -> str:
    """The last run's network phases per endpoint, site and workload, with one `series` label naming the
    three (a bar of the stacked chart each)."""
    phases = 'phase=~"' + "|".join(PHASES) + '"'
    figures = per_series(wsel("tokwatch_probe_phase_seconds", phases), "phase")
    named = f'label_join({figures}, "series", " @ ", "endpoint", "site")'
    return f'label_join({named}, "series", " · ", "series", "workload")'


def _network(grid: Grid) -> None:
    grid.row("Network phases (last run)")
    grid.add(
        stacked_bars(
            "Network phases per endpoint",
            describe(
                "Where the last run's time to first byte went, stacked per endpoint, site and workload: DNS "
                "resolve, TCP connect, proxy CONNECT (only through a proxy), TLS handshake, and processing "
                "(request sent to first response byte: the server's queue and prefill plus one network "
                "round trip). Resolve, connect and TLS are the time the round spent opening the connection "
                "the run was sent on: 0 when it was kept open from an earlier round.",
                REF_NETWORK,
            ),
            [prom(phases_expr(), ref="A", instant=True, fmt="table")],
            unit=SECONDS,
            x_field="series",
            transformations=[
                {
                    "id": "groupingToMatrix",
                    "options": {
                        "columnField": "phase",
                        "rowField": "series",
                        "valueField": "Value",
                        "emptyValue": "null",
                    },
                },
                {
                    "id": "organize",
                    "options": {
                        "renameByName": {"series\\phase": "series"},
                        "indexByName": {"series\\phase": 0, **{p: i for i, p in enumerate(PHASES, start=1)}},
                    },
                },
            ],
        ),
        w=24,
        h=8,
    )


def _reasoning(grid: Grid) -> None:
    grid.row("Reasoning endpoints")
    grid.add(
        timeseries(
            "TTOT per run",
            describe(
                "Time to first output token after the reasoning phase: last reasoning token to first "
                "answer token of each reasoning endpoint's last run (tokwatch_probe_ttot_seconds). Only "
                "reasoning endpoints report it.",
                REF_LATENCY,
            ),
            [prom(per_series(wsel("tokwatch_probe_ttot_seconds")), LEGEND)],
            unit=SECONDS,
            points="always",
        ),
        w=8,
        h=8,
    )
    grid.add(
        timeseries(
            "Output-phase inter-token latency p50 / p99 (histogram)",
            describe(
                "Inter-token gaps of the answer phase only, so a fast reasoning phase cannot hide a slow "
                "answer (tokwatch_output_inter_token_latency_seconds over $latency_window).",
                REF_LATENCY,
                HISTOGRAMS,
            ),
            [
                prom(
                    histogram_quantile(
                        0.5, "tokwatch_output_inter_token_latency_seconds", LATENCY_WINDOW, matchers=RUN
                    ),
                    f"{LEGEND} p50",
                ),
                prom(
                    histogram_quantile(
                        0.99, "tokwatch_output_inter_token_latency_seconds", LATENCY_WINDOW, matchers=RUN
                    ),
                    f"{LEGEND} p99",
                    ref="B",
                ),
            ],
            unit=SECONDS,
        ),
        w=8,
        h=8,
    )
    think = f"{per_series(wsel('tokwatch_probe_think_tokens'))} > 0"
    grid.add(
        timeseries(
            "Think vs output tokens (last run)",
            describe(
                "Reasoning tokens and answer tokens of each reasoning endpoint's latest completed run.",
                REF_TOKENS,
            ),
            [
                prom(think, f"{LEGEND} think"),
                prom(
                    f"{per_series(wsel('tokwatch_probe_output_tokens'))} and on ({BY}) ({think})",
                    f"{LEGEND} output",
                    ref="B",
                ),
            ],
            unit=COUNT,
            points="never",
        ),
        w=8,
        h=8,
    )


def _inventory(grid: Grid) -> None:
    grid.row("Endpoints")
    grid.add(
        table(
            "Probed endpoints",
            "What each endpoint is, at each site: probe kind and model, from tokwatch_endpoint_info "
            "(config).",
            [
                prom(
                    f"max by ({SERVER_BY}, kind, model) ({sel('tokwatch_endpoint_info')})",
                    instant=True,
                    fmt="table",
                )
            ],
            transformations=[
                {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}},
            ],
        ),
        w=24,
        h=6,
    )


def build() -> g.Dashboard:
    """The Endpoints overview dashboard."""
    grid = Grid()
    _tiles(grid)
    _percentiles(grid)
    _comparison(grid)
    _trend(grid)
    _latency(grid)
    _network(grid)
    _reasoning(grid)
    cost_row(grid)
    _inventory(grid)
    failed = wsel("tokwatch_probe_runs_total", 'status!="ok"')
    return common.dashboard(
        title=TITLE,
        uid=UID,
        description="Per-endpoint decode tok/s, variance, uptime, status and latency from tokwatch probes, "
        "per site and workload.",
        panels=grid.panels,
        variables=[
            common.datasource_variable(),
            common.query_variable("endpoint", "Endpoint", "label_values(tokwatch_endpoint_info, endpoint)"),
            common.site_variable(),
            common.workload_variable(),
            common.query_variable(
                "window",
                "Window",
                "label_values(tokwatch_window_runs, window)",
                multi=False,
                default=DEFAULT_WINDOW,
            ),
            common.custom_variable(
                "latency_window", "Latency window (histograms)", ["1h", "6h", "24h", "7d"], DEFAULT_WINDOW
            ),
        ],
        annotations=[
            common.prometheus_annotation(
                "Failed runs",
                f"sum by ({BY}, status) (increase({failed}[5m])) > 0",
                title="{{status}}",
                text="{{endpoint}} @ {{site}} · {{workload}}",
                tags="endpoint,site,workload,status",
                color="red",
            )
        ],
        time_from="now-24h",
    )
