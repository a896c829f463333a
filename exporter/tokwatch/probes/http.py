"""The flow every HTTP probe kind shares: plan the request, send it, parse as it arrives, measure, judge."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from tokwatch import status as status_mod
from tokwatch.config import server_root
from tokwatch.error_bounds import CLIENT_STALL, FigureBounds, figure_bounds, judge_latencies
from tokwatch.probes.base import CounterMeasurement, Probe, ProbeContext
from tokwatch.request_options import merge_body, unique_prefix
from tokwatch.result import RunResult, Status, TimingSource, TokenEvent
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.events import StreamEvent, StreamParser
from tokwatch.streams.framing import decode_utf8
from tokwatch.streams.payload import loads_json
from tokwatch.timing import (
    client_stream_tps,
    client_wall_tps,
    itl,
    llamacpp_engine_tps,
    output_itl,
    select_within_tolerance,
    token_events,
    total_tokens,
    tpot,
    ttft,
    ttot,
)


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """Resolved request settings for one run (endpoint overrides applied)."""

    stream: bool
    max_tokens: int
    prompt: str
    system_prompt: str | None


def plan_for(ctx: ProbeContext, *, timed: bool = False) -> RequestPlan:
    """Probe settings with the endpoint's own overrides; a timed run's first message gets a unique prefix.

    The prefix goes at the very start of the first message (the system prompt when there is one), since
    prompt caches (vLLM's automatic prefix caching, llama.cpp's cache_prompt) reuse a shared leading run of
    tokens: anything after a shared system prompt would still hit the cache for that part.
    """
    ep, s = ctx.endpoint, ctx.settings
    prompt = ep.prompt or s.prompt
    system = ep.system_prompt if ep.system_prompt is not None else s.system_prompt
    if timed and s.timed_prompt == "unique":
        if system:
            system = unique_prefix() + system
        else:
            prompt = unique_prefix() + prompt
    return RequestPlan(
        stream=s.stream if ep.stream is None else ep.stream,
        max_tokens=ep.max_tokens or s.max_tokens,
        prompt=prompt,
        system_prompt=system,
    )


def chat_messages(plan: RequestPlan) -> list[dict[str, str]]:
    """Optional system message then the user prompt."""
    msgs = [{"role": "system", "content": plan.system_prompt}] if plan.system_prompt else []
    msgs.append({"role": "user", "content": plan.prompt})
    return msgs


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat request in no particular dialect: what the probe and the bench ask a server for."""

    model: str
    messages: Sequence[Mapping[str, str]]
    max_tokens: int
    stream: bool
    temperature: float
    fixed_output: bool = False  # add the kind's fixed-output fields: generate exactly max_tokens


