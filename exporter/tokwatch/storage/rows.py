"""The stored form of a run: a flat, JSON-safe row mapped from `tokwatch.figures.result.RunResult`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from tokwatch.figures.result import RunResult
from tokwatch.figures.series import DEFAULT_WORKLOAD, NO_SITE
from tokwatch.settings.redact import Redactor

ERROR_CLASS_MAX = 64
ERROR_MESSAGE_MAX = 500


@dataclass(frozen=True, slots=True)
class RunRow:
    """One row of the `runs` table; `time` is unix seconds (the run's start)."""

    run_id: str
    time: float
    endpoint: str
    status: str
    tokens_per_second: float | None = None
    timing_source: str | None = None
    server_shared: bool = False
    output_tokens: int | None = None
    think_tokens: int | None = None
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    ttot_s: float | None = None
    tpot_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    e2e_s: float | None = None
    http_status: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    cold: bool | None = None
    instance: str = ""
    triggered_by: str = "scheduled"  # "scheduled" or "on_demand" (/probe)
    timing_disturbed: bool = False
    max_stall_s: float | None = None
    merged_reads: int | None = None
    send_delay_s: float | None = None
    duration_s: float | None = None  # wall time of the timed run until it completed or failed
    # Error bounds from the client's own lateness (docs/methodology.md, "Disturbance"): relative for tok/s
    # (0: a server figure), seconds for the latencies; the figures set aside (comma-separated FIGURES of
    # tokwatch.probes.error_bounds) and whether tok/s is one (NULL: stored before figures were judged one by
    # one).
    tps_error_ratio: float | None = None
    ttft_error_s: float | None = None
    itl_error_s: float | None = None
    tpot_error_s: float | None = None
    ttot_error_s: float | None = None
    e2e_error_s: float | None = None
    set_aside: str | None = None
    tps_set_aside: bool | None = None
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE
    prompt_target_tokens: int | None = None
    prompt_seed: str | None = None
    prompt_words: int | None = None
    prompt_size_missed: bool = False
    cached_tokens: int | None = None
    cache_assisted: bool = False
    prefill_tokens_per_second: float | None = None
    prefill_source: str | None = None
    # Network phases (RunResult, docs/methodology.md "Network phases").
    phase_resolve_s: float | None = None
    phase_connect_s: float | None = None
    phase_tls_s: float | None = None
    phase_processing_s: float | None = None
    network_rtt_s: float | None = None
    connection_reused: bool | None = None
    phase_proxy_connect_s: float | None = None  # through a proxy: its tunnel's set-up
    # Cost and energy (RunResult, docs/methodology.md "Cost and energy").
    cost: float | None = None
    cost_currency: str | None = None
    cost_method: str | None = None
    cost_prompt_per_mtok: float | None = None
    cost_generation_per_mtok: float | None = None
    cost_blended_per_mtok: float | None = None
    energy_j: float | None = None
    energy_net_j: float | None = None
    energy_idle_watts: float | None = None

    @classmethod
    def from_result(
        cls, result: RunResult, *, redactor: Redactor | None = None, instance: str = ""
    ) -> RunRow:
        """Map a probe result to a row; error text is redacted again and truncated (defence in depth)."""
        redact = redactor or Redactor()
        message = redact(result.error_message)[:ERROR_MESSAGE_MAX] if result.error_message else None
        error_class = redact(result.error_class)[:ERROR_CLASS_MAX] if result.error_class else None
        return cls(
            run_id=result.run_id,
            time=float(result.started_at),
            endpoint=result.endpoint,
            status=str(result.status),
            tokens_per_second=result.tokens_per_second,
            timing_source=str(result.source) if result.source is not None else None,
            server_shared=bool(result.server_shared),
            output_tokens=result.output_tokens,
            think_tokens=result.think_tokens,
            prompt_tokens=result.prompt_tokens,
            ttft_s=result.ttft_s,
            ttot_s=result.ttot_s,
            tpot_s=result.tpot_s,
            itl_p50_s=result.itl_percentile(50),
            itl_p95_s=result.itl_percentile(95),
            itl_p99_s=result.itl_percentile(99),
            e2e_s=result.e2e_s,
            http_status=result.http_status,
            error_class=error_class,
            error_message=message,
            cold=result.cold,
            instance=result.instance or instance,
            triggered_by=result.trigger,
            timing_disturbed=bool(result.timing_disturbed),
            max_stall_s=result.max_stall_s,
            merged_reads=result.merged_reads,
            send_delay_s=result.send_delay_s,
            duration_s=result.duration_s,
            tps_error_ratio=result.tps_error_ratio,
            ttft_error_s=result.ttft_error_s,
            itl_error_s=result.itl_error_s,
            tpot_error_s=result.tpot_error_s,
            ttot_error_s=result.ttot_error_s,
            e2e_error_s=result.e2e_error_s,
            set_aside=",".join(result.set_aside) or None,
            tps_set_aside=result.tps_set_aside,
            workload=result.workload,
            site=result.site,
            prompt_target_tokens=result.prompt_target_tokens,
            prompt_seed=result.prompt_seed,
            prompt_words=result.prompt_words,
            prompt_size_missed=bool(result.prompt_size_missed),
            cached_tokens=result.cached_tokens,
            cache_assisted=bool(result.cache_assisted),
            prefill_tokens_per_second=result.prefill_tokens_per_second,
            prefill_source=str(result.prefill_source) if result.prefill_source is not None else None,
            phase_resolve_s=result.phase_resolve_s,
            phase_connect_s=result.phase_connect_s,
            phase_tls_s=result.phase_tls_s,
            phase_proxy_connect_s=result.phase_proxy_connect_s,
            phase_processing_s=result.phase_processing_s,
            network_rtt_s=result.network_rtt_s,
            connection_reused=result.connection_reused,
            cost=result.cost,
            cost_currency=result.cost_currency,
            cost_method=result.cost_method,
            cost_prompt_per_mtok=result.cost_prompt_per_mtok,
            cost_generation_per_mtok=result.cost_generation_per_mtok,
            cost_blended_per_mtok=result.cost_blended_per_mtok,
            energy_j=result.energy_j,
            energy_net_j=result.energy_net_j,
            energy_idle_watts=result.energy_idle_watts,
        )

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the outbox file."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRow:
        """Inverse of `to_json`; unknown keys (from a newer outbox writer) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# Column order shared by every backend's INSERT/COPY (endpoint becomes endpoint_id).
RUN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RunRow) if f.name != "endpoint")


def series_spans(rows: Iterable[RunRow]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(endpoint, workload, site) -> (first, last) run time among `rows`: what the `run_series` table takes
    in from one write."""
    out: dict[tuple[str, str, str], tuple[float, float]] = {}
    for r in rows:
        key = (r.endpoint, r.workload, r.site)
        first, last = out.get(key, (r.time, r.time))
        out[key] = (min(first, r.time), max(last, r.time))
    return out

