"""The stored form of a `tokwatch bench` run: one `bench_runs` row and one `bench_requests` row per request.

Built from a `BenchOutcome`; kept apart from the probe `runs` table so benchmark load never counts in the
probe window figures. Every text that could carry a secret passes through `tokwatch.redact`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from tokwatch.redact import Redactor
from tokwatch.stats import percentile
from tokwatch.storage.rows import ERROR_CLASS_MAX

if TYPE_CHECKING:
    from tokwatch.bench.outcome import BenchOutcome
    from tokwatch.bench.request_metrics import RequestRecord

LATENCY_METRICS = ("ttft", "tbt", "tpot", "e2e")
LATENCY_QUANTILES = ("p50", "p90", "p99")


@dataclass(frozen=True, slots=True)
class BenchRunRow:
    """One `bench_runs` row; times are unix seconds, latencies seconds, throughputs per second."""

    id: str
    started_at: float
    finished_at: float
    endpoint: str  # the configured endpoint name, or the URL with any credentials masked
    model: str
    kind: str
    load: str
    arrivals: str | None
    requested_rate: float | None
    concurrency: int | None
    complete: bool
    stop_reason: str
    requests_measured: int
    requests_ok: int
    requests_errored: int
    request_throughput: float | None
    token_throughput: float | None
    request_throughput_steady: float | None
    token_throughput_steady: float | None
    generated_tokens_per_s: float | None  # usage-based (throughput.json `overall`); None before schema v5/v6
    goodput_ratio: float | None
    goodput_per_s: float | None
    all_slos_met: bool | None  # None when the run had no SLOs
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tbt_p50_s: float | None
    tbt_p90_s: float | None
    tbt_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p90_s: float | None
    e2e_p99_s: float | None
    summary: str  # summary.json as JSON text (jsonb in PostgreSQL)
    instance: str = ""


@dataclass(frozen=True, slots=True)
class BenchRequestRow:
    """One measured request of a bench run; `sent_at` is unix seconds."""

    bench_run_id: str
    request_id: int
    sent_at: float
    status: str
    error_class: str | None
    ttft_s: float | None
    ttot_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    tbt_p50_s: float | None
    tbt_p99_s: float | None
    output_tokens: int | None
    think_tokens: int | None
    prompt_tokens: int | None
    tokens_source: str | None
    fluidity_index: float | None
    scheduling_lag_s: float | None
    queue_time_s: float | None
    # For `tokwatch bench compare`; None on rows stored before schema v5 (SQLite) / v6 (PostgreSQL).
    normalized_latency_s: float | None
    decode_tokens_per_s: float | None
    tbt_s: tuple[float, ...] | None  # every per-token gap, as request_level_metrics.jsonl has it


# Column order shared by every backend's INSERT.
BENCH_RUN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchRunRow))
BENCH_REQUEST_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchRequestRow))


def _clean(value: Any, redact: Redactor) -> Any:
    """JSON-safe, redacted copy: non-finite floats become None (jsonb rejects NaN), strings are redacted."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {str(k): _clean(v, redact) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, redact) for v in value]
    return value


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _endpoint(options: dict[str, Any], redact: Redactor) -> str:
    """The configured endpoint name, else the target URL with credentials masked."""
    name = options.get("endpoint")
    return redact(str(name if name else options.get("target") or "unknown"))


def _concurrency(options: dict[str, Any]) -> int | None:
    """Closed loop: concurrent workers (or conversations); open loop: the in-flight cap, if any."""
    if options.get("rate") is not None:
        cap = options.get("max_concurrency")
        return int(cap) if cap is not None else None
    return int(options.get("parallel") or options.get("concurrency") or 1)


def request_row(run_id: str, started_at: float, r: RequestRecord, redact: Redactor) -> BenchRequestRow:
    """One request's row; TBT p50/p99 are the request's own per-token percentiles, `tbt_s` all its gaps."""
    tbt = r.tbt_s
    return BenchRequestRow(
        bench_run_id=run_id,
        request_id=r.request_id,
        sent_at=started_at + r.sent_at_s,
        status=r.status.value,
        error_class=redact(r.error_class)[:ERROR_CLASS_MAX] if r.error_class else None,
        ttft_s=r.ttft_s,
        ttot_s=r.ttot_s,
        tpot_s=r.tpot_s,
        e2e_s=r.e2e_s,
        tbt_p50_s=percentile(tbt, 50) if tbt else None,
        tbt_p99_s=percentile(tbt, 99) if tbt else None,
        output_tokens=r.output_tokens,
        think_tokens=r.think_tokens,
        prompt_tokens=r.prompt_tokens,
        tokens_source=str(r.tokens_source) if r.tokens_source is not None else None,
        fluidity_index=r.fluidity_index,
        scheduling_lag_s=r.scheduling_lag_s,
        queue_time_s=r.queue_time_s,
        normalized_latency_s=r.normalized_latency_s,
        decode_tokens_per_s=r.decode_tokens_per_s,
        tbt_s=tuple(tbt),
    )


def bench_rows(
    outcome: BenchOutcome, *, instance: str = "", redactor: Redactor | None = None
) -> tuple[BenchRunRow, list[BenchRequestRow]]:
    """The run row and its measured (non-warm-up) request rows; an incomplete run has complete=False."""
    redact = redactor or Redactor()
    options = outcome.options
    summary = outcome.summary()
    metrics = summary["metrics"]
    tput = outcome.throughput()
    overall, steady = tput["overall"], tput["steady_state"]
    good = summary["goodput"]
    latency = {f"{m}_{q}_s": _num(metrics[m][q]) for m in LATENCY_METRICS for q in LATENCY_QUANTILES}
    run = BenchRunRow(
        id=outcome.run_id,
        started_at=outcome.started_at_unix,
        finished_at=outcome.started_at_unix + outcome.wall_s,
        endpoint=_endpoint(options, redact),
        model=str(options.get("model") or ""),
        kind=str(options.get("kind") or ""),
        load=str(options.get("load") or ""),
        arrivals=str(options["arrivals"]) if options.get("rate") is not None else None,
        requested_rate=_num(outcome.requested_rate),
        concurrency=_concurrency(options),
        complete=outcome.complete,
        stop_reason=outcome.stop_reason,
        requests_measured=int(summary["requests"]["total"]),
        requests_ok=int(summary["requests"]["ok"]),
        requests_errored=int(summary["requests"]["errored"]),
        request_throughput=_num(overall.get("requests_per_s")),
        token_throughput=_num(overall.get("tokens_per_s")),
        request_throughput_steady=_num(steady.get("requests_per_s")),
        token_throughput_steady=_num(steady.get("tokens_per_s")),
        generated_tokens_per_s=_num(overall.get("generated_tokens_per_s")),
        goodput_ratio=_num(good.get("goodput_ratio")),
        goodput_per_s=_num(good.get("goodput_requests_per_s")),
        all_slos_met=bool(outcome.slo_results()["all_slos_met"]) if outcome.slos else None,
        summary=json.dumps(_clean(summary, redact), sort_keys=True),
        instance=instance,
        **latency,
    )
    requests = [request_row(outcome.run_id, outcome.started_at_unix, r, redact) for r in outcome.measured]
    return run, requests