class HttpProbe(Probe):
    """One POST, parsed incrementally, measured, classified; each kind's subclass supplies its dialect.

    The class-level answers (URL, body, parser, fixed output, counters) are all the probe, the bench and
    the server-counter readers know about a kind; they ask them through `tokwatch.probes.probe_class`.
    """

    # The /metrics dialect the kind's server publishes at <server root>/metrics, a key of
    # `tokwatch.counters.adapters.ADAPTERS`; None: counters only from a configured `metrics_url`.
    counter_adapter: ClassVar[str | None] = None
    # Ollama's own signals (model reloads, VRAM share from /api/ps) apply to this kind.
    ollama_signals: ClassVar[bool] = False
    # The server honours the fixed-output fields, so `probe.fixed_output` defaults to on and the bench
    # sends them when a workload asks for a fixed length.
    fixed_length: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def url(cls, base_url: str) -> str:
        """The generation URL under an endpoint's base URL."""

    @classmethod
    @abstractmethod
    def body(cls, request: ChatRequest) -> dict[str, Any]:
        """The JSON body in this kind's dialect, its fixed-output fields included when asked for."""

    @classmethod
    @abstractmethod
    def parser(cls) -> StreamParser:
        """A fresh incremental parser for a streamed answer."""

    @classmethod
    @abstractmethod
    def parse_whole(cls, obj: Any, t: float) -> list[StreamEvent]:
        """Events from a non-streamed JSON answer."""

    @classmethod
    def fixed_output_fields(cls, max_tokens: int) -> dict[str, Any]:
        """Body fields that ask for exactly `max_tokens` tokens ({}: the kind has none)."""
        return {}

    @classmethod
    def wants_fixed_output(cls, setting: bool | None) -> bool:
        """`probe.fixed_output`: None (default) = yes where the server honours it; never for kinds without."""
        return cls.fixed_length if setting is None else setting and bool(cls.fixed_output_fields(1))

    @classmethod
    def default_metrics_url(cls, base_url: str) -> str | None:
        """<server root>/metrics for kinds whose server publishes counters; None for the others."""
        return f"{server_root(base_url)}/metrics" if cls.counter_adapter is not None else None

    @classmethod
    def headers(cls, api_key: str | None) -> dict[str, str]:
        """Request headers; the API key goes only here, never into a log line."""
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @property
    def uses_counters(self) -> bool:
        """The kind's server publishes counters by default: timed runs are measured against them."""
        return self.counter_adapter is not None

    def request(self, ctx: ProbeContext, plan: RequestPlan) -> tuple[str, dict[str, Any]]:
        """The URL and JSON body of one probe run, before the endpoint's `extra_body`."""
        chat = ChatRequest(
            model=ctx.endpoint.model,
            messages=chat_messages(plan),
            max_tokens=plan.max_tokens,
            stream=plan.stream,
            temperature=ctx.settings.temperature,
            fixed_output=self.wants_fixed_output(ctx.settings.fixed_output),
        )
        return self.url(ctx.endpoint.base_url), self.body(chat)

    def server_candidates(self, col: StreamCollector, result: RunResult) -> dict[TimingSource, float]:
        """tok/s figures the server itself reported (llama.cpp `timings` for OpenAI-style answers)."""
        out: dict[TimingSource, float] = {}
        if col.timings is not None:
            t = col.timings
            tps = llamacpp_engine_tps(t.predicted_n, t.predicted_ms, t.predicted_per_second)
            if tps is not None:
                out[TimingSource.ENGINE] = tps
        return out

    def server_total(self, col: StreamCollector) -> tuple[int | None, Literal["usage", "engine"]]:
        """The server's completion-token total and where it came from."""
        if col.usage is not None and col.usage.completion_tokens is not None:
            return col.usage.completion_tokens, "usage"
        if col.timings is not None and col.timings.predicted_n is not None:
            return col.timings.predicted_n, "engine"
        return None, "usage"

    async def run_once(self, ctx: ProbeContext, *, timed: bool) -> RunResult:
        """Send one request and classify it; never raises."""
        plan = plan_for(ctx, timed=timed)
        result = RunResult(endpoint=ctx.endpoint.name, started_at=time.time(), status=Status.OK)
        result.streamed = plan.stream
        try:
            return await self._run(ctx, plan, result, timed)
        except Exception as exc:  # the contract is "never raises": anything unforeseen is a provider error
            return status_mod.apply(result, status_mod.classify_exception(exc), ctx.log.redact)

    async def _run(self, ctx: ProbeContext, plan: RequestPlan, result: RunResult, timed: bool) -> RunResult:
        url, body = self.request(ctx, plan)
        body = merge_body(body, ctx.endpoint.extra_body)  # the endpoint's own extra_body wins
        # Kinds that serve /metrics use it by default; any kind does when `metrics_url` is configured.
        wants_counters = self.uses_counters or ctx.endpoint.metrics_url is not None
        counters = ctx.counters if (timed and wants_counters) else None
        before = await _snapshot(ctx, counters)
        col = StreamCollector()
        sent_at = end = time.perf_counter()
        ctx.log(f"POST {url} stream={plan.stream} max_tokens={plan.max_tokens}")
        try:
            async with ctx.http.stream(
                "POST",
                url,
                json_body=body,
                headers=self.headers(ctx.api_key),
                timeout=ctx.endpoint.effective_timeout,
                max_bytes=ctx.settings.max_response_bytes,
            ) as resp:
                sent_at = resp.sent_at
                result.send_delay_s = resp.send_delay_s
                result.http_status = resp.status
                bad = status_mod.classify_http_status(resp.status)
                if bad is not None:
                    text = await _error_body(resp)
                    outcome = status_mod.classify_http_status(resp.status, text) or bad
                    return status_mod.apply(result, outcome, ctx.log.redact)
                content_type = resp.headers.get("Content-Type", "").lower()
                is_json = "json" in content_type and "ndjson" not in content_type
                if plan.stream and not is_json:
                    parser = self.parser()
                    async for t, data in resp.chunks():
                        col.add(parser.feed(data, t))
                    end = resp.last_byte_at or time.perf_counter()
                    col.add(parser.close(end))
                else:
                    # A server that ignores `stream` (or answers an error object with 200) sends one JSON.
                    raw = await resp.read()
                    end = resp.last_byte_at or time.perf_counter()
                    result.streamed = False
                    col.add(self.parse_whole(loads_json(decode_utf8(raw)), end))
                unreadable = status_mod.unreadable_answer(
                    content_type, col.events, resp.bytes_received, resp.status
                )
                if unreadable is not None:  # e.g. a proxy's HTML page with 200: unreadable, not slow
                    return status_mod.apply(result, unreadable, ctx.log.redact)
        except Exception as exc:
            outcome = status_mod.classify_exception(exc)
            ctx.log(f"request failed: {outcome.error_class}")
            if col.deltas and result.streamed:
                result.ttft_s = col.deltas[0].t - sent_at
            return status_mod.apply(result, outcome, ctx.log.redact)
        if result.streamed:
            result.merged_reads = col.merged_reads
        if ctx.stalls is not None:
            result.max_stall_s = ctx.stalls.max_stall(sent_at, end)
        after = await _snapshot(ctx, counters)
        measurement = _measure(ctx, counters, before, after)
        self._fill(ctx, result, col, sent_at, end, measurement)
        return result

    def _fill(
        self,
        ctx: ProbeContext,
        result: RunResult,
        col: StreamCollector,
        sent_at: float,
        end: float,
        measurement: CounterMeasurement | None,
    ) -> None:
        """Derived figures, tok/s candidates, source choice and the ok/degraded verdict."""
        total, total_source = self.server_total(col)
        events, result.tokens_source = token_events(col.deltas, sent_at, total, total_source)
        n = total if total is not None else total_tokens(events)
        if result.tokens_source is None and total is not None:
            result.tokens_source = total_source
        result.output_tokens = total_tokens(events, "output") if events else (n if total is not None else 0)
        result.think_tokens = total_tokens(events, "think") if events else 0
        if col.usage is not None:
            result.prompt_tokens = col.usage.prompt_tokens
        result.finish_reason = col.finish_reason
        result.e2e_s = end - sent_at
        bounds = _bounds(ctx, events, sent_at, end, result.e2e_s, n)
        candidates = self.server_candidates(col, result)
        if measurement is not None and measurement.tokens_per_second is not None:
            candidates[TimingSource.VLLM_METRICS] = measurement.tokens_per_second
        if result.streamed and events:
            result.ttft_s = ttft(events)
            result.itl_s = itl(events)
            result.output_itl_s = output_itl(events)
            result.ttot_s = ttot(events)
            result.tpot_s = tpot(result.e2e_s, result.ttft_s, n)
            cs = client_stream_tps(events, n)
            if cs is not None:
                candidates[TimingSource.CLIENT_STREAM] = cs
        cw = client_wall_tps(n, result.e2e_s)
        if cw is not None:
            candidates[TimingSource.CLIENT_WALL] = cw
        result.candidates = candidates
        tolerance = ctx.settings.tolerance
        tps_bounds = bounds.tps() if bounds is not None else {}
        chosen, set_aside = select_within_tolerance(
            candidates,
            ctx.settings.timing_preference,
            tps_bounds,
            tolerance.tokens_per_second,
            counters_shared=bool(measurement and measurement.shared),
            shared_policy=ctx.settings.shared_server_window,
        )
        for source, bound in tps_bounds.items():
            if source in candidates and bound > tolerance.tokens_per_second:
                ctx.log(
                    f"timing source {source}: a client stall bounds its error at {bound:.2%} "
                    f"(tolerance {tolerance.tokens_per_second:.2%})"
                )
        if set_aside:  # no server figure to fall back on: the run keeps it, but it is no window sample
            result.set_aside["tokens_per_second"] = CLIENT_STALL
        result.source, result.tokens_per_second = chosen.source, chosen.tokens_per_second
        if chosen.source is not None and bounds is not None:
            result.tps_error_ratio = tps_bounds.get(chosen.source, 0.0)
        if bounds is not None:
            judge_latencies(result, bounds, tolerance)
        result.timing_disturbed = bool(result.set_aside)
        if result.timing_disturbed:
            stall_ms = (result.max_stall_s or 0.0) * 1e3
            ctx.log(
                f"set aside ({', '.join(result.set_aside)}): the exporter's own lateness bounds their error "
                f"above the tolerance (the measurement loop stalled up to {stall_ms:.1f} ms)"
            )
        result.server_shared = chosen.server_shared
        for source, why in chosen.skipped.items():
            ctx.log(f"timing source {source} skipped: {why}")
        verdict = status_mod.judge_answer(
            result,
            completion_tokens=n,
            max_tokens=plan_for(ctx).max_tokens,
            short_output=ctx.settings.short_output,
            text_bytes=_text_bytes(col) if col.deltas else None,
            answered_model=col.model,
            configured_model=ctx.endpoint.model,
            model_aliases=ctx.endpoint.model_aliases,
            max_plausible_tps=ctx.settings.max_plausible_tokens_per_second,
        )
        if verdict is not None:
            status_mod.apply(result, verdict, ctx.log.redact)


