"""One request end to end, as the probe and the bench both make it: send, stamp, parse, read the server's
own counts through the kind's readers, work out the timing figures and their error bounds, judge the answer.

The probe (`tokwatch.probes.http`) and the bench client (`tokwatch.bench.client`) are two faces of this one
exchange: the probe adds its counter window, timing-source choice and run verdict; the bench its schedule,
runaway cut, fluidity and aggregation. Neither reads a kind's wire fields itself, so the two cannot count a
server's answer differently (docs/architecture.md, "One exchange").
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tokwatch.figures.result import TimingSource, TokenEvent
from tokwatch.figures.timing import (
    TokensSource,
    client_stream_tps,
    client_wall_tps,
    itl,
    output_itl,
    token_events,
    total_tokens,
    tpot,
    ttft,
    ttot,
)
from tokwatch.probes import status as status_mod
from tokwatch.probes.error_bounds import FigureBounds, beyond_tolerance, figure_bounds, latency_checks
from tokwatch.settings.config import Tolerance
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.events import StreamEvent, StreamParser, TextDelta
from tokwatch.streams.framing import decode_utf8
from tokwatch.streams.payload import loads_json
from tokwatch.transport.http import DEFAULT_MAX_BYTES, ConnectionSetup, HttpClient
from tokwatch.transport.http_route import RouteSource
from tokwatch.transport.measurement import StallMonitor, StampLateness


class Dialect(Protocol):
    """What the exchange asks of a kind: its parsers and the readers of the server's own counts (class-level
    answers of the kind's probe class, `tokwatch.probes.probe_class(kind)`)."""

    @property
    def event_separator(self) -> bytes: ...
    def parser(self) -> StreamParser: ...
    def parse_whole(self, obj: Any, t: float) -> list[StreamEvent]: ...
    def server_total(self, col: StreamCollector) -> tuple[int | None, Literal["usage", "engine"]]: ...
    def server_prompt(self, col: StreamCollector) -> tuple[int | None, int | None]: ...
    def server_prefill(self, col: StreamCollector) -> float | None: ...
    def server_candidates(self, col: StreamCollector) -> dict[TimingSource, float]: ...
    def server_cold(self, col: StreamCollector) -> bool | None: ...


@dataclass(frozen=True, slots=True)
class Request:
    """Where one request goes and what it carries (the kind's URL, body and headers, already resolved)."""

    url: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]
    timeout_s: float
    stream: bool = True
    max_bytes: int = DEFAULT_MAX_BYTES
    reach: RouteSource | None = None


@dataclass(slots=True)
class Exchange:
    """One request's record: what happened on the wire, the parsed stream, the server's counts and the
    figures. `failure` is set when the request failed before an answer could be read (transport, HTTP
    status, an unreadable body); the answer's verdict is `answer_verdict`."""

    sent_at: float  # perf_counter when the request's last byte went out (t = 0 of every latency)
    collector: StreamCollector = field(default_factory=StreamCollector)
    streamed: bool = True
    http_status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    failure: status_mod.Classification | None = None
    raised: bool = False  # the failure is an exception (transport, parser), not an HTTP status or body
    failed_at: float | None = None
    end: float | None = None  # perf_counter of the last byte
    watched: bool = False  # the receive watcher stamped the reads (its lateness bounds theirs)
    kernel_stamped: bool = False  # each read carries the kernel's receive time of its newest segment
    # Kernel stamps (seconds from `sent_at`) of reads that held exactly one whole event: its arrival, exact.
    exact_stamps: set[float] = field(default_factory=set)
    # Kernel stamps of reads that held two or more whole events -> how many text deltas the last of them
    # gave: those arrived at the stamp (its newest segment), exact; the deltas before them in the read not.
    exact_tail: dict[float, int] = field(default_factory=dict)
    # Kernel stamps of the other reads -> the kernel stamp of the read before them (the response head's, or 0:
    # the send): every byte a read holds arrived after the read before it, which took all the socket held.
    arrived_after: dict[float, float] = field(default_factory=dict)
    send_delay_s: float | None = None
    reused: bool | None = None
    processing_s: float | None = None
    connection: ConnectionSetup | None = None
    cut: bool = False  # the face stopped reading once the client counted more than its token limit
    # The server's own counts, read through the kind's readers.
    events: list[TokenEvent] = field(default_factory=list)
    tokens_source: TokensSource | None = None
    completion_tokens: int = 0  # the server's total when it gave one, else the tokens counted in the stream
    think_tokens: int = 0  # counted from the stream's phases (docs/methodology.md)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    server_tps: dict[TimingSource, float] = field(default_factory=dict)  # the server's own tok/s figures
    server_prefill_tps: float | None = None
    cold: bool | None = None
    # Figures, seconds from `sent_at`.
    e2e_s: float | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_itl_s: list[float] = field(default_factory=list)
    ttot_s: float | None = None
    tpot_s: float | None = None
    client_stream_tps: float | None = None
    client_wall_tps: float | None = None
    text_bytes: int | None = None  # worked out by `answer_verdict` only where a token count needs it
    # Disturbance: the loop's largest stall while the request streamed, the bound each figure carries
    # from the client's lateness, and the latest any stamp used can be.
    max_stall_s: float | None = None
    bounds: FigureBounds | None = None
    stamp_lateness_s: float | None = None

    @property
    def ok(self) -> bool:
        """The answer was read through to its end."""
        return self.failure is None

    @property
    def finish_reason(self) -> str | None:
        """The server's finish reason."""
        return self.collector.finish_reason

    @property
    def model(self) -> str | None:
        """The model the answer names."""
        return self.collector.model

    @property
    def text(self) -> str:
        """The generated text (reasoning tags stripped)."""
        return self.collector.text

    @property
    def merged_reads(self) -> int:
        """Socket reads that carried two or more content chunks."""
        return self.collector.merged_reads


