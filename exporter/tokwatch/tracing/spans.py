"""Spans as plain data, built after a request from the stamps it recorded (no OpenTelemetry import here).

Attribute names follow the OpenTelemetry GenAI semantic conventions (gen_ai.*, checked against
opentelemetry-semantic-conventions 0.66b0) and the HTTP/server ones; tokwatch's own figures are under
`tokwatch.*` (docs/tracing.md lists them all).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal, Protocol
from urllib.parse import urlsplit

from tokwatch.figures.result import RunResult, Status
from tokwatch.tracing.context import RequestTrace, TraceIds

AttrValue = str | bool | int | float | Sequence[str]
SpanKindName = Literal["client", "server"]

# Events on a request's span, in the order they happen.
SLOT_TAKEN = "tokwatch.slot_taken"  # bench: the request got its concurrency slot (queue time before it)
REQUEST_SENT = "tokwatch.request_sent"
FIRST_TOKEN = "tokwatch.first_token"
THINK_END = "tokwatch.think_end"  # the last reasoning token
OUTPUT_START = "tokwatch.output_start"  # the first answer token after reasoning
LAST_TOKEN = "tokwatch.last_token"
SCHEDULED = "tokwatch.scheduled"  # the simulator's engine took the request

# gen_ai.provider.name by kind: the convention's well-known values where the kind is that provider's API,
# else the kind itself (the convention allows other values for other systems).
PROVIDERS = {"openai": "openai", "anthropic": "anthropic"}


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """A point in a span: name and unix time in nanoseconds."""

    name: str
    at_ns: int


@dataclass(frozen=True, slots=True)
class RequestSpan:
    """One finished span, times in unix nanoseconds; `error` is error.type when the request failed."""

    name: str
    ids: TraceIds
    parent_span_id: int | None
    kind: SpanKindName
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttrValue]
    events: tuple[SpanEvent, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Clock:
    """perf_counter seconds to unix nanoseconds, by one offset read when the clock is made (the spans of a
    process agree with each other exactly; with the wall clock to its accuracy)."""

    offset_ns: int = field(default_factory=lambda: wall_minus_perf_ns())

    def unix_ns(self, perf_s: float) -> int:
        """The unix time in ns of a perf_counter stamp."""
        return self.offset_ns + round(perf_s * 1e9)


def wall_minus_perf_ns(reads: int = 50) -> int:
    """time.time_ns() - perf_counter ns, from the tightest of a few bracketed reads."""
    best: tuple[int, int] | None = None
    for _ in range(reads):
        a = time.perf_counter_ns()
        wall = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, wall - (a + b) // 2)
    assert best is not None
    return best[1]


@dataclass(frozen=True, slots=True)
class Peer:
    """What a request went to: the kind (its provider name), the model asked for and the URL."""

    kind: str
    model: str
    url: str

    def attributes(self) -> dict[str, AttrValue]:
        """gen_ai.provider.name, gen_ai.request.model, server.address, server.port."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDERS.get(self.kind, self.kind),
            "gen_ai.request.model": self.model,
            "server.address": parts.hostname or "",
            "server.port": port,
            "tokwatch.kind": self.kind,
        }


class Figures(Protocol):
    """What a probe run (RunResult) and a bench request (RequestRecord) both record."""

    @property
    def status(self) -> Status: ...
    @property
    def http_status(self) -> int | None: ...
    @property
    def error_class(self) -> str | None: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def response_model(self) -> str | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...
    @property
    def think_tokens(self) -> int | None: ...
    @property
    def cached_tokens(self) -> int | None: ...
    @property
    def tokens_source(self) -> str | None: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def ttot_s(self) -> float | None: ...
    @property
    def tpot_s(self) -> float | None: ...
    @property
    def e2e_s(self) -> float | None: ...


class BenchRecord(Figures, Protocol):
    """A bench request's record (tokwatch.bench.request_metrics.RequestRecord) as the span reads it."""

    @property
    def request_id(self) -> int: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def server_request_id(self) -> str | None: ...
    @property
    def dispatched_at_s(self) -> float: ...
    @property
    def started_at_s(self) -> float: ...
    @property
    def scheduling_lag_s(self) -> float | None: ...
    @property
    def queue_time_s(self) -> float: ...
    @property
    def connect_s(self) -> float: ...
    @property
    def sent_at_s(self) -> float: ...
    @property
    def completed_at_s(self) -> float | None: ...
    @property
    def warmup(self) -> bool: ...
    @property
    def category(self) -> str: ...
    @property
    def tbt_s(self) -> list[float]: ...


def figure_attributes(f: Figures) -> dict[str, AttrValue]:
    """The GenAI usage and response attributes and tokwatch's figures of a finished request."""
    think, output = f.think_tokens or 0, f.output_tokens or 0
    attrs: dict[str, AttrValue | None] = {
        "gen_ai.response.model": f.response_model,
        "gen_ai.response.finish_reasons": [f.finish_reason] if f.finish_reason else None,
        "gen_ai.usage.input_tokens": f.prompt_tokens,
        "gen_ai.usage.output_tokens": think + output if f.status is Status.OK or think + output else None,
        "gen_ai.usage.reasoning.output_tokens": think or None,
        "gen_ai.usage.cache_read.input_tokens": f.cached_tokens,
        "gen_ai.response.time_to_first_chunk": f.ttft_s,
        "http.response.status_code": f.http_status,
        "error.type": (f.error_class or f.status.value) if f.status is not Status.OK else None,
        "tokwatch.status": f.status.value,
        "tokwatch.error_class": f.error_class,
        "tokwatch.tokens_source": f.tokens_source,
        "tokwatch.output_tokens": f.output_tokens,
        "tokwatch.think_tokens": f.think_tokens,
        "tokwatch.ttft_s": f.ttft_s,
        "tokwatch.ttot_s": f.ttot_s,
        "tokwatch.tpot_s": f.tpot_s,
        "tokwatch.e2e_s": f.e2e_s,
    }
    return {k: v for k, v in attrs.items() if v is not None}


