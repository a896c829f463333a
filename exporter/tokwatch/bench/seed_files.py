"""Seed 002's (Veeksha's) performance-evaluator files, written beside tokwatch's own when the bench file has a
`type: performance` evaluator: `metrics/` (summary_stats.json, throughput_metrics.json,
request_level_metrics.jsonl, prefill_stats.json, slo_results.json, per-metric CSVs and histograms) and
`health_check_results.txt`. Names and shapes are the seed's; definitions are in docs/methodology.md
("Seed 002's files")."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokwatch.bench import health, plots
from tokwatch.bench.aggregate import prefill_stats, summarize
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.request_metrics import RequestRecord

METRICS_DIR = "metrics"
HEALTH_FILE = "health_check_results.txt"
# The seed's per-metric files ("ttfc, tbc, tpot, e2e, etc."): name -> the request_level_metrics.jsonl field.
DISTRIBUTIONS = {
    "ttfc": "ttfc",
    "tbc": "tbc",
    "tpot": "tpot",
    "e2e": "end_to_end_latency",
    "normalized_end_to_end_latency": "normalized_end_to_end_latency",
    "output_throughput": "output_throughput",
    "num_output_tokens": "num_output_tokens",
    "num_total_tokens": "num_total_tokens",
}
CSV_ROWS = ("count", "p50", "p90", "p95", "p99", "min", "max", "mean")
SEED_METRIC_NAMES = {"ttft": "ttfc", "tbt": "tbc"}  # tokwatch's name -> the seed's, in slo_results.json


def wanted(options: Mapping[str, Any]) -> bool:
    """Whether the run's options (summary.json `options`) carry a `type: performance` evaluator."""
    evaluators = options.get("evaluators") or ()
    return any(isinstance(e, Mapping) and e.get("type") == "performance" for e in evaluators)


def request_row(r: RequestRecord) -> dict[str, Any]:
    """One request as the seed's request_level_metrics.jsonl line (times: seconds since the run start)."""
    generated = r.generated_tokens if r.ok else (r.output_tokens or 0) + (r.think_tokens or 0)
    prompt = r.prompt_tokens
    delta = None if prompt is None else prompt - (r.history_tokens or 0)
    e2e = r.e2e_s
    return {
        "request_id": r.request_id,
        "session_id": r.conversation_id if r.conversation_id is not None else r.request_id,
        "session_total_requests": r.conversation_turns or 1,
        "scheduler_ready_at": r.intended_at_s if r.intended_at_s is not None else r.dispatched_at_s,
        "scheduler_dispatched_at": r.dispatched_at_s,
        "client_picked_up_at": r.started_at_s,
        "client_completed_at": r.completed_at_s,
        "result_processed_at": r.processed_at_s,
        "num_delta_prompt_tokens": delta,
        "num_total_prompt_tokens": prompt,
        "target_num_delta_prompt_tokens": r.prompt_tokens_target,
        "num_output_tokens": generated,
        "num_requested_output_tokens": r.max_tokens,
        "num_total_tokens": (prompt or 0) + generated,
        "is_stream": True,  # tokwatch always streams
        "tpot": r.tpot_s,
        "ttfc": r.ttft_s,
        "end_to_end_latency": e2e,
        "normalized_end_to_end_latency": r.normalized_latency_s,
        "output_throughput": generated / e2e if e2e and generated else None,
        "tbc": list(r.tbt_s),
        "status": r.status.value,  # not the seed's: errored requests are in the file too
    }


def summary_stats(outcome: BenchOutcome) -> dict[str, Any]:
    """summary_stats.json: the seed's counts and the observed session dispatch rate (sessions/s)."""
    measured = outcome.measured
    ok = sum(1 for r in measured if r.ok)
    return {
        "Number of Requests": len(measured),
        "Number of Completed Requests": ok,
        "Number of Errored Requests": len(measured) - ok,
        "Error Rate": (len(measured) - ok) / len(measured) if measured else 0.0,
        "Observed Session Dispatch Rate": session_dispatch_rate(measured),
    }


