"""Capacity: a sweep over load points, or a search for the highest rate that still serves well.

`--search fluid` finds seed 004's fluid token generation rate: the highest request rate at which at least
`fluid_fraction` of the measured requests reach a fluidity-index of at least `fluid_index` (a failed request
counts as not fluid). `--search slo` finds the highest rate at which every `--slo` holds (goodput capacity).
Both start from a quick single-stream measurement (`--search-start` overrides it: 1 / the median E2E of a
few sequential requests, the rate one stream sustains), bracket (doubling while points pass, halving while
they fail) and then bisect until the bracket is within `search_tolerance` of its lower end, or the point or
time budget runs out. Each point lasts a bounded time: `--duration` (default max(10 s, 10 x the single-stream
E2E)), with in-flight requests abandoned `--drain-timeout` (default: the point duration) after it. Every
point is a full benchmark run with its own result directory. A search that never saw a failing point states
its result as a lower bound.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tokwatch.bench.aggregate import metric_values
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.figures.stats import percentiles
from tokwatch.settings.strict_yaml import ConfigError

SCHEMA_VERSION = 1
Dimension = Literal["rate", "concurrency"]
CALIBRATION_REQUESTS = 4  # sequential measured requests (after one warm-up) that give the start rate
SEARCH_POINT_S = 10.0  # shortest default duration of a search point
POINT_E2E_MULTIPLE = 10  # ... and at least this many single-stream request times
MAX_HALVINGS = 6  # a first point that fails is halved at most this often (down to start / 64)
RunPoint = Callable[[BenchOptions, Path], Awaitable[tuple[BenchOutcome, Path]]]


def parse_sweep(text: str) -> tuple[Dimension, list[float]]:
    """`rate=1,2,4` or `concurrency=1,4,16` -> (dimension, values); raises ConfigError naming the problem."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or name not in ("rate", "concurrency"):
        raise ConfigError(f"--sweep {text!r}: expected rate=V1,V2,... or concurrency=N1,N2,...")
    values: list[float] = []
    for item in raw.split(","):
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(f"--sweep {text!r}: {item.strip()!r} is not a number") from None
        if not value > 0 or value == float("inf") or (name == "concurrency" and value != int(value)):
            kind = "a positive whole number" if name == "concurrency" else "a positive finite rate"
            raise ConfigError(f"--sweep {text!r}: {item.strip()!r} is not {kind}")
        values.append(value)
    if not values:
        raise ConfigError(f"--sweep {text!r}: no values")
    return name, sorted(set(values))  # type: ignore[return-value]


@dataclass(slots=True)
class CapacityPoint:
    """One load point's headline figures (seconds for latencies)."""

    dimension: str
    value: float
    result_dir: str
    complete: bool
    requests: int
    failures: int
    achieved_rate_per_s: float | None
    output_tokens_per_s: float | None
    fluid_fraction: float | None  # measured requests with fluidity-index >= the threshold
    fluidity_p1: float | None
    fluidity_p50: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tbt_p50_s: float | None
    tbt_p99_s: float | None
    slos_met: bool | None  # None when no SLO was given
    slo_results: list[dict[str, Any]] = field(default_factory=list)
    passed: bool | None = None  # the search criterion, when searching
    duration_s: float | None = None  # the point's --duration (searches: bounded by it plus the drain)
    drain_timeout_s: float | None = None
    wall_s: float | None = None  # the run's wall time as measured


@dataclass(slots=True)
class Calibration:
    """The single-stream measurement a search starts from (capacity.json `calibration`)."""

    result_dir: str
    requests: int
    ok: int
    e2e_p50_s: float | None
    start_rate: float | None  # 1 / e2e_p50_s (3 significant digits); None when no request succeeded


