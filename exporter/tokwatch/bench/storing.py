"""Write a finished `tokwatch bench` run to the store configured in tokwatch.yml (`--config`).

The bench maps its outcome onto the store's row types here (one `BenchRunRow`, one `BenchRequestRow` per
measured request), so the store knows nothing of the bench. Every text that could carry a secret passes
through `tokwatch.settings.redact`.
"""

from __future__ import annotations

import json
import math
import socket
import time
import uuid
from collections.abc import Iterable
from typing import Any

from tokwatch.bench.capacity import Capacity
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures.stats import percentile
from tokwatch.figures.wording import counted
from tokwatch.settings.config import Config
from tokwatch.settings.redact import Redactor
from tokwatch.storage.bench_rows import BenchRequestRow, BenchRunRow, CapacityRow
from tokwatch.storage.factory import bench_store, open_store
from tokwatch.storage.rows import ERROR_CLASS_MAX

LATENCY_METRICS = ("ttft", "tbt", "tpot", "e2e")
LATENCY_QUANTILES = ("p50", "p90", "p99")


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


def run_row(
    outcome: BenchOutcome,
    *,
    instance: str = "",
    redactor: Redactor | None = None,
    summary: dict[str, Any] | None = None,
) -> BenchRunRow:
    """The run's `bench_runs` row; `summary` replaces the outcome's own summary.json (a merged run's)."""
    redact = redactor or Redactor()
    options = outcome.options
    summary = outcome.summary() if summary is None else summary
    metrics = summary["metrics"]
    tput = outcome.throughput()
    overall, steady = tput["overall"], tput["steady_state"]
    good = summary["goodput"]
    latency = {f"{m}_{q}_s": _num(metrics[m][q]) for m in LATENCY_METRICS for q in LATENCY_QUANTILES}
    return BenchRunRow(
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
        summary=summary_text(summary, redact),
        instance=instance,
        **latency,
    )


def summary_text(summary: dict[str, Any], redact: Redactor) -> str:
    """A summary as stored: JSON text, redacted, non-finite floats as null."""
    return json.dumps(_clean(summary, redact), sort_keys=True)


def planned_run_row(
    run_id: str, options: dict[str, Any], start_at: float, summary: str, *, instance: str, redact: Redactor
) -> BenchRunRow:
    """The row a split run has before its merged figures: what it is, when it starts, nothing measured."""
    return BenchRunRow(
        id=run_id,
        started_at=start_at,
        finished_at=start_at,
        endpoint=_endpoint(options, redact),
        model=str(options.get("model") or ""),
        kind=str(options.get("kind") or ""),
        load=str(options.get("load") or ""),
        arrivals=str(options["arrivals"]) if options.get("rate") is not None else None,
        requested_rate=_num(options.get("rate")),
        concurrency=_concurrency(options),
        complete=False,
        stop_reason="running",
        requests_measured=0,
        requests_ok=0,
        requests_errored=0,
        request_throughput=None,
        token_throughput=None,
        request_throughput_steady=None,
        token_throughput_steady=None,
        generated_tokens_per_s=None,
        goodput_ratio=None,
        goodput_per_s=None,
        all_slos_met=None,
        summary=summary,
        instance=instance,
        **{f"{m}_{q}_s": None for m in LATENCY_METRICS for q in LATENCY_QUANTILES},
    )


def bench_rows(
    outcome: BenchOutcome, *, instance: str = "", redactor: Redactor | None = None
) -> tuple[BenchRunRow, list[BenchRequestRow]]:
    """The run row and its measured (non-warm-up) request rows; an incomplete run has complete=False."""
    redact = redactor or Redactor()
    run = run_row(outcome, instance=instance, redactor=redact)
    requests = [request_row(outcome.run_id, outcome.started_at_unix, r, redact) for r in outcome.measured]
    return run, requests


def instance_name(config: Config) -> str:
    """The instance recorded on the run: the config's `instance`, else the host name (as the exporter)."""
    return config.instance or socket.gethostname()


async def store_outcome(outcome: BenchOutcome, config: Config, *, secrets: Iterable[str | None] = ()) -> str:
    """Write the run and its measured requests in one transaction; returns a one-line confirmation.

    Raises StorageError (message already redacted) when the store cannot take the run.
    """
    instance = instance_name(config)
    run, requests = bench_rows(outcome, instance=instance, redactor=Redactor(secrets))
    store = await open_store(config.storage, instance=instance)
    try:
        new = await bench_store(store).write_bench(run, requests)
    finally:
        await store.close()
    what = "stored" if new else "already stored"
    size = counted(len(requests), "request")
    return f"{what}: bench run {run.id} ({size}) in {store.backend} {store.location}"


def capacity_row(
    cap: Capacity, options: dict[str, Any], *, finished_at: float, instance: str, redactor: Redactor
) -> CapacityRow:
    """A capacity search's result as its `bench_capacity` row; `options` are one of its points' (the same
    endpoint and model for every point)."""
    doc = cap.to_json()
    fluid = cap.mode == "fluid"
    tokens_key = "fluid_token_generation_rate_tokens_per_s" if fluid else "slo_capacity_tokens_per_s"
    return CapacityRow(
        id=uuid.uuid4().hex,
        finished_at=finished_at,
        endpoint=_endpoint(options, redactor),
        model=str(options.get("model") or ""),
        mode=cap.mode,
        result_rate=_num(cap.result_rate),
        output_tokens_per_s=_num(doc.get(tokens_key)),
        lower_bound=cap.lower_bound,
        summary=summary_text(doc, redactor),
        instance=instance,
    )


async def store_capacity(
    cap: Capacity, options: dict[str, Any], config: Config, *, secrets: Iterable[str | None] = ()
) -> str:
    """Write a search's result (not a sweep's: it has none); returns a one-line confirmation. Raises
    StorageError (message already redacted) when the store cannot take it."""
    instance = instance_name(config)
    row = capacity_row(cap, options, finished_at=time.time(), instance=instance, redactor=Redactor(secrets))
    store = await open_store(config.storage, instance=instance)
    try:
        await bench_store(store).write_capacity(row)
    finally:
        await store.close()
    return f"stored: {cap.mode} capacity of {row.endpoint} in {store.backend} {store.location}"