async def run_exchange(
    http: HttpClient,
    dialect: Dialect,
    request: Request,
    *,
    stamps: StampLateness | None = None,
    stalls: StallMonitor | None = None,
    token_limit: int | None = None,
    on_answer: Callable[[float], None] | None = None,
) -> Exchange:
    """Send `request`, read and parse its answer, and fill every count and figure; never raises except on
    cancellation. `token_limit`: stop reading once the client counted more tokens (`cut`); `on_answer(t)`
    is told when the server's bytes arrived (the headers, then the newest read of each batch)."""
    ex = Exchange(sent_at=time.perf_counter(), streamed=request.stream)
    col = ex.collector
    try:
        async with http.stream(
            "POST",
            request.url,
            json_body=request.body,
            headers=request.headers,
            timeout=request.timeout_s,
            max_bytes=request.max_bytes,
            reach=request.reach,
        ) as resp:
            ex.sent_at, ex.watched, ex.kernel_stamped = resp.sent_at, resp.watched, resp.kernel_stamped
            ex.send_delay_s, ex.reused, ex.processing_s = resp.send_delay_s, resp.reused, resp.processing_s
            ex.connection = resp.connection
            ex.http_status, ex.headers = resp.status, resp.headers
            if on_answer is not None:
                on_answer(time.perf_counter())
            if status_mod.classify_http_status(resp.status) is not None:
                text = await _error_body(resp)
                return _failed(
                    ex, status_mod.classify_http_status(resp.status, text, resp.headers.get("Location"))
                )
            content_type = resp.headers.get("Content-Type", "").lower()
            is_json = "json" in content_type and "ndjson" not in content_type
            if request.stream and not is_json:
                parser = dialect.parser()
                # Only the kernel's stamps alone are exact for a whole-event read (a watcher splits reads).
                separator = dialect.event_separator if ex.kernel_stamped and not ex.watched else None
                # A read's bytes all arrived after the read before it (the head's, when it came apart from
                # the body); for a coded body a piece is not a read, so only the send is known to be before.
                coded = bool(resp.headers.get("Content-Encoding"))
                after: float | None = None
                if resp.response_at is not None and not coded:
                    after = resp.response_at - ex.sent_at
                async for batch in resp.batches():
                    if on_answer is not None:
                        on_answer(batch[-1][0])
                    for t, data in batch:
                        if separator is None:
                            col.add(parser.feed(data, t))
                        else:
                            after = _read_kernel_stamped(ex, parser, separator, t, data, after, coded)
                        if token_limit is not None and col.client_tokens > token_limit:
                            ex.cut = True
                            break
                    if ex.cut:
                        break
                # The end is when the last bytes arrived, not when this code got to run again.
                ex.end = resp.last_byte_at or time.perf_counter()
                if not ex.cut:
                    col.add(parser.close(ex.end))
            else:
                # A server that ignores `stream` (or answers an error object with 200) sends one JSON.
                raw = await resp.read()
                ex.end = resp.last_byte_at or time.perf_counter()
                ex.streamed = False
                col.add(dialect.parse_whole(loads_json(decode_utf8(raw)), ex.end))
            unreadable = status_mod.unreadable_answer(
                content_type, col.events, resp.bytes_received, resp.status
            )
            if unreadable is not None:  # e.g. a proxy's HTML page with 200: unreadable, not slow
                return _failed(ex, unreadable)
    except Exception as exc:  # every failure is a status; only cancellation propagates
        ex.raised = True
        return _failed(ex, status_mod.classify_exception(exc))
    assert ex.end is not None
    if stalls is not None:
        ex.max_stall_s = stalls.max_stall(ex.sent_at, ex.end)
    fill_figures(ex, dialect, ex.end, stamps)
    return ex


