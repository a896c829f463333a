"""The overview's "Cost and energy" row: measured speed against price, $/Mtok by phase and allocation method,
what the probes cost, joules per output token and the idle baseline (docs/methodology.md, "Cost and energy";
the families are in docs/metrics.md)."""

from __future__ import annotations

from dashboards.panels import (
    MIN_INTERVAL,
    POWERED,
    PRICED,
    PROBE_SPEND,
    REF_COST,
    TOKS,
    Grid,
    describe,
    prom,
    stat,
    table,
    timeseries,
    xy_chart,
)
from dashboards.promql import BY, LEGEND, SERVER_BY, SERVER_LEGEND, per_series, sel, wsel

PRICE = "tokwatch_cost_per_million_tokens"
PROBE_COST = "tokwatch_probe_cost_total"
PRICING_INFO = "tokwatch_pricing_info"
JOULES_PER_TOKEN = "tokwatch_energy_joules_per_output_token"
IDLE_WATTS = "tokwatch_energy_idle_watts"
DECODE_MEDIAN = "tokwatch_window_decode_tokens_per_second_median"

# The price a leaderboard plots for an endpoint: the published (list) price of a hosted one, and of a
# self-hosted one what a token costs at capacity, else at the probe stream's speed. One per endpoint-workload.
LEADERBOARD_METHODS = ("list_price", "capacity", "compute_time")
PER_MTOK = "suffix: /Mtok"
PRICE_FIELD = "blended price per Mtok"
SPEED_FIELD = "decode tok/s (median, $window)"
CURRENCY_LEGEND = f"{LEGEND} ({{{{currency}}}})"
PRICE_COLUMNS = ("endpoint", "site", "workload", "allocation_method", "phase", "Value", "currency")


def with_currency(expr: str) -> str:
    """`expr` with the endpoint's `currency` joined from tokwatch_pricing_info (which is 1), so every price
    names its unit."""
    info = f"max by ({SERVER_BY}, currency) ({sel(PRICING_INFO)})"
    return f"({expr}) * on ({SERVER_BY}) group_left (currency) {info}"


def leaderboard_price() -> str:
    """One blended $/Mtok per endpoint-workload, by LEADERBOARD_METHODS' order of preference."""
    return " or ".join(
        per_series(wsel(PRICE, 'phase="blended"', f'allocation_method="{method}"'))
        for method in LEADERBOARD_METHODS
    )


def series_named(expr: str) -> str:
    """`expr` with one `series` label `endpoint @ site · workload` (a point and legend entry each)."""
    named = f'label_join({expr}, "series", " @ ", "endpoint", "site")'
    return f'label_join({named}, "series", " · ", "series", "workload")'


def _speed_vs_price(grid: Grid) -> None:
    window_speed = per_series(wsel(DECODE_MEDIAN, 'window="$window"'))
    grid.add(
        xy_chart(
            "Speed vs price",
            describe(
                "One point per endpoint, site and workload: the median decode tok/s of the window's ok runs "
                "against the blended price per million tokens (input and output at 3:1 unless `pricing.blend`"
                " says otherwise), as the leaderboards plot them; right and down is dearer and slower. The "
                "price is the list price of a hosted endpoint; of a self-hosted one the price at the latest "
                "bench capacity search's rate, else at the probe stream's measured speed. Each endpoint's "
                "currency is in the prices table beside.",
                REF_COST,
                PRICED,
            ),
            [
                prom(series_named(leaderboard_price()), ref="A", instant=True, fmt="table"),
                prom(series_named(window_speed), ref="B", instant=True, fmt="table"),
            ],
            transformations=[
                {"id": "merge", "options": {}},  # one row per endpoint, site and workload
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": dict.fromkeys(
                            ("Time", "endpoint", "site", "workload", "window"), True
                        ),
                        "renameByName": {"Value #A": PRICE_FIELD, "Value #B": SPEED_FIELD},
                    },
                },
                {
                    "id": "partitionByValues",
                    "options": {"fields": ["series"], "keepFields": False, "naming": {"asLabels": False}},
                },
            ],
            x=(PRICE_FIELD, "blended price per Mtok", PER_MTOK),
            y=("decode tok/s", TOKS),
        ),
        w=12,
        h=9,
    )