def _bounds(
    ctx: ProbeContext, events: Sequence[TokenEvent], sent_at: float, end: float, e2e_s: float, n: int
) -> FigureBounds | None:
    """Error bounds of the run's client figures from the lateness of the stamps they use (None: unwatched)."""
    if ctx.stamps is None:
        return None
    late = ctx.stamps.lateness([*(sent_at + e.t for e in events), end])
    return figure_bounds(events, e2e_s, n, late[:-1], late[-1])


def _text_bytes(col: StreamCollector) -> int:
    """UTF-8 bytes of the generated text, `<think>` tags included (stripped from `text`, not from `chars`)."""
    return sum(len(d.text.encode()) + max(0, d.chars - len(d.text)) for d in col.deltas)


async def _error_body(resp: Any) -> str:
    """A bounded excerpt of an error answer's body; an unreadable body does not change the status."""
    try:
        return str(await resp.text())[:1000]
    except Exception:
        return ""


async def _snapshot(ctx: ProbeContext, counters: Any) -> object | None:
    """A counters snapshot; a failing scrape never fails the probe."""
    if counters is None:
        return None
    try:
        return await counters.snapshot()
    except Exception as exc:
        ctx.log(f"server counters snapshot failed: {type(exc).__name__}")
        return None


def _measure(
    ctx: ProbeContext, counters: Any, before: object | None, after: object | None
) -> CounterMeasurement | None:
    if counters is None:
        return None
    try:
        m: CounterMeasurement | None = counters.measure(before, after)
    except Exception as exc:
        ctx.log(f"server counters measure failed: {type(exc).__name__}")
        return None
    if m is not None and m.reason:
        ctx.log(f"server counters: {m.reason}")
    return m
