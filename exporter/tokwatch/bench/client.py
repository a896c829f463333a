"""Sends one benchmark request and turns the exchange into a RequestRecord.

URL, body and headers are the kind's own (`tokwatch.probes`); sending, parsing, the server's counts, the
figures and the answer's verdict are the exchange the probe makes too (`tokwatch.probes.exchange`): the
benchmark measures exactly what the probe measures, and names no kind's wire field.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokwatch.bench.fluidity import FluidityMode, fluidity_index
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.run_bounds import CLIENT_TOLERANCE
from tokwatch.bench.workload import Message
from tokwatch.figures import timing
from tokwatch.probes import probe_class
from tokwatch.probes import status as status_mod
from tokwatch.probes.exchange import (
    Exchange,
    Request,
    answer_verdict,
    inter_chunk_gaps,
    latencies_beyond_tolerance,
    run_exchange,
)
from tokwatch.probes.http import ChatRequest, HttpProbe
from tokwatch.settings.access import with_query
from tokwatch.settings.config import server_key
from tokwatch.settings.redact import Redactor
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
    model_aliases: tuple[str, ...] = ()  # other names the answer may give the model (the endpoint's)

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

    The request itself is the exchange the probe makes too (`tokwatch.probes.exchange`): this adds the
    schedule's times, the runaway cut and fluidity. `on_answer(t)` is told when the server's bytes arrived
    (the headers, then the newest read of each batch of the body) after they were stamped; `trace` adds its
    `traceparent` header (its span is built later)."""
    max_tokens = record.max_tokens or 1
    request = Request(
        target.url,
        target.body(messages, max_tokens, record.fixed_output, **thinking(record)),
        traced_headers(target.headers(), trace),
        target.timeout_s,
        reach=target.reach,
    )
    record.started_at_s = record.sent_at_s = time.perf_counter() - run_t0
    ex = await run_exchange(
        http,
        target.dialect,
        request,
        stamps=stalls,
        stalls=stalls.loop if stalls is not None else None,
        token_limit=_runaway_limit(max_tokens),
        on_answer=on_answer,
    )
    record.sent_at_s = ex.sent_at - run_t0
    record.connect_time_s = _connect_time(ex.connection, bool(ex.reused))
    record.http_status = ex.http_status
    record.server_request_id = ex.headers.get("x-sim-request-id") or ex.headers.get("x-request-id")
    if ex.failure is not None:
        status_mod.apply(record, ex.failure, redactor)
        record.completed_at_s = (ex.failed_at or time.perf_counter()) - run_t0
        return record
    assert ex.end is not None
    record.completed_at_s = ex.end - run_t0
    record.merged_reads = ex.merged_reads
    record.max_stall_s = ex.max_stall_s
    record.stamp_lateness_s = ex.stamp_lateness_s
    _fill_figures(record, ex, deadlines)
    record.beyond_tolerance = latencies_beyond_tolerance(ex, CLIENT_TOLERANCE)
    if ex.bounds is not None:
        b = ex.bounds
        record.ttft_error_s, record.tpot_error_s = b.ttft_s, b.tpot_s
        record.ttot_error_s, record.e2e_error_s = b.ttot_s, b.e2e_s
        record.tbt_down_s, record.tbt_up_s = b.gap_down_s, b.gap_up_s
    verdict = answer_verdict(
        ex, max_tokens=max_tokens, configured_model=target.model, model_aliases=target.model_aliases
    )
    if verdict is not None:
        status_mod.apply(record, verdict, redactor)
    return record


def _connect_time(setup: ConnectionSetup | None, reused: bool) -> float | None:
    """Set-up time of the connection a request opened (seed 002's connect time); None over a reused one."""
    if reused or setup is None:
        return None
    return setup.set_up_s


def thinking(record: RequestRecord) -> dict[str, Any]:
    """`Target.body`'s thinking arguments for a request: reasoning requests ask to think, within their
    budget where the kind has a budget field."""
    if record.category != "reasoning":
        return {}
    return {"think": True, "think_budget": record.think_budget if record.think_budget_field else None}


def _fill_figures(record: RequestRecord, ex: Exchange, deadlines: Deadlines) -> None:
    """The exchange's counts and figures on the record, and its fluidity index."""
    record.tokens_source = ex.tokens_source
    record.chunks = len(ex.events)
    record.finish_reason = ex.finish_reason
    record.response_model = ex.collector.model
    record.think_tokens, record.output_tokens = ex.think_tokens, ex.output_tokens
    record.prompt_tokens, record.cached_tokens = ex.prompt_tokens, ex.cached_tokens
    record.reply_text = ex.text
    record.e2e_s = ex.e2e_s
    record.ttft_s = ex.ttft_s
    record.ttot_s = ex.ttot_s
    record.tbt_s = ex.itl_s
    record.inter_chunk_s = inter_chunk_gaps(ex.events)
    record.output_itl_s = ex.output_itl_s
    record.think_s = timing.phase_time(ex.events, "think")
    record.answer_s = timing.phase_time(ex.events, "output")
    record.tpot_s = ex.tpot_s
    record.decode_tokens_per_s = ex.client_stream_tps
    if record.ttft_s is not None:
        record.fluidity_index = fluidity_index(
            record.ttft_s, record.tbt_s, deadlines.prefill_s, deadlines.decode_s, deadlines.mode
        )
