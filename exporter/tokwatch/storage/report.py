"""`tokwatch report`: per-series figures from the store (endpoint x workload x site, every site side by side),
as a table, JSON or Markdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from tokwatch.figures.cost_window import median_joules_per_output_token
from tokwatch.figures.series import DEFAULT_WORKLOAD, NO_SITE
from tokwatch.storage.base import RunPoint, RunStore
from tokwatch.storage.network_time import NetworkTime, network_time
from tokwatch.storage.window import WINDOW_S, window_figures
from tokwatch.windows.window import FleetComparison, WindowFigures, primary_ranking, rank_series, window_label
from tokwatch.windows.window_percentiles import MIN_SAMPLES, QUANTILES, Percentiles, percentile_label
from tokwatch.windows.window_rule import WindowRule


@dataclass(frozen=True, slots=True)
class PercentileReport:
    """p50/p90/p99 of one figure over one window (None below its minimum sample count) and the count."""

    samples: int
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, p: Percentiles) -> PercentileReport:
        """From window figures' percentiles."""
        return cls(p.samples, p.p50, p.p90, p.p99)


@dataclass(frozen=True, slots=True)
class WindowReport:
    """One series' figures over one configured window: uptime and the percentiles with their counts."""

    window: str
    runs: int
    uptime: float | None
    decode_tokens_per_second: PercentileReport
    prefill_tokens_per_second: PercentileReport
    ttft_seconds: PercentileReport

    @classmethod
    def of(cls, f: WindowFigures) -> WindowReport:
        """From one window's figures."""
        return cls(
            f.window,
            f.runs,
            f.uptime,
            PercentileReport.of(f.decode_percentiles),
            PercentileReport.of(f.prefill_percentiles),
            PercentileReport.of(f.ttft_percentiles),
        )


@dataclass(frozen=True, slots=True)
class CostReport:
    """A series' cost and energy over its counted runs of the last 24 h (docs/methodology.md, "Cost and
    energy"): what the probe runs cost, the newest priced run's blended $/Mtok and its method, the median
    J/output token above idle and the newest run's idle baseline."""

    runs_cost: float | None
    currency: str | None
    blended_per_mtok: float | None
    allocation_method: str | None
    joules_per_output_token: float | None
    idle_watts: float | None

    @classmethod
    def of(cls, runs: Sequence[RunPoint]) -> CostReport | None:
        """From the series' runs, newest first; None when none was priced or metered."""
        priced = [r for r in runs if r.cost is not None]
        metered = next((r for r in runs if r.energy_j is not None), None)
        if not priced and metered is None:
            return None
        newest = priced[0] if priced else None
        return cls(
            runs_cost=sum(r.cost or 0.0 for r in priced) if priced else None,
            currency=newest.cost_currency if newest else None,
            blended_per_mtok=newest.cost_blended_per_mtok if newest else None,
            allocation_method=newest.cost_method if newest else None,
            joules_per_output_token=median_joules_per_output_token(runs),
            idle_watts=metered.energy_idle_watts if metered else None,
        )


@dataclass(frozen=True, slots=True)
class EndpointReport:
    """One report line: one endpoint's runs of one workload from one site."""

    endpoint: str
    last_run_at: float | None
    last_status: str | None
    last_ok_at: float | None
    last_tokens_per_second: float | None
    median_24h: float | None
    stddev_24h: float | None
    cv_24h: float | None
    cv_band: str | None
    uptime_24h: float | None
    runs_24h: int
    median_since: float | None
    uptime_since: float | None
    runs_since: int
    # Of runs_24h: runs with a client-timed figure set aside (the exporter ran late: a busy host), and ok
    # runs whose tok/s was among them (left out of the median, CV and stddev).
    set_aside_24h: int = 0
    tps_set_aside_24h: int = 0
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE
    prefill_median_24h: float | None = None
    cache_assisted_24h: int = 0
    prompt_size_missed_24h: int = 0
    windows: list[WindowReport] = field(default_factory=list)  # every configured window, shortest first
    network_24h: NetworkTime | None = (
        None  # network vs server time over the 24 h runs (tokwatch.storage.network_time)
    )
    cost_24h: CostReport | None = None  # cost and energy of the 24 h runs, where priced or metered


