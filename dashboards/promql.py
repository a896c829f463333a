"""PromQL builders shared by the dashboards: selectors, safe division, quantiles, the status code."""

from __future__ import annotations

from tokwatch.figures.result import Status

ENDPOINT = 'endpoint=~"$endpoint"'
# Every per-endpoint family carries `site` when the exporter has one (none otherwise: `site=~".*"`, the
# variable's All, also matches a series without the label).
SITE = 'site=~"$site"'
# Per-run, window and fleet families carry `workload`; several may be selected, so every aggregation keeps
# `workload` apart (BY) and never folds a 10k-token prompt's figures into a 100-token one's.
WORKLOAD = 'workload=~"$workload"'

# What per-endpoint aggregations keep apart: an endpoint measured from two sites is two lines, each
# workload another (server counters have no workload: SERVER_BY).
BY = "endpoint, site, workload"
SERVER_BY = "endpoint, site"
LEGEND = "{{endpoint}} @ {{site}} · {{workload}}"
SERVER_LEGEND = "{{endpoint}} @ {{site}}"

# Status -> numeric state, so one series per endpoint can drive a stat pill and a state timeline.
# Order follows tokwatch.figures.result.Status; the codes are part of the dashboards' value mappings.
STATUS_CODES: dict[Status, int] = {status: code for code, status in enumerate(Status, start=1)}
STATUS_TEXT: dict[Status, str] = {status: status.value.replace("_", " ").upper() for status in Status}
STATUS_COLORS: dict[Status, str] = {
    Status.OK: "green",
    Status.TIMEOUT: "red",
    Status.RATE_LIMITED: "orange",
    Status.PROVIDER_ERROR: "red",
    Status.AUTH_FAILURE: "purple",
    Status.UNREACHABLE: "dark-red",
    Status.DEGRADED: "yellow",
}


def sel(metric: str, *matchers: str) -> str:
    """`metric{endpoint=~"$endpoint", site=~"$site", ...}`: every per-endpoint query honours the endpoint
    and site variables."""
    return f"{metric}{{{', '.join((ENDPOINT, SITE, *matchers))}}}"


def wsel(metric: str, *matchers: str) -> str:
    """`sel` of the selected `$workload` too: for families with a `workload` label (every per-run, window
    and fleet family; not tokwatch_endpoint_info)."""
    return sel(metric, WORKLOAD, *matchers)


def divide(numerator: str, denominator: str) -> str:
    """`a / (b > 0)`: drops the series instead of drawing NaN or +Inf while the denominator is idle."""
    return f"({numerator}) / (({denominator}) > 0)"


def per_series(expr: str, *labels: str) -> str:
    """`max by (endpoint, site, workload, *labels)` of a per-run or window selector: one series per
    endpoint, site and workload (`max` folds only exporter shards and replicas, which report the same
    figure)."""
    return f"max by ({', '.join((BY, *labels))}) ({expr})"


def histogram_quantile(
    q: float, histogram: str, window: str, by: str = BY, matchers: tuple[str, ...] = ()
) -> str:
    """Quantile `q` of a per-endpoint histogram over `window` (a range like `$latency_window`)."""
    buckets = sel(f"{histogram}_bucket", *matchers)
    return f"histogram_quantile({q:g}, sum by (le, {by}) (increase({buckets}[{window}])))"


def histogram_mean(histogram: str, window: str, by: str = BY, matchers: tuple[str, ...] = ()) -> str:
    """Mean of a histogram's observations over `window`, per endpoint (NaN-free when nothing was observed)."""
    return divide(
        f"sum by ({by}) (increase({sel(histogram + '_sum', *matchers)}[{window}]))",
        f"sum by ({by}) (increase({sel(histogram + '_count', *matchers)}[{window}]))",
    )


def status_code(matchers: tuple[str, ...] = ()) -> str:
    """One series per endpoint, site and workload whose value is STATUS_CODES[last run's status]."""
    terms = []
    for status, code in STATUS_CODES.items():
        selector = sel("tokwatch_probe_status", *matchers, f'status="{status.value}"')
        terms.append(f"(({selector} == 1) * {code})")
    return f"max by ({BY}) (" + " or ".join(terms) + ")"


def with_endpoint_info(expr: str) -> str:
    """`expr` per endpoint and site with the endpoint's `kind` and `model` labels joined from
    tokwatch_endpoint_info, so a tile can name what it measures (the info series is 1; `max by` folds shards
    and instances)."""
    info = f"max by ({SERVER_BY}, kind, model) ({sel('tokwatch_endpoint_info')})"
    return f"({expr}) * on ({SERVER_BY}) group_left (kind, model) {info}"
