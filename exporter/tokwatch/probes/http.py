"""The flow every HTTP probe kind shares: plan the request, send it, parse as it arrives, measure, judge."""

from __future__ import annotations

import asyncio
import math
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from tokwatch.figures.result import PrefillSource, RunResult, Status, TimingSource
from tokwatch.figures.timing import (
    client_prefill_tps,
    decoded_in_one_read,
    llamacpp_engine_tps,
    llamacpp_prefill_tps,
    select_within_tolerance,
)
from tokwatch.probes import status as status_mod
from tokwatch.probes.base import CounterMeasurement, Probe, ProbeContext
from tokwatch.probes.error_bounds import CLIENT_STALL, ONE_READ, judge_latencies
from tokwatch.probes.exchange import Exchange, Request, answer_verdict, run_exchange
from tokwatch.probes.prompts import FreshPrompt, fresh_prefix
from tokwatch.settings.access import Credentials, auth_headers, merge_headers, with_query
from tokwatch.settings.config import EndpointSettings, server_root
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.events import StreamEvent, StreamParser
from tokwatch.tracing.context import traced_headers
from tokwatch.transport.request_options import merge_body

# A sized workload's warm-up asks for at most this many tokens: it loads the model and calibrates the
# prompt size; a long workload's full output would double its cost for nothing measured.
WARMUP_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """Resolved request settings for one run (endpoint overrides and the workload applied)."""

    stream: bool
    max_tokens: int
    prompt: str
    system_prompt: str | None
    fresh: FreshPrompt | None = None  # a sized workload's prompt (the user message)
    target_tokens: int | None = None  # the size it was made for
    seed: str | None = None  # what the fresh part (filler, or seed000's fresh sentence) was drawn from


def plan_for(ctx: ProbeContext, *, timed: bool = False, run_id: str = "") -> RequestPlan:
    """seed000's request: the configured prompt with the endpoint's overrides; a timed run's first message
    starts with a fresh three-word sentence drawn from the run id (`ctx.starts` picks the seed).

    The fresh start goes at the very start of the first message (the system prompt when there is one),
    since prompt caches (vLLM's automatic prefix caching, llama.cpp's cache_prompt) reuse a shared leading
    run of tokens: all a timed run then shares with any earlier request is the chat template's preamble.
    """
    ep, s = ctx.endpoint, ctx.settings
    prompt = ep.prompt or s.prompt
    system = ep.system_prompt if ep.system_prompt is not None else s.system_prompt
    seed = None
    if timed and s.timed_prompt == "unique":
        led = system or prompt  # the fresh sentence must not start as the text it leads does
        seed = _seed(ctx, run_id, led.split()[:1])
        if system:
            system = fresh_prefix(seed) + system
        else:
            prompt = fresh_prefix(seed) + prompt
    return RequestPlan(
        stream=s.stream if ep.stream is None else ep.stream,
        max_tokens=ctx.max_tokens,
        prompt=prompt,
        system_prompt=system,
        seed=seed,
    )


def _seed(ctx: ProbeContext, run_id: str, also: list[str]) -> str:
    """The fresh part's seed: the run id, unless a recent prompt of the endpoint starts as it would."""
    return run_id if ctx.starts is None else ctx.starts.seed_for(run_id, [w.strip(".,") for w in also])


