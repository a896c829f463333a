"""The record of one probe run: status, timing source, token events and derived figures.

Everything downstream (Prometheus collectors, storage, reports, the benchmark) reads this one type.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from tokwatch.figures.series import DEFAULT_WORKLOAD, NO_SITE, SeriesKey
from tokwatch.figures.stats import percentile


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


class PrefillSource(StrEnum):
    """Where a run's prefill tok/s came from, best first (docs/methodology.md, "Prefill speed")."""

    ENGINE = "engine"  # llama.cpp timings.prompt_per_second, Ollama prompt_eval_count / prompt_eval_duration
    CLIENT_TTFT = "client_ttft"  # prompt tokens computed / TTFT, as the client saw it


SERVER_SOURCES = frozenset({TimingSource.ENGINE, TimingSource.VLLM_METRICS, TimingSource.SERVER_WALL})
CLIENT_SOURCES = frozenset({TimingSource.CLIENT_STREAM, TimingSource.CLIENT_WALL})

Phase = Literal["think", "output"]
Trigger = Literal["scheduled", "on_demand"]


@dataclass(slots=True)  # not frozen: one a chunk, and a frozen one costs three times as much to make
class TokenEvent:
    """One content-bearing stream chunk as the client received it.

    `t` is seconds since the request was sent (time.perf_counter based); `tokens` is how many tokens the
    chunk carries (>= 1; see docs/methodology.md for how a multi-token chunk is counted).
    """

    t: float
    tokens: int
    phase: Phase
    chars: int = 0


# The network phases a run exports, by blackbox_exporter's names (docs/methodology.md, "Network phases").
NETWORK_PHASES = ("resolve", "connect", "proxy_connect", "tls", "processing")


@dataclass(slots=True)
class RunResult:
    """One timed probe run. Figures are None when the run could not measure them.

    `network_rtt_s` is the network's share of TTFT: one round trip between the prober and whatever
    terminates its TCP connection, measured as the TCP connect (SYN to SYN-ACK, answered by the peer's
    kernel: no server code takes part) of the connection the timed run was sent on. TTFT starts once the
    request's last byte is on the socket, so connection set-up is not in it, but the request's way out and
    the first token's way back are: `ttft_s - network_rtt_s` is the time the server took. None when that
    connection was not opened in this round (kept alive from an earlier one) or the request failed first.
    """

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
    response_model: str | None = None  # the model the answer names (the span's gen_ai.response.model)
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
    # The series the run belongs to (tokwatch.figures.series): the workload it ran and the site it ran from.
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE
    # The prompt (docs/methodology.md, "Workloads and fresh prompts"): the size the workload asked for
    # (None: seed000's configured prompt), the seed and the filler words of its fresh part (together they
    # regenerate the prompt), whether the server's count missed the size by more than
    # `probe.prompt_tolerance`.
    prompt_target_tokens: int | None = None
    prompt_seed: str | None = None  # what the fresh part was drawn from: the run id, or `run_id/n`
    prompt_words: int | None = None
    prompt_size_missed: bool = False
    # Prompt tokens the server answered from its cache, where it says (usage cached_tokens, llama.cpp
    # timings.cache_n); cache_assisted: more of them than the fixed preamble every prompt shares.
    cached_tokens: int | None = None
    cache_assisted: bool = False
    prefill_tokens_per_second: float | None = None
    prefill_source: PrefillSource | None = None
    prefill_candidates: dict[PrefillSource, float] = field(default_factory=dict)

    @property
    def series(self) -> SeriesKey:
        """(endpoint, workload, site) of the run."""
        return SeriesKey(self.endpoint, self.workload, self.site)
    # Network phases (docs/methodology.md, "Network phases"): DNS, TCP connect and TLS handshake of the
    # connection the timed run was sent on, when this round opened it (usually the warm-up did); then from
    # the request's last byte on the socket to the read that brought the response headers.
    phase_resolve_s: float | None = None
    phase_connect_s: float | None = None
    phase_tls_s: float | None = None  # 0.0 over plain HTTP
    phase_processing_s: float | None = None
    network_rtt_s: float | None = None  # the network's share of TTFT (see the class docstring)
    connection_reused: bool | None = None  # the timed request went out on a connection already open
    # Through a proxy: its connection's CONNECT tunnel set-up (0.0 for plain HTTP, forwarded without one;
    # None straight); lookup, connect and round trip above are then the proxy's.
    phase_proxy_connect_s: float | None = None
    proxied: bool = False
    # HTTPS: unix times the server's leaf certificate and the earliest of the certificates it sent expire
    # (docs/methodology.md, "Certificate expiry"), parsed after the run from `peer_chain` (DER, leaf first,
    # kept on the result only until then).
    tls_cert_expiry_s: float | None = None
    tls_earliest_cert_expiry_s: float | None = None
    # Cost and energy (docs/methodology.md, "Cost and energy"), set after the run when the endpoint has
    # prices or a power source: what the run cost in `cost_currency` by `cost_method` (`list_price` hosted,
    # `compute_time` self-hosted), its prices per Mtok by phase; the energy its server's devices drew over
    # the timed run, the part above the idle baseline, and that baseline.
    cost: float | None = None
    cost_currency: str | None = None
    cost_method: str | None = None
    cost_prompt_per_mtok: float | None = None
    cost_generation_per_mtok: float | None = None
    cost_blended_per_mtok: float | None = None
    energy_j: float | None = None
    energy_net_j: float | None = None
    energy_idle_watts: float | None = None
    peer_chain: tuple[bytes, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        """True when the run counts towards tok/s averages."""
        return self.status is Status.OK

    @property
    def tps_set_aside(self) -> bool:
        """The run's tok/s figure is set aside: a client figure whose bound exceeded the tolerance."""
        return "tokens_per_second" in self.set_aside

    def network_phases(self) -> dict[str, float]:
        """The phases as the gauge exports them (`NETWORK_PHASES` order), for a run that got a response: the
        set-up phases of a connection kept from an earlier round are 0.0 (this round set nothing up; stored,
        they stay None: not measured), so the exported series do not depend on connection reuse."""
        if self.connection_reused is None:
            return {}
        out = {
            "resolve": self.phase_resolve_s or 0.0,
            "connect": self.phase_connect_s or 0.0,
            "tls": self.phase_tls_s or 0.0,
        }
        if self.proxied:  # a series of its own only for endpoints reached through a proxy
            out["proxy_connect"] = self.phase_proxy_connect_s or 0.0
        if self.phase_processing_s is not None:
            out["processing"] = self.phase_processing_s
        return out

    def itl_percentile(self, q: float) -> float | None:
        """Percentile (0-100) of the per-token inter-token latency, None without a stream."""
        return percentile(self.itl_s, q) if self.itl_s else None