def point_from(
    outcome: BenchOutcome, dimension: str, value: float, result_dir: Path, fluid_index: float
) -> CapacityPoint:
    """The figures of one finished run."""
    summary = outcome.summary()
    metrics = summary["metrics"]
    measured = outcome.measured
    fluid = sum(
        1 for r in measured if r.ok and r.fluidity_index is not None and r.fluidity_index >= fluid_index
    )
    slo = outcome.slo_results() if outcome.slos else None
    overall = outcome.throughput()["overall"]
    values = metric_values(outcome.records, "fluidity_index")
    fluidity: list[float | None] = list(percentiles(values, (1, 50))) if values else [None, None]
    return CapacityPoint(
        dimension=dimension,
        value=value,
        result_dir=str(result_dir),
        complete=outcome.complete,
        requests=len(measured),
        failures=summary["requests"]["errored"],
        achieved_rate_per_s=summary["achieved_send_rate_per_s"],
        output_tokens_per_s=overall.get("tokens_per_s"),
        fluid_fraction=fluid / len(measured) if measured else None,
        fluidity_p1=fluidity[0],
        fluidity_p50=fluidity[1],
        ttft_p50_s=metrics["ttft"]["p50"],
        ttft_p99_s=metrics["ttft"]["p99"],
        tbt_p50_s=metrics["tbt"]["p50"],
        tbt_p99_s=metrics["tbt"]["p99"],
        slos_met=slo["all_slos_met"] if slo is not None else None,
        slo_results=[
            {k: r[k] for k in ("name", "met", "observed_value", "threshold")}
            for r in (slo or {}).get("results", [])
        ],
    )


def point_passes(point: CapacityPoint, opts: BenchOptions) -> bool:
    """The search criterion: fluid enough (`fluid`) or every SLO met (`slo`); an incomplete run, or one
    whose failed share is above --max-error-rate, fails."""
    if not point.complete or point.requests == 0 or point.failures / point.requests > opts.max_error_rate:
        return False
    if opts.search == "slo":
        return bool(point.slos_met)
    return point.fluid_fraction is not None and point.fluid_fraction >= opts.fluid_fraction


@dataclass(slots=True)
class Capacity:
    """capacity.json content."""

    mode: str  # "sweep", "fluid" or "slo"
    dimension: str
    points: list[CapacityPoint]
    criterion: dict[str, Any]
    result_rate: float | None = None  # highest passing rate (search)
    bracket: tuple[float | None, float | None] = (None, None)  # (highest pass, lowest fail)
    tolerance: float | None = None
    # done, max_points, max_time, max_rate, no_passing_rate, calibration_failed
    stopped_by: str = "done"
    wall_s: float = 0.0
    calibration: Calibration | None = None
    point_duration_s: float | None = None
    point_drain_timeout_s: float | None = None
    cost: dict[str, Any] | None = None  # self-hosted $/Mtok at the result's rate (tokwatch.bench.costing)

    @property
    def lower_bound(self) -> bool:
        """A search that passed somewhere but never failed: the capacity is at least its result."""
        return self.mode != "sweep" and self.result_rate is not None and self.bracket[1] is None

    def to_json(self) -> dict[str, Any]:
        """The file's dictionary; the result is named for the search (`fluid_token_generation_rate`...)."""
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "mode": self.mode,
            "dimension": self.dimension,
        }
        # The result is a request rate (issue 12); seed 004 states it in tokens/s, so both are given: the
        # output tokens/s achieved at the highest passing rate.
        at = next((p for p in self.points if p.value == self.result_rate), None)
        tokens_per_s = at.output_tokens_per_s if at is not None else None
        if self.mode == "fluid":
            out["fluid_token_generation_rate"] = self.result_rate
            out["fluid_token_generation_rate_tokens_per_s"] = tokens_per_s
        elif self.mode == "slo":
            out["slo_capacity_rate"] = self.result_rate
            out["slo_capacity_tokens_per_s"] = tokens_per_s
        if self.mode != "sweep":
            out.update(
                result_is_lower_bound=self.lower_bound,
                bracket={"highest_pass": self.bracket[0], "lowest_fail": self.bracket[1]},
                tolerance=self.tolerance,
                stopped_by=self.stopped_by,
                calibration=asdict(self.calibration) if self.calibration is not None else None,
                point_duration_s=self.point_duration_s,
                point_drain_timeout_s=self.point_drain_timeout_s,
            )
        if self.cost is not None:
            out["cost"] = self.cost
        out.update(criterion=self.criterion, wall_time_s=self.wall_s, points=[asdict(p) for p in self.points])
        return out