@dataclass(frozen=True, slots=True)
class Report:
    """Everything `tokwatch report` prints; `comparison` is the primary workload's (seed000's when it is
    measured), `comparisons` every workload's and site's."""

    generated_at: float
    since: str
    backend: str
    location: str
    endpoints: list[EndpointReport]
    comparison: FleetComparison | None
    comparisons: list[FleetComparison] = field(default_factory=list)


async def build_report(
    store: RunStore, now: float, since_s: float, *, rule: WindowRule, windows_s: Sequence[float] = ()
) -> Report:
    """Last run, 24 h figures, the `--since` window (median, uptime, fleet comparison) and the percentiles
    over each of `windows_s` per series; the figures over the runs `rule` counts, as on /metrics and the
    status page."""
    label = window_label(since_s)
    day = await window_figures(store, now, rule=rule, window_s=WINDOW_S)
    period = await window_figures(store, now, rule=rule, window_s=since_s)
    per_window = await asyncio.gather(*(window_figures(store, now, rule=rule, window_s=s) for s in windows_s))
    last = await store.last_runs(now - since_s)
    day_runs = await store.recent_runs(now - WINDOW_S, None, rule=rule)
    keys = sorted(set(day) | set(period) | set(last))
    rows = []
    for key in keys:
        d, p, lr = day.get(key), period.get(key), last.get(key)
        windows = [WindowReport.of(f) for figures in per_window if (f := figures.get(key)) is not None]
        rows.append(
            EndpointReport(
                endpoint=key.endpoint,
                workload=key.workload,
                site=key.site,
                last_run_at=lr.time if lr else None,
                last_status=lr.status if lr else None,
                last_ok_at=lr.ok_time if lr else None,
                last_tokens_per_second=lr.ok_tokens_per_second if lr else None,
                median_24h=d.median if d else None,
                stddev_24h=d.stddev if d else None,
                cv_24h=d.cv if d else None,
                cv_band=d.band if d else None,
                uptime_24h=d.uptime if d else None,
                runs_24h=d.runs if d else 0,
                median_since=p.median if p else None,
                uptime_since=p.uptime if p else None,
                runs_since=p.runs if p else 0,
                set_aside_24h=d.disturbed_runs if d else 0,
                tps_set_aside_24h=d.tps_set_aside if d else 0,
                prefill_median_24h=d.prefill_median if d else None,
                cache_assisted_24h=d.cache_assisted_runs if d else 0,
                prompt_size_missed_24h=d.prompt_size_missed_runs if d else 0,
                windows=windows,
                network_24h=network_time(day_runs.get(key, ())),
                cost_24h=CostReport.of(day_runs.get(key, [])),
            )
        )
    rankings = rank_series(period, label)
    comparisons = [c for r in rankings if (c := r.extremes) is not None]
    primary = primary_ranking(rankings, label).extremes
    return Report(now, label, store.backend, store.location, rows, primary, comparisons)


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _age(now: float, t: float | None) -> str:
    if t is None:
        return "-"
    s = max(0.0, now - t)
    if s < 120:
        return f"{s:.0f}s ago"
    if s < 7200:
        return f"{s / 60:.0f}m ago"
    if s < 172800:
        return f"{s / 3600:.0f}h ago"
    return f"{s / 86400:.0f}d ago"


def _since_shown_elsewhere(report: Report) -> bool:
    """The `--since` window's median and uptime are the 24 h columns, or a row of the percentile table
    (its decode p50 is the median): then they are not printed twice."""
    return report.since == "24h" or any(w.window == report.since for r in report.endpoints for w in r.windows)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _network(r: EndpointReport) -> list[str]:
    """24 h medians: the network round trip (with the set-up phases, where measured) and the server time."""
    n = r.network_24h
    if n is None:
        return ["-", "-"]
    setup = [f"{name} {_ms(v)}" for name, v in (("dns", n.resolve_s), ("tls", n.tls_s)) if v]
    rtt = _ms(n.network_rtt_s) + (f" ({', '.join(setup)})" if setup else "")
    return [rtt, _ms(n.server_s)]


