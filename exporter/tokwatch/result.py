"""The record of one probe run: status, timing source, token events and derived figures.

Everything downstream (Prometheus collectors, storage, reports, the benchmark) reads this one type.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from tokwatch.stats import percentile


class Status(StrEnum):
    """Exactly one per run (docs/methodology.md, "Status")."""

    OK = "ok"
    TIMEOUT = "timeout"
    RATE_LIMITED = "rate_limited"
    PROVIDER_ERROR = "provider_error"
    AUTH_FAILURE = "auth_failure"
    UNREACHABLE = "unreachable"
    DEGRADED = "degraded"


class TimingSource(StrEnum):
    """Where a run's tok/s came from, best first in the default preference order."""

    ENGINE = "engine"
    VLLM_METRICS = "vllm_metrics"
    SERVER_WALL = "server_wall"
    CLIENT_STREAM = "client_stream"
    CLIENT_WALL = "client_wall"


SERVER_SOURCES = frozenset({TimingSource.ENGINE, TimingSource.VLLM_METRICS, TimingSource.SERVER_WALL})
CLIENT_SOURCES = frozenset({TimingSource.CLIENT_STREAM, TimingSource.CLIENT_WALL})

Phase = Literal["think", "output"]
Trigger = Literal["scheduled", "on_demand"]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One content-bearing stream chunk as the client received it.

    `t` is seconds since the request was sent (time.perf_counter based); `tokens` is how many tokens the
    chunk carries (>= 1; see docs/methodology.md for how a multi-token chunk is counted).
    """

    t: float
    tokens: int
    phase: Phase
    chars: int = 0


@dataclass(slots=True)
class RunResult:
    """One timed probe run. Figures are None when the run could not measure them."""

    endpoint: str
    started_at: float  # unix seconds when the request was sent
    status: Status
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    http_status: int | None = None
    error_class: str | None = None  # short, bounded vocabulary (e.g. "http_429", "read_timeout")
    error_message: str | None = None  # redacted, truncated to 500 chars
    tokens_per_second: float | None = None
    source: TimingSource | None = None
    server_shared: bool = False  # the server-counter window saw other requests
    candidates: dict[TimingSource, float] = field(default_factory=dict)  # tok/s by every source measured
    output_tokens: int | None = None
    think_tokens: int | None = None
    prompt_tokens: int | None = None
    tokens_source: Literal["usage", "engine", "chunk_usage", "client_estimate"] | None = None
    ttft_s: float | None = None
    ttot_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    duration_s: float | None = None  # wall time of the timed run, also for runs that failed
    itl_s: list[float] = field(default_factory=list)  # per-token gaps, whole stream
    output_itl_s: list[float] = field(default_factory=list)  # per-token gaps, output phase only
    streamed: bool = False
    cold: bool | None = None  # Ollama load_duration > 0 on the hot run
    finish_reason: str | None = None
    instance: str = ""
    # What started the run: the schedule, or an on-demand /probe request (excluded from window figures).
    trigger: Trigger = "scheduled"
    # Measurement integrity (docs/methodology.md, "Disturbance"): the client's own lateness during the
    # stream bounds the error of each client-timed figure; a figure whose bound exceeds its tolerance is set
    # aside (kept on the run, left out of histograms and window figures). The run's status always counts.
    timing_disturbed: bool = False  # at least one figure was set aside (`set_aside` not empty)
    set_aside: dict[str, str] = field(default_factory=dict)  # figure (error_bounds.FIGURES) -> reason
    tps_error_ratio: float | None = None  # bound on tokens_per_second's relative error (0: a server source)
    ttft_error_s: float | None = None  # bounds on the latency figures' errors, in seconds
    itl_error_s: float | None = None  # the largest bound of the ITL p50, p95 and p99
    tpot_error_s: float | None = None
    ttot_error_s: float | None = None
    e2e_error_s: float | None = None
    max_stall_s: float | None = None  # largest measurement-loop stall seen while the run was in flight
    merged_reads: int | None = None  # socket reads that carried two or more content events
    send_delay_s: float | None = None  # from calling the client to the request's last byte on the socket

    @property
    def ok(self) -> bool:
        """True when the run counts towards tok/s averages."""
        return self.status is Status.OK

    @property
    def tps_set_aside(self) -> bool:
        """The run's tok/s figure is set aside: a client figure whose bound exceeded the tolerance."""
        return "tokens_per_second" in self.set_aside

    def itl_percentile(self, q: float) -> float | None:
        """Percentile (0-100) of the per-token inter-token latency, None without a stream."""
        return percentile(self.itl_s, q) if self.itl_s else None