def _point_options(
    opts: BenchOptions, dimension: str, value: float, out_dir: Path, **bounds: float | None
) -> BenchOptions:
    update: dict[str, Any] = {
        "sweep": None,
        "search": None,
        "listen": None,
        "output_dir": str(out_dir),
        dimension: int(value) if dimension == "concurrency" else value,
        **{k: v for k, v in bounds.items() if v is not None},
    }
    return opts.model_copy(update=update)


async def calibrate(opts: BenchOptions, out_dir: Path, run_point: RunPoint) -> Calibration:
    """One warm-up and CALIBRATION_REQUESTS sequential requests; the start rate is 1 / their median E2E."""
    sub = out_dir / "calibration"
    single = opts.model_copy(update={
        "sweep": None, "search": None, "listen": None, "output_dir": str(sub), "rate": None,
        "concurrency": 1, "number": CALIBRATION_REQUESTS, "duration": None, "warmup": max(1, opts.warmup),
    })  # fmt: skip
    outcome, _ = await run_point(single, sub)
    e2e = [v for r in outcome.measured if r.ok and (v := r.e2e_s) is not None]
    p50 = percentiles(e2e, (50,))[0] if e2e else None
    start = float(f"{1 / p50:.3g}") if p50 else None
    return Calibration(str(sub), len(outcome.measured), len(e2e), p50, start)


def _label(dimension: str, value: float) -> str:
    return f"{dimension}-{value:g}"


async def run_capacity(opts: BenchOptions, out_dir: Path, run_point: RunPoint) -> Capacity:
    """Run the sweep or the search; every point via `run_point(options, directory)`."""
    criterion = {
        "fluid_index": opts.fluid_index,
        "fluid_fraction": opts.fluid_fraction,
        "slos": [s.name for s in opts.parsed_slos()],
        "fluidity_prefill_deadline_s": opts.fluidity_prefill_deadline,
        "fluidity_decode_deadline_s": opts.fluidity_decode_deadline,
        "fluidity_mode": opts.fluidity_mode,
    }
    started = time.monotonic()
    points: list[CapacityPoint] = []
    bounds: dict[str, float | None] = {}

    async def measure(dimension: str, value: float) -> CapacityPoint:
        sub = out_dir / _label(dimension, value)
        point_opts = _point_options(opts, dimension, value, sub, **bounds)
        outcome, _ = await run_point(point_opts, sub)
        point = point_from(outcome, dimension, value, sub, opts.fluid_index)
        point.duration_s, point.drain_timeout_s = point_opts.duration, point_opts.drain_timeout
        point.wall_s = outcome.wall_s
        if opts.search is not None:
            point.passed = point_passes(point, opts)
        points.append(point)
        return point

    if opts.sweep is not None:
        dimension, values = parse_sweep(opts.sweep)
        cap = Capacity("sweep", dimension, points, criterion)
        for v in values:
            await measure(dimension, v)
        cap.wall_s = time.monotonic() - started
        return cap

    assert opts.search is not None
    cap = Capacity(opts.search, "rate", points, criterion, tolerance=opts.search_tolerance)
    lo: float | None = None
    hi: float | None = None
    start = opts.search_start
    single_e2e: float | None = None
    if start is None:
        cap.calibration = await calibrate(opts, out_dir, run_point)
        start, single_e2e = cap.calibration.start_rate, cap.calibration.e2e_p50_s
        if start is None:
            cap.stopped_by = "calibration_failed"
            cap.wall_s = time.monotonic() - started
            return cap
    start = min(start, opts.search_max_rate)
    duration = opts.duration or max(SEARCH_POINT_S, POINT_E2E_MULTIPLE * (single_e2e or 0.0))
    bounds.update(duration=duration, drain_timeout=opts.drain_timeout or duration)
    cap.point_duration_s, cap.point_drain_timeout_s = bounds["duration"], bounds["drain_timeout"]
    rate = start

    def budget_left() -> str | None:
        if len(points) >= opts.search_max_points:
            return "max_points"
        if time.monotonic() - started >= opts.search_max_time:
            return "max_time"
        return None

    # Bracket: double while points pass, halve while they fail, until one of each was seen.
    while lo is None or hi is None:
        if (why := budget_left()) is not None:
            cap.stopped_by = why
            break
        if (await measure("rate", rate)).passed:
            lo = rate
            if hi is not None:
                break
            if rate >= opts.search_max_rate:
                cap.stopped_by = "max_rate"
                break
            rate = min(rate * 2, opts.search_max_rate)
        else:
            hi = rate
            if lo is not None:
                break
            if rate <= start / 2**MAX_HALVINGS:
                cap.stopped_by = "no_passing_rate"
                break
            rate /= 2
    while lo is not None and hi is not None and (hi - lo) > opts.search_tolerance * lo:
        if (why := budget_left()) is not None:
            cap.stopped_by = why
            break
        mid = (lo + hi) / 2
        if (await measure("rate", mid)).passed:
            lo = mid
        else:
            hi = mid
    cap.result_rate, cap.bracket = lo, (lo, hi)
    cap.wall_s = time.monotonic() - started
    return cap