def _cells(report: Report) -> tuple[list[str], list[list[str]]]:
    sites = any(r.site for r in report.endpoints)
    costs = any(r.cost_24h is not None for r in report.endpoints)
    since = [] if _since_shown_elsewhere(report) else [f"{report.since} median", f"uptime {report.since}"]
    head = [
        "endpoint",
        "workload",
        *(["site"] if sites else []),
        "last tok/s",
        "last run",
        "status",
        "24h median",
        "CV",
        "stddev",
        "uptime 24h",
        "runs 24h",
        "set aside 24h",
        "prefill 24h",
        "network ms 24h",
        "server ms 24h",
        *since,
        *(COST_HEAD if costs else []),
    ]
    body = []
    for r in report.endpoints:
        cv = "-" if r.cv_24h is None else f"{r.cv_24h * 100:.1f}% {r.cv_band}"
        body.append(
            [
                r.endpoint,
                r.workload,
                *([r.site or "-"] if sites else []),
                _num(r.last_tokens_per_second),
                _age(report.generated_at, r.last_run_at),
                r.last_status or "-",
                _num(r.median_24h),
                cv,
                _num(r.stddev_24h, ".2f"),
                _pct(r.uptime_24h),
                str(r.runs_24h),
                _set_aside(r),
                "n/a" if r.workload == DEFAULT_WORKLOAD else _num(r.prefill_median_24h, ".0f") + _flags(r),
                *_network(r),
                *([_num(r.median_since), _pct(r.uptime_since)] if since else []),
                *(_cost_cells(r.cost_24h) if costs else []),
            ]
        )
    return head, body


# The cost and energy columns, shown only when some series was priced or metered.
COST_HEAD = ["probe cost 24h", "$/Mtok blended", "J/out tok 24h", "idle W"]


def _cost_cells(c: CostReport | None) -> list[str]:
    if c is None:
        return ["-"] * len(COST_HEAD)
    money = "-" if c.runs_cost is None else f"{c.runs_cost:.4f} {c.currency}"
    method = {"compute_time": " (compute)", "list_price": " (list)"}.get(c.allocation_method or "", "")
    blended = "-" if c.blended_per_mtok is None else f"{c.blended_per_mtok:.3f}{method}"
    return [money, blended, _num(c.joules_per_output_token, ".3f"), _num(c.idle_watts, ".0f")]


def _set_aside(r: EndpointReport) -> str:
    """'2 (tok/s 1)': runs with client timing set aside, and how many of them lost their tok/s sample."""
    if not r.set_aside_24h:
        return "-" if not r.runs_24h else "0"
    return f"{r.set_aside_24h}" + (f" (tok/s {r.tps_set_aside_24h})" if r.tps_set_aside_24h else "")


_FIGURES = (
    ("decode tok/s", "decode_tokens_per_second", ".1f"),
    ("prefill tok/s", "prefill_tokens_per_second", ".0f"),
    ("TTFT s", "ttft_seconds", ".3f"),
)


def _percentile_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per series and window: runs, uptime and each figure's p50/p90/p99 with its sample count."""
    sites = any(r.site for r in report.endpoints)
    qs = "/".join(f"p{percentile_label(q)}" for q in QUANTILES)
    head = [
        "endpoint",
        "workload",
        *(["site"] if sites else []),
        "window",
        "runs",
        "uptime",
        *(f"{name} {qs} (n)" for name, _, _ in _FIGURES),
    ]
    body = []
    for r in report.endpoints:
        for w in r.windows:
            cells = []
            for _, attr, fmt in _FIGURES:
                p: PercentileReport = getattr(w, attr)
                values = "/".join(_num(v, fmt) for v in (p.p50, p.p90, p.p99))
                cells.append(f"{values} ({p.samples})")
            site = [r.site or "-"] if sites else []
            body.append([r.endpoint, r.workload, *site, w.window, str(w.runs), _pct(w.uptime), *cells])
    return head, body


