"""`tokwatch report --bench`: recent `tokwatch bench` runs from the store, as a table, JSON or Markdown."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime

from tokwatch.storage.bench_rows import BenchRunRow

HEAD = (
    "started (UTC)", "endpoint", "model", "load", "complete", "ok/measured", "goodput", "SLOs",
    "TTFT p99", "TBT p99", "tok/s", "req/s", "run id",
)  # fmt: skip


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}ms"


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _cells(runs: Sequence[BenchRunRow]) -> list[list[str]]:
    rows = []
    for r in runs:
        slos = "-" if r.all_slos_met is None else ("met" if r.all_slos_met else "MISSED")
        rows.append(
            [
                _when(r.started_at),
                r.endpoint,
                r.model,
                r.load,
                "yes" if r.complete else f"no ({r.stop_reason})",
                f"{r.requests_ok}/{r.requests_measured}",
                "-" if r.goodput_ratio is None else f"{r.goodput_ratio * 100:.1f}%",
                slos,
                _ms(r.ttft_p99_s),
                _ms(r.tbt_p99_s),
                _num(r.token_throughput),
                _num(r.request_throughput, ".2f"),
                r.id,
            ]
        )
    return rows


def render_table(runs: Sequence[BenchRunRow], since: str) -> str:
    """Aligned plain-text table, newest run first."""
    body = _cells(runs)
    grid = [list(HEAD), *body]
    widths = [max(len(row[i]) for row in grid) for i in range(len(HEAD))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in grid]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if not body:
        lines.append(f"(no bench runs stored in the last {since})")
    return "\n".join(lines) + "\n"


def render_markdown(runs: Sequence[BenchRunRow], since: str) -> str:
    """A GitHub-flavoured Markdown table, newest run first."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(row) + " |" for row in _cells(runs)]
    if not runs:
        lines.append(f"\n(no bench runs stored in the last {since})")
    return "\n".join(lines) + "\n"


def render_json(runs: Sequence[BenchRunRow], since: str) -> str:
    """Every stored column of each run (times unix seconds, latencies seconds); summary as an object."""
    data = []
    for r in runs:
        d = asdict(r)
        d["summary"] = json.loads(r.summary)
        data.append(d)
    return json.dumps({"since": since, "bench_runs": data}, indent=2) + "\n"


BENCH_RENDERERS: dict[str, Callable[[Sequence[BenchRunRow], str], str]] = {
    "table": render_table,
    "markdown": render_markdown,
    "json": render_json,
}