def session_dispatch_rate(records: Sequence[RequestRecord]) -> float | None:
    """Sessions started per second: (sessions - 1) / span of their first dispatches (None under two)."""
    first: dict[int, float] = {}
    for r in records:
        key = r.conversation_id if r.conversation_id is not None else -1 - r.request_id
        first[key] = min(first.get(key, math.inf), r.dispatched_at_s)
    starts = sorted(first.values())
    if len(starts) < 2 or starts[-1] <= starts[0]:
        return None
    return (len(starts) - 1) / (starts[-1] - starts[0])


def throughput_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """throughput_metrics.json over completed requests: `tpot_based_throughput` = 1 / mean TPOT,
    `tbc_based_throughput` = 1 / mean TBC (the seed's definitions), and 1 / p99 TBC beside them."""
    tpots = [row["tpot"] for row in rows if row["status"] == "ok" and row["tpot"]]
    tbcs = [v for row in rows if row["status"] == "ok" for v in row["tbc"]]
    mean_tbc = math.fsum(tbcs) / len(tbcs) if tbcs else None
    p99_tbc = summarize(tbcs)["p99"] if tbcs else None
    return {
        "tpot_based_throughput": len(tpots) / math.fsum(tpots) if tpots else None,
        "tbc_based_throughput": 1 / mean_tbc if mean_tbc else None,
        "tbc_p99_based_throughput": 1 / float(p99_tbc) if p99_tbc else None,
    }


def seed_prefill_stats(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """prefill_stats.json in the seed's names: TTFC grouped by target prompt length."""
    stats = prefill_stats(records)
    if stats["group_by"] == "prompt_tokens_target":
        stats["group_by"] = "target_num_delta_prompt_tokens"
    return {**stats, "metric": "ttfc"}


def seed_slo_results(results: Mapping[str, Any]) -> dict[str, Any]:
    """slo_results.json with the seed's metric names: `metric: ttfc`, `slo_metric_key: ttfc_p99`."""
    out = dict(results)
    renamed = []
    for r in results.get("results", ()):
        metric = SEED_METRIC_NAMES.get(r["metric"], r["metric"])
        suffix = str(r["slo_metric_key"]).removeprefix(r["metric"])
        renamed.append({**r, "metric": metric, "slo_metric_key": metric + suffix})
    out["results"] = renamed
    return out


def _values(rows: Iterable[Mapping[str, Any]], field: str) -> list[float]:
    out: list[float] = []
    for row in rows:
        if row["status"] != "ok":
            continue
        value = row[field]
        if isinstance(value, list):
            out.extend(value)
        elif value is not None:
            out.append(float(value))
    return out


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_seed_files(
    outcome: BenchOutcome, out_dir: Path, checks: list[health.Check], *, plots_enabled: bool = True
) -> list[Path]:
    """Write the seed's files into `out_dir` (its `metrics/` made); returns the paths written."""
    metrics = out_dir / METRICS_DIR
    metrics.mkdir(parents=True, exist_ok=True)
    rows = [request_row(r) for r in outcome.measured]
    jsonl = metrics / "request_level_metrics.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, allow_nan=False) + "\n")
    written = [jsonl]
    for name, data in (
        ("summary_stats.json", summary_stats(outcome)),
        ("throughput_metrics.json", throughput_metrics(rows)),
        ("prefill_stats.json", seed_prefill_stats(outcome.records)),
        ("slo_results.json", seed_slo_results(outcome.slo_results())),
    ):
        _write_json(metrics / name, data)
        written.append(metrics / name)
    values = {name: _values(rows, field) for name, field in DISTRIBUTIONS.items()}
    for name, vals in values.items():
        stats = summarize(vals)
        path = metrics / f"{name}.csv"
        with path.open("w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(("statistic", "value"))
            w.writerows((c, "" if stats[c] is None else stats[c]) for c in CSV_ROWS)
        written.append(path)
    if plots_enabled:
        written += plots.write_histograms(values, metrics) or []
    (out_dir / HEALTH_FILE).write_text(health.render(checks), encoding="utf-8")
    written.append(out_dir / HEALTH_FILE)
    return written
