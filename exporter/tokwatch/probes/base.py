"""The one small interface every probe kind implements, and the warm-up + timed-run orchestration."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from tokwatch.figures.result import RunResult
from tokwatch.figures.series import NO_SITE
from tokwatch.figures.tokens import token_counter
from tokwatch.probes.prompts import PromptSizer, RecentStarts
from tokwatch.settings.redact import Redactor
from tokwatch.settings.workloads import SEED000, Workload
from tokwatch.tracing.context import RequestTrace
from tokwatch.transport.cert_expiry import cert_expiry

if TYPE_CHECKING:
    from tokwatch.settings.config import EndpointSettings, ProbeSettings
    from tokwatch.transport.http import HttpClient
    from tokwatch.transport.http_route import RouteSource
    from tokwatch.transport.measurement import StallMonitor, StampLateness


class ProbeLog:
    """Per-probe log lines (returned by `/probe?debug=true`), always redacted, bounded in size."""

    MAX_LINES = 200

    def __init__(self, redactor: Redactor | None = None) -> None:
        self._redact = redactor or Redactor()
        self._t0 = time.perf_counter()
        self.lines: list[str] = []

    def __call__(self, message: str) -> None:
        """Record one line, prefixed with seconds since the probe started."""
        if len(self.lines) < self.MAX_LINES:
            self.lines.append(f"{time.perf_counter() - self._t0:8.3f}s {self._redact(message)}")

    def redact(self, text: str) -> str:
        """Mask secrets in `text` (for error messages stored on the result)."""
        return self._redact(text)


@dataclass(frozen=True, slots=True)
class CounterMeasurement:
    """What the server's own counters say about one timed run (see tokwatch.counters)."""

    tokens_per_second: float | None
    shared: bool  # other requests ran in the window
    reason: str | None = None  # why the figure is missing or shared


class CounterWindow(Protocol):
    """Snapshots a server's /metrics around a timed run; implemented by the server-counters module."""

    async def snapshot(self) -> object | None:
        """Current counter values, or None when /metrics could not be read."""
        ...

    def measure(self, before: object | None, after: object | None) -> CounterMeasurement | None:
        """Decode tok/s from two snapshots, or None when they cannot give one."""
        ...


def prompt_sizer(endpoint: EndpointSettings, workload: Workload) -> PromptSizer:
    """A sizer for the endpoint's sized workload, counting with its tokenizer.json when it has one (loaded
    once per process; raises WorkloadError when it cannot be loaded)."""
    assert workload.input_tokens is not None
    counter = token_counter(endpoint.tokenizer) if endpoint.tokenizer else None
    return PromptSizer(workload.input_tokens, counter)


@dataclass
class ProbeContext:
    """Everything one probe run needs; built by the scheduler or the /probe handler."""

    endpoint: EndpointSettings
    settings: ProbeSettings
    http: HttpClient
    api_key: str | None
    log: ProbeLog
    # The endpoint's request headers, credential included (tokwatch.probes.keys); None: only `api_key`,
    # presented
    # the kind's default way.
    headers: Mapping[str, str] | None = None
    instance: str = ""
    counters: CounterWindow | None = None
    stalls: StallMonitor | None = None  # the measurement loop's heartbeat (None: disturbance not checked)
    # How late the client's stamps can be: the loop's heartbeat and, when the client stamps with a receive
    # watcher, that thread's (None: figures carry no error bound).
    stamps: StampLateness | None = None
    extra: dict[str, object] = field(default_factory=dict)
    workload: Workload = SEED000
    site: str = NO_SITE
    # Sizes a sized workload's prompts, learning from the server's counts run after run (None: a sizer of
    # this run's own, calibrated by its warm-up only).
    prompts: PromptSizer | None = None
    # The first words of the endpoint's latest prompts, which a fresh prompt does not start with (None: this
    # run's own, covering its warm-up).
    starts: RecentStarts | None = None
    # The endpoint's proxy and TLS settings (tokwatch.settings.reach; None: straight, the system's trust
    # store).
    reach: RouteSource | None = None
    # The timed run's trace (tokwatch.tracing): its `traceparent` goes on the request (None: not traced).
    trace: RequestTrace | None = None

    @property
    def timeout(self) -> float:
        """This run's timeout: the workload's, else the endpoint's scaled by the output asked for."""
        return self.workload.timeout_for(self.endpoint.effective_timeout, self.max_tokens)

    @property
    def max_tokens(self) -> int:
        """Output tokens asked for: the workload's, else the endpoint's or probe's max_tokens."""
        return self.workload.max_tokens(self.endpoint.max_tokens or self.settings.max_tokens)

    @property
    def warmup(self) -> bool:
        """Whether a discarded warm-up precedes the timed run (the workload's say, else probe.warmup)."""
        return self.settings.warmup if self.workload.warmup is None else self.workload.warmup
    # perf_counter when this round's context was made: a connection ready since then was opened by this
    # round (its warm-up, usually), so its set-up phases describe this round's network.
    round_started: float = field(default_factory=time.perf_counter)


class Probe(ABC):
    """One endpoint kind. `run_once` sends one request and never raises: every failure is a status."""

    kind: ClassVar[str]

    @abstractmethod
    async def run_once(self, ctx: ProbeContext, *, timed: bool) -> RunResult:
        """Send one request and classify it; `timed` is False for the discarded warm-up."""


async def run_probe(probe: Probe, ctx: ProbeContext) -> RunResult:
    """Warm-up (discarded, when configured) then one timed run; no retries."""
    if ctx.workload.sized and ctx.prompts is None:
        ctx.prompts = prompt_sizer(ctx.endpoint, ctx.workload)
    if ctx.starts is None:
        ctx.starts = RecentStarts()
    if ctx.warmup:
        warm = await probe.run_once(ctx, timed=False)
        ctx.log(f"warm-up: {warm.status.value} (discarded)")
    t0 = time.perf_counter()
    result = await probe.run_once(ctx, timed=True)
    result.duration_s = time.perf_counter() - t0
    if result.peer_chain:  # now that the run is over: parsing certificates never delays a stamp
        expiry = cert_expiry(result.peer_chain)
        if expiry is not None:
            result.tls_cert_expiry_s, result.tls_earliest_cert_expiry_s = expiry.leaf_s, expiry.earliest_s
        result.peer_chain = ()
    result.instance = ctx.instance
    result.workload, result.site = ctx.workload.name, ctx.site
    ctx.log(
        f"timed run: {result.status.value}"
        + (f", {result.tokens_per_second:.2f} tok/s from {result.source}" if result.tokens_per_second else "")
    )
    return result
