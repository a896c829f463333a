"""Sends one benchmark request over the shared HTTP layer and turns the stream into a RequestRecord.

URL, body and stream parser are the kind's own (`tokwatch.probes`), parsing is `tokwatch.streams`, token
counting and latency math are `tokwatch.figures.timing`, failure statuses are `tokwatch.probes.status`: the
benchmark
measures exactly what the probe measures.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokwatch.bench.fluidity import FluidityMode, fluidity_index
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.workload import Message
from tokwatch.figures import timing
from tokwatch.figures.result import Status
from tokwatch.probes import probe_class
from tokwatch.probes import status as status_mod
from tokwatch.probes.http import ChatRequest, HttpProbe
from tokwatch.settings.access import with_query
from tokwatch.settings.config import server_key
from tokwatch.settings.redact import Redactor
from tokwatch.streams.collector import StreamCollector
from tokwatch.tracing.context import RequestTrace, traced_headers
from tokwatch.transport.http import ConnectionSetup, HttpClient
from tokwatch.transport.http_route import RouteSource
from tokwatch.transport.measurement import StampLateness
from tokwatch.transport.request_options import merge_body


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how requests go. `api_key` never leaves this object except in the auth header."""

    kind: str
    base_url: str
    model: str
    api_key: str | None
    timeout_s: float
    metrics_url: str | None = None
    # Merged into every body last (the endpoint's `extra_body`, then --extra-body): its keys win.
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # The endpoint's request headers, credential included (tokwatch.probes.keys); None: `api_key` the
    # kind's way.
    request_headers: Mapping[str, str] | None = None
    path: str | None = None  # the endpoint's `path` instead of the kind's route
    query: Mapping[str, str] = field(default_factory=dict)  # added to the request URL
    secrets: tuple[str, ...] = ()  # besides api_key, what to mask in every output (header values, password)
    # The endpoint's proxy and TLS settings (tokwatch.settings.reach), for its requests and its /metrics
    # scrapes.
    reach: RouteSource | None = field(default=None, compare=False, repr=False)

    @property
    def dialect(self) -> type[HttpProbe]:
        """The kind's own answers (URL, body, stream parser), from the registry of kinds."""
        return probe_class(self.kind)

    @property
    def url(self) -> str:
        """The generation URL: the kind's route (or `path`) under base_url, with the `query` parameters."""
        url = f"{self.base_url}{self.path}" if self.path else self.dialect.url(self.base_url)
        return with_query(url, self.query)

    def headers(self) -> dict[str, str]:
        """Request headers: the endpoint's (credential included), else the key the kind's default way."""
        if self.request_headers is not None:
            return dict(self.request_headers)
        return self.dialect.headers(self.api_key)

    def metrics_request(self, metrics_url: str) -> tuple[str, dict[str, str] | None]:
        """The /metrics URL and headers to scrape it with: the endpoint's headers and query when it is on the
        endpoint's own server (a gateway in front asks for them on every route), none elsewhere."""
        if server_key(metrics_url) != server_key(self.base_url):
            return metrics_url, None
        return with_query(metrics_url, self.query), self.headers()

    @property
    def redactor(self) -> Redactor:
        """Masks every secret of the target (key, header values, password) and credential-shaped text."""
        proxy = self.reach.secrets if self.reach is not None else ()
        return Redactor([self.api_key, *self.secrets, *proxy])

    def body(
        self,
        messages: Sequence[Message],
        max_tokens: int,
        fixed_output: bool,
        *,
        think: bool = False,
        think_budget: int | None = None,
    ) -> dict[str, Any]:
        """The JSON body for one streamed request, `extra_body` merged in (nested objects key by key).

        The fixed-output fields go only to kinds whose server honours them (`fixed_length`); `think` asks
        the model to think, within `think_budget` in the kind's own field (`HttpProbe.with_thinking`).
        """
        dialect = self.dialect
        request = ChatRequest(
            self.model,
            messages,
            max_tokens,
            stream=True,
            temperature=0,
            fixed_output=fixed_output and dialect.fixed_length,
        )
        body = dialect.body(request)
        if think:
            body = dialect.with_thinking(body, think_budget)
        return merge_body(body, dict(self.extra_body)) if self.extra_body else body