def _prices_table(grid: Grid) -> None:
    grid.add(
        table(
            "Prices now",
            describe(
                "Every price per million tokens of each endpoint, site and workload, by phase (prompt, "
                "generation, blended) and allocation method: list_price (hosted, published), effective "
                "(hosted, at the cache-hit share observed over the window), compute_time (self-hosted, the "
                "probe stream's speed; prompt and generation split by prefill and decode time, OpenCost's "
                "method), capacity (self-hosted, the latest bench capacity search's rate); with the "
                "currency.",
                REF_COST,
                PRICED,
            ),
            [
                prom(
                    with_currency(per_series(wsel(PRICE), "phase", "allocation_method")),
                    instant=True,
                    fmt="table",
                )
            ],
            transformations=[
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "indexByName": {name: i for i, name in enumerate(PRICE_COLUMNS)},
                        "renameByName": {"allocation_method": "method", "Value": "per Mtok"},
                    },
                }
            ],
        ),
        w=12,
        h=9,
    )


def _price_trend(grid: Grid) -> None:
    grid.add(
        timeseries(
            "$/Mtok by phase and allocation method",
            describe(
                "Each endpoint's price per million tokens over time, one line per phase (prompt, generation, "
                "blended) and allocation method (list_price, effective, compute_time, capacity): the "
                "effective price follows the observed cache-hit share, the self-hosted ones the measured "
                "speed. OpenCost's llm_cost_per_million_tokens{phase, allocation_method} maps onto it "
                "(docs/metrics.md).",
                REF_COST,
                PRICED,
            ),
            [
                prom(
                    with_currency(per_series(wsel(PRICE), "phase", "allocation_method")),
                    f"{LEGEND} {{{{phase}}}} · {{{{allocation_method}}}} ({{{{currency}}}})",
                )
            ],
            unit=PER_MTOK,
            min_interval=MIN_INTERVAL,
        ),
        w=12,
        h=8,
    )


def _probe_spend(grid: Grid) -> None:
    spent = wsel(PROBE_COST)
    grid.add(
        timeseries(
            "Probe spend per interval",
            describe(
                "What tokwatch's own probe runs cost in each time bucket, per endpoint, site and workload, "
                "in the endpoint's currency: each run's tokens as the server counted them at the endpoint's "
                "prices.",
                REF_COST,
                PROBE_SPEND,
            ),
            [prom(with_currency(f"sum by ({BY}) (increase({spent}[$__interval]))"), CURRENCY_LEGEND)],
            unit="short",
            draw="bars",
            fill=80,
            min_interval=MIN_INTERVAL,
        ),
        w=8,
        h=8,
    )
    grid.add(
        stat(
            "Probe spend (time range)",
            describe(
                "What the probe runs cost over the dashboard's time range, per endpoint, site and workload.",
                REF_COST,
                PROBE_SPEND,
            ),
            [
                prom(
                    with_currency(f"sum by ({BY}) (increase({spent}[$__range]))"),
                    CURRENCY_LEGEND,
                    instant=True,
                )
            ],
            unit="short",
            decimals=4,
            no_value="—",
        ),
        w=4,
        h=8,
    )


def _energy(grid: Grid) -> None:
    grid.add(
        timeseries(
            "Joules per output token",
            describe(
                "Energy the endpoint's GPUs (or CPU packages) spent per output token above the measured idle "
                "baseline: the median over the window's timed runs of each run's net joules over its output "
                "tokens, from a DCGM exporter's or node_exporter's /metrics.",
                REF_COST,
                POWERED,
            ),
            [prom(per_series(wsel(JOULES_PER_TOKEN)), LEGEND)],
            unit="suffix: J/tok",
            min_interval=MIN_INTERVAL,
        ),
        w=12,
        h=8,
    )
    grid.add(
        timeseries(
            "Idle watts",
            describe(
                "The measured idle baseline of each endpoint's devices: the power they draw with no request "
                "running, taken out of every energy figure above.",
                REF_COST,
                POWERED,
            ),
            [prom(f"max by ({SERVER_BY}) ({sel(IDLE_WATTS)})", SERVER_LEGEND)],
            unit="watt",
            min_interval=MIN_INTERVAL,
        ),
        w=12,
        h=8,
    )


def cost_row(grid: Grid) -> None:
    """The "Cost and energy" row of the Endpoints overview."""
    grid.row("Cost and energy")
    _speed_vs_price(grid)
    _prices_table(grid)
    _price_trend(grid)
    _probe_spend(grid)
    _energy(grid)
