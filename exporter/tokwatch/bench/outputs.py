"""Writes one run's directory: JSON/JSONL/CSV figures, report.md, health checks, /metrics snapshots."""

from __future__ import annotations

import csv
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from tokwatch.bench import health, plots, report, seed_files
from tokwatch.bench.aggregate import PERCENTILES, metric_values
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.workload_throughput import workload_throughput, workload_timeline

PLOTTED = ("ttft", "ttot", "tbt", "output_itl", "tpot", "e2e", "normalized_latency", "fluidity_index")
CSV_COLUMNS = ("count", *(f"p{q}" for q in PERCENTILES), "min", "max", "mean", "std")


def default_output_dir(model: str, now: float | None = None) -> Path:
    """`./bench-results/<UTC timestamp>-<model>` with the model name made path-safe."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    return Path("bench-results") / f"{stamp}-{safe}"


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # readers never see a half-written file


def write_run(outcome: BenchOutcome, out_dir: Path, *, plots_enabled: bool = True) -> list[Path]:
    """Write every output file of the run into `out_dir` (created); returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    jsonl = out_dir / "request_level_metrics.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for r in outcome.records:
            f.write(json.dumps(r.to_dict(), allow_nan=False) + "\n")
    written.append(jsonl)

    summary = outcome.summary()
    thr = outcome.throughput()
    slo = outcome.slo_results()
    for name, data in (
        ("summary.json", summary),
        ("throughput.json", thr),
        ("slo_results.json", slo),
        ("prefill_stats.json", outcome.prefill()),
        # seed 003 (evalscope) shapes: tokwatch.bench.workload_throughput
        ("workload_throughput.json", workload_throughput(outcome.records)),
        ("workload_timeline.json", workload_timeline(outcome.records, outcome.started_at_unix)),
    ):
        _write_json(out_dir / name, data)
        written.append(out_dir / name)

    for name, stats in summary["metrics"].items():
        csv_path = out_dir / f"{name}.csv"
        with csv_path.open("w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(("statistic", "value"))
            w.writerows((c, "" if stats[c] is None else stats[c]) for c in CSV_COLUMNS)
        written.append(csv_path)

    traces = outcome.trace_summary() if outcome.multi_turn else None
    if traces is not None:
        _write_json(out_dir / "trace_summary.json", traces)
        written.append(out_dir / "trace_summary.json")

    checks = health.run_checks(outcome)
    (out_dir / "health_checks.txt").write_text(health.render(checks), encoding="utf-8")
    (out_dir / "report.md").write_text(report.render(summary, thr, slo, checks, traces), encoding="utf-8")
    written += [out_dir / "health_checks.txt", out_dir / "report.md"]
    if seed_files.wanted(outcome.options):  # a bench file with seed 002's `type: performance` evaluator
        written += seed_files.write_seed_files(outcome, out_dir, checks, plots_enabled=plots_enabled)

    snapshots = (
        ("server_metrics_before.txt", outcome.metrics_before),
        ("server_metrics_after.txt", outcome.metrics_after),
    )
    for name, text in snapshots:
        if text is not None:
            (out_dir / name).write_text(text, encoding="utf-8")
            written.append(out_dir / name)

    if plots_enabled:
        pngs = plots.write_histograms({m: metric_values(outcome.records, m) for m in PLOTTED}, out_dir)
        written += pngs or []
    return written
