"""The stored form of a `tokwatch bench` run: one `bench_runs` row and one `bench_requests` row per request,
and for a run split over processes or machines one `bench_segments` row per segment.

Kept apart from the probe `runs` table so benchmark load never counts in the probe window figures. The store
owns these row types and their columns; the bench maps its outcome onto them (tokwatch.bench.storing).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


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


@dataclass(frozen=True, slots=True)
class BenchSegmentRow:
    """One segment of a split run (schema SQLite v7 / PostgreSQL v8); times are unix seconds by the
    segment's own clock."""

    bench_run_id: str
    segment: int  # K of --segment K/N
    segments: int  # N
    instance: str  # the machine (pod) that ran it
    start_at: float  # the common start it was given
    started_at: float  # when its measured phase began
    finished_at: float
    start_lag_s: float | None  # how late its first request went out against its planned instant
    clock_offset_s: float | None  # the store's clock minus the segment's; None without a server clock
    clock_error_s: float | None  # the offset is within +- this
    complete: bool
    stop_reason: str
    message: str | None
    arrivals_planned: int | None  # requests of its share of the schedule within --number/--duration
    requests_measured: int
    requests_ok: int
    cpu_s: float | None
    summary: str  # the segment's own summary.json as JSON text (jsonb in PostgreSQL)


# Column order shared by every backend's INSERT.
BENCH_RUN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchRunRow))
BENCH_REQUEST_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchRequestRow))
BENCH_SEGMENT_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchSegmentRow))


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """One `bench_capacity` row: a capacity search's result (capacity.json as `summary`, JSON text)."""

    id: str
    finished_at: float
    endpoint: str  # the configured endpoint name, or the URL with any credentials masked
    model: str
    mode: str  # "fluid" or "slo"
    result_rate: float | None  # highest passing request rate, req/s
    output_tokens_per_s: float | None  # output tokens/s measured at that rate
    lower_bound: bool  # no rate failed: the capacity is at least this
    summary: str
    instance: str = ""


CAPACITY_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(CapacityRow))