async def plan_run(ctx: ProbeContext, *, timed: bool, run_id: str) -> RequestPlan:
    """The request of one run: seed000's (`plan_for`), or a sized workload's fresh prompt drawn from the run
    id alone in the user message, sized by `ctx.prompts` in a worker thread (a tokenizer's counts would
    hold up the measurement loop's other runs)."""
    if not ctx.workload.sized:
        return plan_for(ctx, timed=timed, run_id=run_id)
    assert ctx.prompts is not None  # run_probe gives a sized workload its sizer
    seed = _seed(ctx, run_id, [])
    fresh = await asyncio.to_thread(ctx.prompts.build, seed)
    ep, s = ctx.endpoint, ctx.settings
    return RequestPlan(
        stream=s.stream if ep.stream is None else ep.stream,
        max_tokens=ctx.max_tokens if timed else min(ctx.max_tokens, WARMUP_MAX_TOKENS),
        prompt=fresh.text,
        system_prompt=None,
        fresh=fresh,
        target_tokens=ctx.workload.input_tokens,
        seed=seed,
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

    # The request field that carries a think-token budget, as docs/bench.md names it (None: the kind's API
    # has none; only max_tokens bounds the think phase).
    think_budget_field: ClassVar[str | None] = None
    # The smallest think budget the API accepts (Anthropic: 1,024); a smaller one is raised to it.
    min_think_budget: ClassVar[int] = 0

    @classmethod
    def think_budget(cls, budget: int) -> int | None:
        """The think budget this kind's server is asked for when a request draws `budget` (None: none)."""
        return max(budget, cls.min_think_budget) if cls.think_budget_field is not None else None

    @classmethod
    def with_thinking(cls, body: dict[str, Any], budget: int | None) -> dict[str, Any]:
        """`body` asking the model to think, within `budget` tokens where the kind has a budget field
        (`think_budget(...)`); unchanged where the API has no way to ask (OpenAI: `reasoning_effort` is a
        level, set it with extra_body)."""
        return body

    @classmethod
    def wants_fixed_output(cls, setting: bool | None) -> bool:
        """`probe.fixed_output`: None (default) = yes where the server honours it; never for kinds without."""
        return cls.fixed_length if setting is None else setting and bool(cls.fixed_output_fields(1))

    @classmethod
    def default_metrics_url(cls, base_url: str) -> str | None:
        """<server root>/metrics for kinds whose server publishes counters; None for the others."""
        return f"{server_root(base_url)}/metrics" if cls.counter_adapter is not None else None

    # What ends one event of a streamed answer (SSE: a blank line): a kernel-stamped read that holds exactly
    # one event, ending the read, carries that event's exact arrival (tokwatch.probes.exchange).
    event_separator: ClassVar[bytes] = b"\n\n"

    # The header the api key goes in when the endpoint sets no `auth` (None: `Authorization: Bearer`).
    auth_header: ClassVar[str | None] = None

    @classmethod
    def protocol_headers(cls) -> dict[str, str]:
        """Headers the kind's API itself asks for (e.g. a version), before the endpoint's own headers."""
        return {}

    @classmethod
    def headers(cls, api_key: str | None) -> dict[str, str]:
        """Request headers with only an API key, presented the kind's default way; never logged."""
        return merge_headers(cls.protocol_headers(), auth_headers(None, cls.auth_header, api_key, None))

    @classmethod
    def endpoint_headers(cls, endpoint: EndpointSettings, credentials: Credentials) -> dict[str, str]:
        """An endpoint's request headers: the kind's, the endpoint's `headers` (which may replace them),
        then the credential header `auth` (or the kind's default) makes of the key or password."""
        credential = auth_headers(endpoint.auth, cls.auth_header, credentials.api_key, credentials.password)
        return merge_headers(cls.protocol_headers(), credentials.headers, credential)

    @classmethod
    def endpoint_url(cls, endpoint: EndpointSettings) -> str:
        """The generation URL of an endpoint: the kind's route under base_url, or base_url + `path`, with
        the endpoint's `query` parameters."""
        url = f"{endpoint.base_url}{endpoint.path}" if endpoint.path else cls.url(endpoint.base_url)
        return with_query(url, endpoint.query)

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
        return self.endpoint_url(ctx.endpoint), self.body(chat)

    # The readers of the server's own counts: class-level, so the exchange (`tokwatch.probes.exchange`) reads
    # them for the probe and the bench alike, and no code outside the kind's module names its wire fields.
    @classmethod
    def server_candidates(cls, col: StreamCollector) -> dict[TimingSource, float]:
        """tok/s figures the server itself reported (llama.cpp `timings` for OpenAI-style answers)."""
        out: dict[TimingSource, float] = {}
        if col.timings is not None:
            t = col.timings
            tps = llamacpp_engine_tps(t.predicted_n, t.predicted_ms, t.predicted_per_second)
            if tps is not None:
                out[TimingSource.ENGINE] = tps
        return out

    @classmethod
    def server_prefill(cls, col: StreamCollector) -> float | None:
        """The server's own prefill tok/s (llama.cpp `timings` for OpenAI-style answers), None without."""
        t = col.timings
        return None if t is None else llamacpp_prefill_tps(t.prompt_n, t.prompt_ms, t.prompt_per_second)

    @classmethod
    def server_prompt(cls, col: StreamCollector) -> tuple[int | None, int | None]:
        """(prompt tokens, cached prompt tokens) as the server reports them: usage first, llama.cpp's
        `timings` (prompt_n counts the computed ones, cache_n the cached) where usage has none."""
        usage, t = col.usage, col.timings
        prompt = usage.prompt_tokens if usage is not None else None
        cached = usage.cached_tokens if usage is not None else None
        if t is not None:
            if cached is None:
                cached = t.cache_n
            if prompt is None and t.prompt_n is not None:
                prompt = t.prompt_n + (t.cache_n or 0)
        return prompt, cached

    @classmethod
    def server_total(cls, col: StreamCollector) -> tuple[int | None, Literal["usage", "engine"]]:
        """The server's completion-token total and where it came from."""
        if col.usage is not None and col.usage.completion_tokens is not None:
            return col.usage.completion_tokens, "usage"
        if col.timings is not None and col.timings.predicted_n is not None:
            return col.timings.predicted_n, "engine"
        return None, "usage"

    @classmethod
    def server_cold(cls, col: StreamCollector) -> bool | None:
        """The server says it loaded the model for this request (None: it does not say)."""
        return None

    async def run_once(self, ctx: ProbeContext, *, timed: bool) -> RunResult:
        """Send one request and classify it; never raises."""
        result = RunResult(
            endpoint=ctx.endpoint.name,
            started_at=time.time(),
            status=Status.OK,
            workload=ctx.workload.name,
            site=ctx.site,
        )
        try:
            plan = await plan_run(ctx, timed=timed, run_id=result.run_id)
            result.streamed = plan.stream
            result.prompt_target_tokens, result.prompt_seed = plan.target_tokens, plan.seed
            result.prompt_words = plan.fresh.words if plan.fresh is not None else None
            result = await self._run(ctx, plan, result, timed)
        except Exception as exc:  # the contract is "never raises": anything unforeseen is a provider error
            return status_mod.apply(result, status_mod.classify_exception(exc), ctx.log.redact)
        if ctx.prompts is not None and plan.fresh is not None:
            ctx.prompts.observe(plan.fresh, result.prompt_tokens)
        return result

    async def _run(self, ctx: ProbeContext, plan: RequestPlan, result: RunResult, timed: bool) -> RunResult:
        url, body = self.request(ctx, plan)
        body = merge_body(body, ctx.endpoint.extra_body)  # the endpoint's own extra_body wins
        # Kinds that serve /metrics use it by default; any kind does when `metrics_url` is configured.
        wants_counters = self.uses_counters or ctx.endpoint.metrics_url is not None
        counters = ctx.counters if (timed and wants_counters) else None
        before = await _snapshot(ctx, counters)
        fresh = plan.fresh
        size = "" if fresh is None else f" prompt ~{plan.target_tokens} tokens ({fresh.words} words)"
        ctx.log(
            f"POST {url} workload={ctx.workload.name}{size} stream={plan.stream} max_tokens={plan.max_tokens}"
        )
        request = Request(
            url,
            body,
            traced_headers(
                self.headers(ctx.api_key) if ctx.headers is None else ctx.headers,
                ctx.trace if timed else None,
            ),
            ctx.timeout,
            stream=plan.stream,
            max_bytes=ctx.settings.max_response_bytes,
            reach=ctx.reach,
        )
        ex = await run_exchange(ctx.http, type(self), request, stamps=ctx.stamps, stalls=ctx.stalls)
        if ex.http_status is not None:
            result.send_delay_s = ex.send_delay_s
            _network_phases(result, ex, ctx.round_started)
            result.http_status = ex.http_status
        result.streamed = ex.streamed
        if ex.failure is not None:
            outcome = ex.failure
            if outcome.error_class == status_mod.CONTEXT_EXCEEDED:
                outcome = status_mod.context_exceeded(
                    outcome, ctx.workload.name, plan.target_tokens, plan.max_tokens
                )
            if ex.raised:
                ctx.log(f"request failed: {outcome.error_class}")
                if ex.collector.deltas and result.streamed:
                    result.ttft_s = ex.collector.deltas[0].t - ex.sent_at
            return status_mod.apply(result, outcome, ctx.log.redact)
        if result.streamed:
            result.merged_reads = ex.merged_reads
        if ex.max_stall_s is not None:
            result.max_stall_s = ex.max_stall_s
        after = await _snapshot(ctx, counters)
        measurement = _measure(ctx, counters, before, after)
        self._fill(ctx, plan, result, ex, measurement)
        return result

    def _fill(
        self,
        ctx: ProbeContext,
        plan: RequestPlan,
        result: RunResult,
        ex: Exchange,
        measurement: CounterMeasurement | None,
    ) -> None:
        """The exchange's counts and figures on the run, then tok/s candidates, source choice and the
        ok/degraded verdict."""
        n = ex.completion_tokens
        result.tokens_source = ex.tokens_source
        result.output_tokens, result.think_tokens = ex.output_tokens, ex.think_tokens
        result.prompt_tokens, result.cached_tokens = ex.prompt_tokens, ex.cached_tokens
        result.finish_reason = ex.finish_reason
        result.response_model = ex.collector.model
        result.e2e_s = ex.e2e_s
        if ex.cold is not None:
            result.cold = ex.cold
        bounds = ex.bounds
        candidates = dict(ex.server_tps)
        if measurement is not None and measurement.tokens_per_second is not None:
            candidates[TimingSource.VLLM_METRICS] = measurement.tokens_per_second
        if result.streamed and ex.events:
            result.ttft_s, result.ttot_s, result.tpot_s = ex.ttft_s, ex.ttot_s, ex.tpot_s
            result.itl_s, result.output_itl_s = ex.itl_s, ex.output_itl_s
            if ex.client_stream_tps is not None:
                candidates[TimingSource.CLIENT_STREAM] = ex.client_stream_tps
        # A buffered answer (the decoded tokens in one read) gives no decode-speed sample: its client figure
        # is treated as one whose error is unbounded (a server figure replaces it; else it stays, set aside).
        one_read = bool(result.streamed and ex.events and decoded_in_one_read(ex.events))
        if ex.client_wall_tps is not None:
            candidates[TimingSource.CLIENT_WALL] = ex.client_wall_tps
        result.candidates = candidates
        tolerance = ctx.settings.tolerance
        tps_bounds = bounds.tps() if bounds is not None else {}
        select_bounds = dict(tps_bounds)
        if one_read and TimingSource.CLIENT_STREAM in candidates:
            select_bounds[TimingSource.CLIENT_STREAM] = math.inf
        chosen, set_aside = select_within_tolerance(
            candidates,
            ctx.settings.timing_preference,
            select_bounds,
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
            single = one_read and chosen.source is TimingSource.CLIENT_STREAM
            result.set_aside["tokens_per_second"] = ONE_READ if single else CLIENT_STALL
            if single:
                ctx.log("client_stream tok/s set aside (one_read): every token after the first in one read")
        result.source, result.tokens_per_second = chosen.source, chosen.tokens_per_second
        if chosen.source is not None and bounds is not None:
            result.tps_error_ratio = tps_bounds.get(chosen.source, 0.0)
        if bounds is not None:
            judge_latencies(result, bounds, tolerance)
        result.timing_disturbed = CLIENT_STALL in result.set_aside.values()
        if result.timing_disturbed:
            stall_ms = (result.max_stall_s or 0.0) * 1e3
            ctx.log(
                f"set aside ({', '.join(f for f, why in result.set_aside.items() if why == CLIENT_STALL)}): "
                "the exporter's own lateness bounds their error "
                f"above the tolerance (the measurement loop stalled up to {stall_ms:.1f} ms)"
            )
        result.server_shared = chosen.server_shared
        for source, why in chosen.skipped.items():
            ctx.log(f"timing source {source} skipped: {why}")
        _prefill(result, ex.server_prefill_tps)
        _judge_prompt(ctx, plan, result)
        verdict = answer_verdict(
            ex,
            max_tokens=plan.max_tokens,
            configured_model=ctx.endpoint.model,
            model_aliases=ctx.endpoint.model_aliases,
        ) or status_mod.judge_run(
            result,
            completion_tokens=n,
            max_tokens=plan.max_tokens,
            short_output=ctx.settings.short_output,
            max_plausible_tps=ctx.settings.max_plausible_tokens_per_second,
        )
        if verdict is not None:
            status_mod.apply(result, verdict, ctx.log.redact)


def _prefill(result: RunResult, engine: float | None) -> None:
    """Prefill tok/s candidates and the chosen one: the engine's own figure first, else prompt tokens
    computed over TTFT less the network round trip where measured (docs/methodology.md, "Prefill speed")."""
    candidates: dict[PrefillSource, float] = {}
    if engine is not None:
        candidates[PrefillSource.ENGINE] = engine
    if result.streamed:
        client = client_prefill_tps(
            result.prompt_tokens, result.cached_tokens, result.ttft_s, result.network_rtt_s
        )
        if client is not None:
            candidates[PrefillSource.CLIENT_TTFT] = client
    result.prefill_candidates = candidates
    for source in PrefillSource:
        if source in candidates:
            result.prefill_source, result.prefill_tokens_per_second = source, candidates[source]
            break
    if result.prefill_source is PrefillSource.CLIENT_TTFT and "ttft" in result.set_aside:
        # Prompt tokens over a TTFT a client stall could have moved beyond its tolerance: as far off.
        result.set_aside["prefill"] = result.set_aside["ttft"]


def _judge_prompt(ctx: ProbeContext, plan: RequestPlan, result: RunResult) -> None:
    """Flag a sized prompt the server counted off its size, and a run the prefix cache helped beyond the
    chat template's preamble (docs/methodology.md, "Workloads and fresh prompts")."""
    allowance = ctx.settings.cache_preamble_tokens
    if result.cached_tokens is not None and result.cached_tokens > allowance:
        result.cache_assisted = True
        ctx.log(
            f"cache-assisted: {result.cached_tokens} prompt tokens cached, more than the {allowance} "
            "a chat template's preamble accounts for"
        )
    target, counted = plan.target_tokens, result.prompt_tokens
    if target is None or counted is None:
        return
    if abs(counted - target) > ctx.settings.prompt_tolerance * target:
        result.prompt_size_missed = True
        ctx.log(
            f"prompt size missed: the server counted {counted} prompt tokens for the {target} of workload "
            f"{ctx.workload.name} (tolerance {ctx.settings.prompt_tolerance:.0%})"
        )


def _network_phases(result: RunResult, ex: Exchange, round_started: float) -> None:
    """The run's network phases: its connection's set-up when this round opened that connection (a
    connection kept from an earlier round was set up for that round), and time to the first response byte."""
    result.connection_reused = ex.reused
    result.phase_processing_s = ex.processing_s
    setup = ex.connection
    if setup is None:
        return
    result.proxied = setup.proxied
    result.peer_chain = setup.peer_chain  # parsed after the run (tokwatch.probes.base.run_probe)
    if setup.ready_at >= round_started:
        result.phase_resolve_s = setup.resolve_s
        result.phase_connect_s = setup.connect_s
        result.phase_tls_s = setup.tls_s
        result.network_rtt_s = setup.rtt_s
        if setup.proxied:
            result.phase_proxy_connect_s = setup.proxy_connect_s


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