def _flags(r: EndpointReport) -> str:
    """Runs counted apart in the 24 h window: cache-assisted (c) and prompt size missed (s)."""
    marks = [f"{n}{mark}" for n, mark in ((r.cache_assisted_24h, "c"), (r.prompt_size_missed_24h, "s")) if n]
    return f" ({' '.join(marks)})" if marks else ""


def _footer(report: Report) -> str:
    when = datetime.fromtimestamp(report.generated_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [c.text() for c in report.comparisons]
    line = "\n".join(lines) if lines else "comparison: fewer than two endpoints with ok runs"
    where = f"{report.backend} {report.location}, {when}"
    flags = (
        "prefill 24h: median prefill tok/s; (Nc) cache-assisted runs, (Ns) prompt size missed; n/a for "
        "seed000, whose few dozen prompt tokens over a TTFT of request overhead are no prefill measurement. "
        "network/server ms 24h: medians of the network round trip (dns, tls: the set-up where a round opened "
        "its connection) and of TTFT less it (docs/methodology.md, Network phases)."
    )
    shown = ", ".join(f"p{percentile_label(q)} from {n}" for q, n in MIN_SAMPLES.items())
    pct = f"Percentiles: linear interpolation, shown from a number of samples ({shown}), (n) samples."
    busy = ""
    if any(r.cost_24h is not None for r in report.endpoints):
        busy += (
            "\ncost and energy (docs/methodology.md, Cost and energy): probe cost 24h, what the counted "
            "probe runs cost; $/Mtok blended of the newest priced run (list: hosted list price; compute: "
            "self-hosted by compute time); J/out tok 24h, median energy above the idle baseline per output "
            "token; idle W, the baseline."
        )
    if any(r.set_aside_24h for r in report.endpoints):
        busy += (
            "\nset aside: runs whose client timing the exporter's own lateness (a busy host) could have "
            "moved beyond the tolerance; their status and uptime count, a tok/s set aside is not a sample."
        )
    return f"{line}\nCV bands: <5% tight, 5-15% typical, >15% jittery. {flags}\n{pct} {where}{busy}"


def _aligned(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [head, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def render_table(report: Report) -> str:
    """Aligned plain-text tables (the series, then their percentiles per window) plus the comparison."""
    head, body = _cells(report)
    lines = _aligned(head, body)
    if not body:
        lines.append("(no runs stored in this window)")
    pct_head, pct_body = _percentile_cells(report)
    if pct_body:
        lines += ["", *_aligned(pct_head, pct_body)]
    return "\n".join(lines) + "\n\n" + _footer(report) + "\n"


def _markdown(head: list[str], body: list[list[str]]) -> list[str]:
    rows = ["| " + " | ".join(r) + " |" for r in body]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows]


def render_markdown(report: Report) -> str:
    """GitHub-flavoured Markdown tables (series, percentiles per window) plus the comparison line."""
    lines = _markdown(*_cells(report))
    pct_head, pct_body = _percentile_cells(report)
    if pct_body:
        lines += ["", *_markdown(pct_head, pct_body)]
    return "\n".join(lines) + "\n\n" + _footer(report).replace("\n", "  \n") + "\n"


def render_json(report: Report) -> str:
    """Machine-readable report; times are unix seconds, ratios 0..1."""
    data = asdict(report)
    for row, r in zip(data["endpoints"], report.endpoints, strict=True):
        row["network_24h"] = None if r.network_24h is None else r.network_24h.as_dict()
    if report.comparison is not None:
        data["comparison"] = _comparison(report.comparison)
    data["comparisons"] = [_comparison(c) for c in report.comparisons]
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def _comparison(c: FleetComparison) -> dict[str, object]:
    return {**asdict(c), "ratio": c.ratio, "percent_faster": c.percent_faster, "text": c.text()}


RENDERERS = {"table": render_table, "markdown": render_markdown, "json": render_json}