def token_events(
    clock: Clock, sent: float, ttft_s: float | None, gaps: Sequence[float], think_tokens: int | None
) -> list[SpanEvent]:
    """First token, the end of reasoning and the first answer token (when the stream had both), last
    token: from the send stamp, TTFT and the per-token gaps the record keeps."""
    if ttft_s is None:
        return []
    return timeline_events(clock, [sent + ttft_s + t for t in (0.0, *accumulate(gaps))], think_tokens)


def timeline_events(clock: Clock, times: Sequence[float], think_tokens: int | None) -> list[SpanEvent]:
    """The token events of a stream from every token's perf_counter time (reasoning tokens first)."""
    if not times:
        return []
    events = [SpanEvent(FIRST_TOKEN, clock.unix_ns(times[0]))]
    think = think_tokens or 0
    if 0 < think < len(times):
        events.append(SpanEvent(THINK_END, clock.unix_ns(times[think - 1])))
        events.append(SpanEvent(OUTPUT_START, clock.unix_ns(times[think])))
    events.append(SpanEvent(LAST_TOKEN, clock.unix_ns(times[-1])))
    return events


def _name(model: str) -> str:
    return f"chat {model}"  # the convention's `{gen_ai.operation.name} {gen_ai.request.model}`


def probe_span(
    trace: RequestTrace, result: RunResult, peer: Peer, clock: Clock, *, max_tokens: int, now: float
) -> RequestSpan:
    """The span of a timed probe run: from the call of the client to the last byte (a failed run: to
    `now`, when its result came back), the send and the tokens as events. A run that failed before its
    request was built (no `called_at`) is a point at `now`."""
    start = trace.called_at or now
    sent = start + result.send_delay_s if trace.called_at and result.send_delay_s is not None else None
    end = sent + result.e2e_s if sent is not None and result.e2e_s is not None else now
    events = [] if sent is None else [SpanEvent(REQUEST_SENT, clock.unix_ns(sent))]
    if sent is not None:
        events += token_events(clock, sent, result.ttft_s, result.itl_s, result.think_tokens)
    attrs: dict[str, AttrValue] = {
        **peer.attributes(),
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.request.stream": result.streamed,
        **figure_attributes(result),
        "tokwatch.face": "probe",
        "tokwatch.endpoint": result.endpoint,
        "tokwatch.workload": result.workload,
        "tokwatch.run_id": result.run_id,
        "tokwatch.trigger": result.trigger,
    }
    if result.site:
        attrs["tokwatch.site"] = result.site
    if result.tokens_per_second is not None:
        attrs["tokwatch.tokens_per_second"] = result.tokens_per_second
    if result.source is not None:
        attrs["tokwatch.timing_source"] = result.source.value
    return RequestSpan(
        _name(peer.model), trace.ids, None, "client", clock.unix_ns(start), clock.unix_ns(end),
        attrs, tuple(events), _error(result),
    )  # fmt: skip


def bench_span(
    trace: RequestTrace, record: BenchRecord, peer: Peer, clock: Clock, *, run_t0: float
) -> RequestSpan:
    """The span of a bench request, its whole lifecycle: from its dispatch (the generator released it) to
    its completion, times the record's own stamps (seconds since `run_t0`, a perf_counter value)."""
    start = run_t0 + min(record.dispatched_at_s, record.started_at_s)
    sent = run_t0 + record.sent_at_s
    end = run_t0 + (record.completed_at_s if record.completed_at_s is not None else record.sent_at_s)
    events = [
        SpanEvent(SLOT_TAKEN, clock.unix_ns(run_t0 + record.started_at_s)),
        SpanEvent(REQUEST_SENT, clock.unix_ns(sent)),
    ]
    events += token_events(clock, sent, record.ttft_s, record.tbt_s, record.think_tokens)
    attrs: dict[str, AttrValue] = {
        **peer.attributes(),
        "gen_ai.request.stream": True,
        **figure_attributes(record),
        "tokwatch.face": "bench",
        "tokwatch.request_id": record.request_id,
        "tokwatch.category": record.category,
        "tokwatch.warmup": record.warmup,
        "tokwatch.queue_time_s": record.queue_time_s,
        "tokwatch.connect_s": record.connect_s,
    }
    if record.scheduling_lag_s is not None:
        attrs["tokwatch.scheduling_lag_s"] = record.scheduling_lag_s
    if record.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = record.max_tokens
    if record.server_request_id:
        attrs["gen_ai.response.id"] = record.server_request_id
    return RequestSpan(
        _name(peer.model), trace.ids, None, "client", clock.unix_ns(start), clock.unix_ns(end),
        attrs, tuple(events), _error(record),
    )  # fmt: skip


def _error(f: Figures) -> str | None:
    return None if f.status is Status.OK else (f.error_class or f.status.value)