def write_capacity(cap: Capacity, out_dir: Path, *, plots_enabled: bool = True) -> list[Path]:
    """capacity.json, report.md and, with matplotlib, capacity.png; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "capacity.json"
    path.write_text(json.dumps(cap.to_json(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    report = out_dir / "report.md"
    report.write_text(render_report(cap), encoding="utf-8")
    written = [path, report]
    if plots_enabled and (png := _plot(cap, out_dir / "capacity.png")) is not None:
        written.append(png)
    return written


def _slo_line(cap: Capacity, metric: str) -> list[tuple[str, float]]:
    lines = []
    for p in cap.points[:1]:
        for r in p.slo_results:
            if str(r["name"]).startswith(f"{metric}:") and r["threshold"] is not None:
                lines.append((str(r["name"]), float(r["threshold"])))
    return lines


def _plot(cap: Capacity, path: Path) -> Path | None:
    """Output tok/s against TTFT and TBT percentiles, SLO thresholds as dashed lines, passes marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pts = sorted((p for p in cap.points if p.output_tokens_per_s is not None), key=lambda p: p.value)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    try:
        for ax, metric, p50, p99 in (
            (axes[0], "ttft", [p.ttft_p50_s for p in pts], [p.ttft_p99_s for p in pts]),
            (axes[1], "tbt", [p.tbt_p50_s for p in pts], [p.tbt_p99_s for p in pts]),
        ):
            x = [p.output_tokens_per_s for p in pts]
            for ys, style, label in ((p50, "o-", "p50"), (p99, "s--", "p99")):
                shown = [(xi, y * 1e3) for xi, y in zip(x, ys, strict=True) if y is not None]
                if shown:
                    ax.plot([s[0] for s in shown], [s[1] for s in shown], style, label=label)
            for name, threshold in _slo_line(cap, metric):
                ax.axhline(threshold * 1e3, color="red", linestyle=":", label=f"SLO {name}")
            for p, xi, y in zip(pts, x, p50, strict=True):
                if y is not None:  # labelled where its p50 is drawn (ms)
                    ax.annotate(f"{p.value:g}", (xi, y * 1e3), fontsize=7, textcoords="offset points",
                                xytext=(3, 3))  # fmt: skip
            drawn = [v for v in (*p50, *p99) if v is not None and v > 0]
            if drawn and max(drawn) > 100 * min(drawn):  # past saturation TTFT spans orders of magnitude
                ax.set_yscale("log")
            ax.set_xlabel("output tokens/s (achieved)")
            ax.set_ylabel(f"{metric.upper()} (ms)")
            ax.set_title(f"{metric.upper()} vs throughput ({cap.dimension} labelled)")
            ax.legend(fontsize=8)
        if cap.result_rate is not None:
            fig.suptitle(f"{cap.mode} capacity: {headline_rate(cap)}")
        fig.tight_layout()
        fig.savefig(path, dpi=80)
    finally:
        plt.close(fig)
    return path


