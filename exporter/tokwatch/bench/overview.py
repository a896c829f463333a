"""Seed 003's end-of-run tables, one row group per rung (`--number 10 20 --parallel 5 10`): Performance
Overview, Per-Request Metrics, Per-Trace Metrics (conversation runs) and Workload Throughput, as evalscope
prints them. Definitions:
docs/methodology.md ("Seed 003 tables")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.table import Table

from tokwatch.bench.aggregate import metric_values, summarize
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.conversations import cache_rates
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.workload_throughput import workload_throughput


@dataclass(frozen=True, slots=True)
class Rung:
    """One run of a ladder: its options and what it measured."""

    opts: BenchOptions
    outcome: BenchOutcome


def _conc(opts: BenchOptions) -> str:
    return "-" if opts.rate is not None else str(opts.closed_loop_workers)


def _rate(opts: BenchOptions) -> str:
    return "-" if opts.rate is None else f"{opts.rate:g}"


def _num(rung: Rung) -> str:
    n = rung.opts.number
    return str(n if n is not None else len(rung.outcome.measured))


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def overview_row(rung: Rung) -> tuple[str, ...]:
    """Conc., Rate, Num, RPS (ok requests / wall time from the first send), Gen/s, Success."""
    measured = rung.outcome.measured
    ok = sum(1 for r in measured if r.ok)
    overall = rung.outcome.throughput()["overall"]
    success = f"{100 * ok / len(measured):.1f}%" if measured else "-"
    return (
        _conc(rung.opts), _rate(rung.opts), _num(rung), _fmt(overall.get("requests_per_s"), 2),
        _fmt(overall.get("generated_tokens_per_s"), 2), success,
    )  # fmt: skip


def performance_overview(rungs: Sequence[Rung]) -> Table:
    """The Performance Overview table."""
    t = Table(title="Performance Overview", box=box.HEAVY_HEAD)
    for name in ("Conc.", "Rate", "Num", "RPS", "Gen/s", "Success"):
        t.add_column(name, justify="right")
    for rung in rungs:
        t.add_row(*overview_row(rung))
    return t


def _stat_row(values: list[float], scale: float, digits: int) -> tuple[str, str, str]:
    s = summarize(values)
    return tuple(  # type: ignore[return-value]
        "-" if s[k] is None else f"{float(s[k]) * scale:.{digits}f}"  # type: ignore[arg-type]
        for k in ("mean", "p50", "p99")
    )


def per_request_rows(rung: Rung) -> list[tuple[str, str, str, str]]:
    """(metric, avg, p50, p99) rows of one rung; the multi-turn rows only for conversation runs."""
    records = rung.outcome.records
    rows = [
        ("Latency (s)", *_stat_row(metric_values(records, "e2e"), 1.0, 3)),
        ("TTFT (ms)", *_stat_row(metric_values(records, "ttft"), 1e3, 1)),
        ("TPOT (ms)", *_stat_row(metric_values(records, "tpot"), 1e3, 1)),
        ("Input Tokens", *_stat_row(metric_values(records, "prompt_tokens"), 1.0, 1)),
        ("Output Tokens", *_stat_row(metric_values(records, "output_tokens"), 1.0, 1)),
    ]
    if rung.outcome.multi_turn:
        ok = [r for r in records if r.ok and not r.warmup and r.conversation_id is not None]
        turns = [float(r.turns) for r in ok if r.turns is not None]
        hit = cache_rates(ok)["history_hit_estimate"]
        first = [r.ttft_s for r in ok if r.turn == 0 and r.ttft_s is not None]
        later = [r.ttft_s for r in ok if (r.turn or 0) > 0 and r.ttft_s is not None]
        rows += [
            ("Turns/Req", _fmt(sum(turns) / len(turns) if turns else None, 2), "-", "-"),
            ("Cache Hit (%)", "-" if hit is None else f"{100 * hit:.1f}%", "-", "-"),
            ("First-Turn TTFT (ms)", *_stat_row(first, 1e3, 1)),
            ("Subsequent-Turn TTFT (ms)", *_stat_row(later, 1e3, 1)),
        ]
    return rows


def per_request_metrics(rungs: Sequence[Rung]) -> Table:
    """The Per-Request Metrics table: avg, p50, p99 of each figure, Conc. and Rate on a rung's first row."""
    t = Table(title="Per-Request Metrics", box=box.HEAVY_HEAD)
    for name, justify in (("Conc.", "right"), ("Rate", "right"), ("Metric", "left"), ("avg", "right"),
                          ("p50", "right"), ("p99", "right")):  # fmt: skip
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for k, rung in enumerate(rungs):
        for i, row in enumerate(per_request_rows(rung)):
            lead = (_conc(rung.opts), _rate(rung.opts)) if i == 0 else ("", "")
            t.add_row(*lead, *row, end_section=i == len(per_request_rows(rung)) - 1 and k < len(rungs) - 1)
    return t


