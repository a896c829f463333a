"""The simulator's own server span of a traced request: a child of the caller's span (its `traceparent`),
built from the request's ground truth once the answer is written (docs/tracing.md)."""

from __future__ import annotations

import time

from tokwatch.sim.truth import RequestTruth
from tokwatch.tracing.context import TraceIds, new_ids
from tokwatch.tracing.spans import SCHEDULED, AttrValue, Clock, RequestSpan, SpanEvent, timeline_events


def server_span(parent: TraceIds, rec: RequestTruth, clock: Clock) -> RequestSpan:
    """The span of one simulated request, from its arrival to its last token (its answer's end when it
    generated none), with the engine's scheduling and the tokens as events."""
    end = rec.finished_at or (rec.generated_at[-1] if rec.generated_at else time.perf_counter())
    events = [] if rec.scheduled_at is None else [SpanEvent(SCHEDULED, clock.unix_ns(rec.scheduled_at))]
    events += timeline_events(clock, rec.emitted_at, rec.think_tokens)
    attrs: dict[str, AttrValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "tokwatch.sim",
        "gen_ai.request.model": rec.model,
        "gen_ai.response.model": rec.model,
        "gen_ai.response.id": rec.request_id,
        "gen_ai.usage.input_tokens": rec.prompt_tokens,
        "gen_ai.usage.output_tokens": rec.tokens,
        "gen_ai.usage.cache_read.input_tokens": rec.cached_tokens,
        "http.response.status_code": rec.http_status,
        "tokwatch.sim.server": rec.server,
        "tokwatch.sim.dialect": rec.dialect,
        "tokwatch.sim.engine": rec.engine,
        "tokwatch.sim.preemptions": rec.preemptions,
    }
    if rec.think_tokens:
        attrs["gen_ai.usage.reasoning.output_tokens"] = rec.think_tokens
    if rec.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = rec.max_tokens
    if rec.finish_reason:
        attrs["gen_ai.response.finish_reasons"] = [rec.finish_reason]
    error = rec.fault or (f"http_{rec.http_status}" if rec.http_status >= 400 else None)
    if error is not None:
        attrs["error.type"] = error
    ids = new_ids(parent.trace_id)
    return RequestSpan(
        f"chat {rec.model}", ids, parent.span_id, "server", clock.unix_ns(rec.arrival), clock.unix_ns(end),
        attrs, tuple(events), error,
    )  # fmt: skip