@dataclass(frozen=True, slots=True)
class Deadlines:
    """fluidity-index deadlines in seconds, and how a late token is counted (tokwatch.bench.fluidity)."""

    prefill_s: float
    decode_s: float
    mode: FluidityMode = "etalon"


def _runaway_limit(max_tokens: int) -> int:
    """Client-counted tokens after which a stream is cut: the server is ignoring max_tokens."""
    return max_tokens * 2 + 16


async def execute(
    http: HttpClient,
    target: Target,
    messages: Sequence[Message],
    record: RequestRecord,
    *,
    run_t0: float,
    deadlines: Deadlines,
    redactor: Redactor,
    stalls: StampLateness | None = None,
    on_answer: Callable[[float], None] | None = None,
    trace: RequestTrace | None = None,
) -> RequestRecord:
    """Send the request, stream the answer, fill `record`; never raises except on cancellation.

    `on_answer(t)` is told when the server's bytes arrived (the headers, then the newest read of each batch
    of the body) after they were stamped; `trace` adds its `traceparent` header (its span is built later)."""
    max_tokens = record.max_tokens or 1
    body = target.body(messages, max_tokens, record.fixed_output, **thinking(record))
    collector = StreamCollector()
    parser = target.dialect.parser()
    sent_at = time.perf_counter()
    record.started_at_s = record.sent_at_s = sent_at - run_t0
    end: float | None = None
    runaway = False
    try:
        async with http.stream(
            "POST",
            target.url,
            json_body=body,
            headers=traced_headers(target.headers(), trace),
            timeout=target.timeout_s,
            reach=target.reach,
        ) as resp:
            sent_at = resp.sent_at
            watched = resp.watched
            record.sent_at_s = sent_at - run_t0
            record.connect_time_s = _connect_time(resp.connection, resp.reused)
            record.http_status = resp.status
            if on_answer is not None:
                on_answer(time.perf_counter())
            headers = resp.headers
            record.server_request_id = headers.get("x-sim-request-id") or headers.get("x-request-id")
            if not 200 <= resp.status < 300:
                text = await resp.text()
                failure = status_mod.classify_http_status(resp.status, text, headers.get("Location"))
                if failure is not None:
                    return _fail(record, failure, redactor, run_t0)
            limit = _runaway_limit(max_tokens)
            async for batch in resp.batches():
                if on_answer is not None:
                    on_answer(batch[-1][0])
                for t, data in batch:
                    collector.add(parser.feed(data, t))
                    runaway = collector.client_tokens > limit
                    if runaway:
                        break
                if runaway:
                    break
            # The end is when the last bytes arrived, not when this code got to run again.
            end = resp.last_byte_at or time.perf_counter()
            if not runaway:
                collector.add(parser.close(end))
            unreadable = status_mod.unreadable_answer(
                headers.get("Content-Type", ""), collector.events, resp.bytes_received, resp.status
            )
            if unreadable is not None:
                return _fail(record, unreadable, redactor, run_t0)
    except Exception as exc:  # every failure is a status; only cancellation propagates
        return _fail(record, status_mod.classify_exception(exc), redactor, run_t0)
    assert end is not None
    record.completed_at_s = end - run_t0
    record.merged_reads = collector.merged_reads
    if stalls is not None:
        record.max_stall_s = stalls.loop.max_stall(sent_at, end)
        # What a stall could have done to the stamps the request's figures use: every token's and the last
        # byte's (a stall between them moves none; with the receive watcher, only its own lateness counts).
        stamps = [*(d.t for d in collector.deltas), end]
        record.stamp_lateness_s = max(stalls.lateness(stamps, watched=watched))
    _fill_figures(record, collector, sent_at, end, deadlines)
    if runaway or (record.generated_tokens > max_tokens and record.tokens_source != "client_estimate"):
        record.status = Status.DEGRADED
        record.error_class = "max_tokens_ignored"
        record.error_message = f"server sent {record.generated_tokens} tokens for max_tokens {max_tokens}" + (
            " (stream cut by the client)" if runaway else ""
        )
    elif not record.generated_tokens:
        record.status = Status.DEGRADED
        record.error_class = "no_tokens"
        record.error_message = "the answer carried no generated token"
    return record