# trace_summary.json figures as the seed's Per-Trace Metrics rows: (figure, label, scale, digits, percent)
TRACE_ROWS = (
    ("latency_s", "Latency (s)", 1.0, 3, False),
    ("first_turn_ttft_s", "First-Turn TTFT (s)", 1.0, 3, False),
    ("ttfat_s", "TTFAT (s)", 1.0, 3, False),
    ("decode_tokens_per_s", "Decode TPS", 1.0, 1, False),
    ("cache_hit_rate", "Cache Hit Rate (%)", 100.0, 1, True),
    ("eligible_cache_hit_rate", "Eligible Cache Hit Rate (%)", 100.0, 1, True),
)
TRACE_STATS = ("mean", "p50", "p90", "p99", "max")


def per_trace_metrics(rungs: Sequence[Rung]) -> Table | None:
    """The Per-Trace Metrics table of conversation runs (trace_summary.json figures); None without any."""
    multi = [r for r in rungs if r.outcome.multi_turn]
    if not multi:
        return None
    t = Table(title="Per-Trace Metrics", box=box.HEAVY_HEAD)
    t.add_column("Conc.", justify="right")
    t.add_column("Rate", justify="right")
    t.add_column("Metric", justify="left")
    for name in TRACE_STATS:
        t.add_column(name, justify="right")
    for k, rung in enumerate(multi):
        figures = rung.outcome.trace_summary()["figures"]
        for i, (key, label, scale, digits, percent) in enumerate(TRACE_ROWS):
            lead = (_conc(rung.opts), _rate(rung.opts)) if i == 0 else ("", "")
            unit = "%" if percent else ""
            values = [figures[key][s] for s in TRACE_STATS]
            cells = ["-" if v is None else f"{v * scale:.{digits}f}{unit}" for v in values]
            t.add_row(*lead, label, *cells, end_section=i == len(TRACE_ROWS) - 1 and k < len(multi) - 1)
    return t


def workload_throughput_table(rungs: Sequence[Rung]) -> Table:
    """The Workload Throughput table: Total / New / Cached prompt and completion tok/s."""
    t = Table(title="Workload Throughput", box=box.SQUARE)
    columns = (("Conc.", "right"), ("Rate", "right"), ("Metric (tok/s)", "left"), ("Overall", "right"),
               ("Last 30s", "right"), ("Steady (drop 20%)", "right"))  # fmt: skip
    for name, justify in columns:
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for k, rung in enumerate(rungs):
        rows = workload_throughput(rung.outcome.records)["rows"]
        for i, row in enumerate(rows):
            lead = (_conc(rung.opts), _rate(rung.opts)) if i == 0 else ("", "")
            t.add_row(
                *lead, row["metric"], f"{row['overall']:.2f}", f"{row['last_window']:.2f}",
                f"{row['steady_state']:.2f}", end_section=i == len(rows) - 1 and k < len(rungs) - 1,
            )  # fmt: skip
    return t


def tables(rungs: Sequence[Rung]) -> list[Table]:
    """Every seed-003 table of the rungs, in evalscope's order."""
    traces = per_trace_metrics(rungs)
    return [
        performance_overview(rungs),
        per_request_metrics(rungs),
        *([traces] if traces is not None else []),
        workload_throughput_table(rungs),
    ]