# A piece at most this long came from a read that took all the socket held: the transport reads 64 KiB, and
# HTTP chunk framing adds at most 5 bytes to each byte of payload.
WHOLE_READ_BYTES = 8 * 1024


def _read_kernel_stamped(
    ex: Exchange,
    parser: StreamParser,
    separator: bytes,
    t: float,
    data: bytes,
    after: float | None,
    coded: bool = False,
) -> float | None:
    """Parse one kernel-stamped read into the collector and note what its stamp says of its events'
    arrivals (`exact_stamps`, `exact_tail`, `arrived_after`); `after`: the kernel stamp of the read before,
    if it took all the socket held; `coded`: the body is compressed (a piece is no read). Returns the next
    read's `after`."""
    rel = t - ex.sent_at  # as the token events' times
    # Two reads with one stamp (the transport keeps stamps ascending) cannot be told apart: then the send.
    floor = after if after is not None and after < rel else 0.0
    ended = data.count(separator) if data.endswith(separator) else 0
    if ended == 1:
        ex.collector.add(parser.feed(data, t))
        ex.exact_stamps.add(rel)
    elif ended > 1:
        # The last event apart, to know which deltas it gave: they arrived in the read's newest segment.
        cut = data.rindex(separator, 0, len(data) - len(separator)) + len(separator)
        events = parser.feed(data[:cut], t)
        last = parser.feed(data[cut:], t)
        ex.collector.add([*events, *last])
        deltas = sum(1 for ev in last if isinstance(ev, TextDelta))
        if deltas:
            ex.exact_tail[rel] = deltas
        ex.arrived_after[rel] = floor
    else:
        ex.collector.add(parser.feed(data, t))
        ex.arrived_after[rel] = floor
    return None if coded or len(data) > WHOLE_READ_BYTES else rel


def _failed(ex: Exchange, failure: status_mod.Classification | None) -> Exchange:
    assert failure is not None
    ex.failure, ex.failed_at = failure, time.perf_counter()
    return ex


async def _error_body(resp: Any) -> str:
    """A bounded excerpt of an error answer's body; an unreadable body does not change the status."""
    try:
        return str(await resp.text())[:1000]
    except Exception:
        return ""


def fill_figures(ex: Exchange, dialect: Dialect, end: float, stamps: StampLateness | None = None) -> None:
    """Counts through the kind's readers, then every figure of a finished answer and its error bounds."""
    col, sent_at = ex.collector, ex.sent_at
    total, total_source = dialect.server_total(col)
    events, ex.tokens_source = token_events(col.deltas, sent_at, total, total_source)
    if ex.tokens_source is None and total is not None:
        ex.tokens_source = total_source
    ex.events = events
    n = ex.completion_tokens = total if total is not None else total_tokens(events)
    ex.think_tokens = total_tokens(events, "think") if events else 0
    ex.output_tokens = total_tokens(events, "output") if events else (n if total is not None else 0)
    ex.prompt_tokens, ex.cached_tokens = dialect.server_prompt(col)
    ex.server_tps = dialect.server_candidates(col)
    ex.server_prefill_tps = dialect.server_prefill(col)
    ex.cold = dialect.server_cold(col)
    ex.e2e_s = end - sent_at
    if ex.streamed and events:
        ex.ttft_s = ttft(events)
        ex.itl_s = itl(events)
        # Without think tokens the output-phase gaps are the gaps of the whole stream.
        ex.output_itl_s = output_itl(events) if ex.think_tokens else list(ex.itl_s)
        ex.ttot_s = ttot(events)
        ex.tpot_s = tpot(ex.e2e_s, ex.ttft_s, n)
        ex.client_stream_tps = client_stream_tps(events, n)
    ex.client_wall_tps = client_wall_tps(n, ex.e2e_s)
    if stamps is not None:
        late = stamps.lateness([*(sent_at + e.t for e in events), end], watched=ex.watched)
        # Nothing of the answer arrived before the request went out: no stamp is later than its own time.
        late = [min(lat, max(e.t, 0.0)) for e, lat in zip(events, late, strict=False)] + [
            min(late[-1], max(ex.e2e_s, 0.0))
        ]
        if ex.kernel_stamped and not ex.watched:
            # The kernel stamps a read with its newest segment's arrival: exact for the last byte, and for
            # the deltas of the last event a read held; the others arrived after the read before
            # (docs/methodology.md, "Disturbance").
            late = _kernel_lateness(ex, events, late[:-1])
            late.append(0.0)
        ex.bounds = figure_bounds(events, ex.e2e_s, n, late[:-1], late[-1])
        ex.stamp_lateness_s = max(late)