def _connect_time(setup: ConnectionSetup | None, reused: bool) -> float | None:
    """Set-up time of the connection a request opened (seed 002's connect time); None over a reused one."""
    if reused or setup is None:
        return None
    return setup.resolve_s + setup.connect_s + setup.tls_s + setup.proxy_connect_s


def thinking(record: RequestRecord) -> dict[str, Any]:
    """`Target.body`'s thinking arguments for a request: reasoning requests ask to think, within their
    budget where the kind has a budget field."""
    if record.category != "reasoning":
        return {}
    return {"think": True, "think_budget": record.think_budget if record.think_budget_field else None}


def _fail(
    record: RequestRecord, failure: status_mod.Classification, redactor: Redactor, run_t0: float
) -> RequestRecord:
    status_mod.apply(record, failure, redactor)
    record.completed_at_s = time.perf_counter() - run_t0
    return record


def _fill_figures(
    record: RequestRecord, c: StreamCollector, sent_at: float, end: float, deadlines: Deadlines
) -> None:
    """Token counts (server first, client estimate last) and every latency figure of a finished stream."""
    total: int | None = None
    total_source: Any = "usage"
    if c.usage is not None and c.usage.completion_tokens is not None:
        total = c.usage.completion_tokens
    elif c.ollama is not None and c.ollama.eval_count is not None:
        total, total_source = c.ollama.eval_count, "engine"
    elif c.timings is not None and c.timings.predicted_n is not None:
        total, total_source = c.timings.predicted_n, "engine"
    events, source = timing.token_events(c.deltas, sent_at, total, total_source)
    record.tokens_source = source
    record.chunks = len(events)
    record.finish_reason = c.finish_reason
    record.response_model = c.model
    think = streamed_think = timing.total_tokens(events, "think")
    output = timing.total_tokens(events, "output")
    n = think + output  # every event is one phase or the other
    if c.usage is not None and c.usage.reasoning_tokens is not None and total is not None:
        think, output = c.usage.reasoning_tokens, max(0, total - c.usage.reasoning_tokens)
    record.think_tokens, record.output_tokens = think, output
    prompt = None
    if c.usage is not None:
        prompt = c.usage.prompt_tokens
        record.cached_tokens = c.usage.cached_tokens
    elif c.ollama is not None:
        prompt = c.ollama.prompt_eval_count  # Ollama reports no cached count
    elif c.timings is not None and c.timings.prompt_n is not None:
        prompt = c.timings.prompt_n + (c.timings.cache_n or 0)  # prompt_n leaves the cached tokens out
    if record.cached_tokens is None and c.timings is not None:
        record.cached_tokens = c.timings.cache_n  # llama-server without usage.prompt_tokens_details
    record.prompt_tokens = prompt
    record.reply_text = c.text
    record.e2e_s = end - sent_at
    record.ttft_s = timing.ttft(events)
    record.ttot_s = timing.ttot(events)
    record.tbt_s = timing.itl(events)
    record.inter_chunk_s = [b.t - a.t for a, b in itertools.pairwise(events)]
    # Without think tokens the output-phase gaps are the gaps of the whole stream.
    record.output_itl_s = timing.output_itl(events) if streamed_think else list(record.tbt_s)
    record.think_s, record.answer_s = timing.phase_time(events, "think"), timing.phase_time(events, "output")
    record.tpot_s = timing.tpot(record.e2e_s, record.ttft_s, n)
    record.decode_tokens_per_s = timing.client_stream_tps(events, n)
    if record.ttft_s is not None:
        record.fluidity_index = fluidity_index(
            record.ttft_s, record.tbt_s, deadlines.prefill_s, deadlines.decode_s, deadlines.mode
        )