def table_lines(cap: Capacity) -> list[str]:
    """The summary table printed at the end."""

    def f(v: float | None, scale: float = 1.0, fmt: str = ".1f") -> str:
        return "-" if v is None else format(v * scale, fmt)

    head = (
        f"{cap.dimension:>11} {'achieved/s':>10} {'out tok/s':>10} {'fluid %':>8} "
        f"{'TTFT p50/p99 ms':>16} {'TBT p50/p99 ms':>15} {'fail':>5} {'SLOs':>5} {'pass':>5}"
    )
    lines = [head]
    for p in sorted(cap.points, key=lambda p: p.value):
        slos = "-" if p.slos_met is None else ("met" if p.slos_met else "MISS")
        passed = "-" if p.passed is None else ("yes" if p.passed else "no")
        lines.append(
            f"{p.value:>11g} {f(p.achieved_rate_per_s, fmt='.2f'):>10} {f(p.output_tokens_per_s):>10} "
            f"{f(p.fluid_fraction, 100):>8} {f(p.ttft_p50_s, 1e3) + '/' + f(p.ttft_p99_s, 1e3):>16} "
            f"{f(p.tbt_p50_s, 1e3) + '/' + f(p.tbt_p99_s, 1e3):>15} {p.failures:>5} {slos:>5} {passed:>5}"
        )
    if cap.mode != "sweep":
        name = "fluid token generation rate" if cap.mode == "fluid" else "SLO capacity"
        lo, hi = cap.bracket
        c = cap.calibration
        start = (
            f"; start {c.start_rate:.4g} req/s = 1 / single-stream E2E {f(c.e2e_p50_s, 1e3, '.0f')} ms"
            if c is not None and c.start_rate is not None
            else ""
        )
        lines.append(
            f"{name}: {headline_rate(cap)} (highest pass {f(lo, fmt='.4g')}, lowest fail {f(hi, fmt='.4g')}, "
            f"tolerance {cap.tolerance:.0%}, {len(cap.points)} points in {cap.wall_s:.0f}s, {cap.stopped_by}"
            f"{start})"
        )
    return lines


def result_tokens_per_s(cap: Capacity) -> float | None:
    """Output tok/s achieved at the search's result rate (None for a sweep or a search without one)."""
    at = next((p for p in cap.points if cap.mode != "sweep" and p.value == cap.result_rate), None)
    return at.output_tokens_per_s if at is not None else None


def render_report(cap: Capacity) -> str:
    """report.md of a sweep or search: the headline, how it was searched, and every point."""
    title = {"fluid": "fluid token generation rate", "slo": "SLO capacity"}.get(cap.mode, "capacity sweep")
    out = [f"# tokwatch bench: {title}", ""]
    if cap.mode != "sweep":
        out += [f"**{headline_rate(cap)}**", ""]
        if cap.lower_bound:
            out += [
                "No point failed the criterion, so the capacity was not reached: it is at least this rate "
                f"(stopped by {cap.stopped_by}; raise --search-max-rate, --search-max-points or "
                "--search-max-time to look higher).",
                "",
            ]
        c = cap.calibration
        if c is not None:
            e2e = "-" if c.e2e_p50_s is None else f"{c.e2e_p50_s * 1e3:.0f} ms"
            out.append(f"- start: 1 / single-stream E2E p50 {e2e} ({c.ok}/{c.requests} ok) = "
                       f"{'-' if c.start_rate is None else f'{c.start_rate:.4g} req/s'}")  # fmt: skip
        if cap.point_duration_s is not None:
            out.append(f"- each point: {cap.point_duration_s:g} s of arrivals, requests still running "
                       f"{cap.point_drain_timeout_s:g} s later abandoned (failed)")  # fmt: skip
        out += [f"- criterion: {json.dumps(cap.criterion)}", ""]
    out += ["```", *table_lines(cap), "```", ""]
    return "\n".join(out)


def headline_rate(cap: Capacity) -> str:
    """`12.5 req/s`, `>= 40 req/s (lower bound: no point failed)` or `not found`."""
    if cap.result_rate is None:
        return "not found"
    if cap.lower_bound:
        return f">= {cap.result_rate:.4g} req/s (lower bound: no point failed)"
    return f"{cap.result_rate:.4g} req/s"