def _kernel_lateness(ex: Exchange, events: Sequence[TokenEvent], late: Sequence[float]) -> list[float]:
    """Each event's lateness with kernel stamps: 0 where its read's stamp is its arrival (`exact_stamps`,
    the last `exact_tail` deltas of a read when every delta of that read is an event). An event a later
    token followed in its read arrived after the read before (`arrived_after`) and that is its bound: the
    loop came late for it, by what its heartbeat may not have seen (it sees no lateness under one period
    plus its floor). Any other event keeps the loop's bound `late[i]`, capped by that time."""
    exact, after = ex.exact_stamps, ex.arrived_after
    out = list(late)
    for i, e in enumerate(events):
        if e.t in exact:
            out[i] = 0.0
        elif e.t in after:
            since = e.t - after[e.t]
            merged = i + 1 < len(events) and events[i + 1].t == e.t
            out[i] = since if merged else min(late[i], since)
    if ex.exact_tail:
        sent_at = ex.sent_at
        deltas: dict[float, int] = {}
        for d in ex.collector.deltas:
            rel = d.t - sent_at
            if rel in ex.exact_tail:
                deltas[rel] = deltas.get(rel, 0) + 1
        in_read: dict[float, list[int]] = {}
        for i, e in enumerate(events):
            if e.t in ex.exact_tail:
                in_read.setdefault(e.t, []).append(i)
        for rel, indices in in_read.items():
            # Deltas that gave no token are no events: then which events are the last deltas is not known.
            if len(indices) == deltas.get(rel):
                for i in indices[-ex.exact_tail[rel] :]:
                    out[i] = 0.0
    return out


def _text_bytes(col: StreamCollector) -> int:
    """UTF-8 bytes of the generated text, `<think>` tags included (stripped from `text`, not from `chars`)."""
    return sum(len(d.text.encode()) + max(0, d.chars - len(d.text)) for d in col.deltas)


def latencies_beyond_tolerance(ex: Exchange, tolerance: Tolerance) -> list[str]:
    """The latency figures of the exchange whose error bound from the client's own lateness exceeds their
    tolerance, judged as the probe judges a run's (`error_bounds.judge_latencies`); [] without bounds."""
    if ex.bounds is None or not ex.stamp_lateness_s:  # no stamp late: every bound is 0
        return []
    checks = latency_checks(
        ex.bounds, ttft_s=ex.ttft_s, itl_s=ex.itl_s, tpot_s=ex.tpot_s, ttot_s=ex.ttot_s, e2e_s=ex.e2e_s
    )
    return beyond_tolerance(checks, tolerance)


def inter_chunk_gaps(events: Sequence[TokenEvent]) -> list[float]:
    """Seconds between consecutive chunks that carried tokens."""
    return [b.t - a.t for a, b in itertools.pairwise(events)]


def answer_verdict(
    ex: Exchange, *, max_tokens: int, configured_model: str | None, model_aliases: Sequence[str] = ()
) -> status_mod.Classification | None:
    """The verdict on an answer read to its end, the same for the probe and the bench (docs/methodology.md,
    "Answer validation"); None when the answer is sound. The probe adds its run verdict after it."""
    n = ex.completion_tokens
    deltas = ex.collector.deltas
    # UTF-8 bytes are at least the characters: the bytes are counted only for a count above those.
    if ex.text_bytes is None and deltas and n > sum(d.chars for d in deltas):
        ex.text_bytes = _text_bytes(ex.collector)
    implausible = status_mod.implausible_tokens(n, ex.text_bytes)
    if implausible is not None:
        return implausible
    mismatch = status_mod.model_mismatch(ex.model, configured_model, model_aliases)
    if mismatch is not None:
        return mismatch
    if ex.cut or (n > max_tokens and ex.tokens_source != "client_estimate"):
        return status_mod.Classification(
            status_mod.Status.DEGRADED,
            "max_tokens_ignored",
            f"server sent {n} tokens for max_tokens {max_tokens}"
            + (" (stream cut by the client)" if ex.cut else ""),
        )
    if not n:
        return status_mod.Classification(
            status_mod.Status.DEGRADED, "no_tokens", "the answer carried no generated token"
        )
    return None
