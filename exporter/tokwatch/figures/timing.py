"""Timing math as pure functions: token events, TTFT, ITL, TPOT, TTOT, tok/s candidates, source choice.

Every definition here is documented with its unit and source in docs/methodology.md. Inputs are plain
values or `TokenEvent` lists (times in seconds since the request was sent), so the probe, the benchmark and
tests share one implementation.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal, Protocol

from tokwatch.figures.result import SERVER_SOURCES, Phase, TimingSource, TokenEvent

TokensSource = Literal["usage", "engine", "chunk_usage", "client_estimate"]


class DeltaLike(Protocol):
    """What `token_events` needs from a parsed chunk (see `tokwatch.streams.events.TextDelta`)."""

    @property
    def t(self) -> float: ...
    @property
    def phase(self) -> Phase: ...
    @property
    def chars(self) -> int: ...
    @property
    def chunk_tokens(self) -> int | None: ...
    @property
    def chunk(self) -> int: ...


def apportion(total: int, weights: Sequence[int], *, at_least_one: bool = True) -> list[int]:
    """Split `total` into integer shares by weight (largest remainder); each share >= 1 when total allows.

    Every content chunk carries at least one token, so when `total >= len(weights)` each gets 1 and only the
    surplus is split by weight; this keeps one-token chunks at one token however short their text.
    `at_least_one=False` splits purely by weight (phase parts of one chunk).
    """
    n = len(weights)
    if n == 0:
        return []
    total = max(total, 0)
    if n == 1:
        return [total]
    base = 1 if at_least_one and total >= n else 0
    rest = total - base * n
    if rest == 0:
        return [base] * n  # nothing left to split by weight (one token per chunk, the common stream)
    w = [max(x, 0) for x in weights]
    wsum = sum(w)
    if wsum == 0:
        w, wsum = [1] * n, n
    shares = [rest * x // wsum for x in w]
    remainders = [rest * x % wsum for x in w]
    left = rest - sum(shares)
    for i in sorted(range(n), key=lambda i: (-remainders[i], i))[:left]:
        shares[i] += 1
    return [base + s for s in shares]


def token_events(
    deltas: Sequence[DeltaLike],
    sent_at: float,
    total_tokens: int | None,
    total_source: Literal["usage", "engine"] = "usage",
) -> tuple[list[TokenEvent], TokensSource | None]:
    """Token events (times relative to `sent_at`) and how their token counts were obtained.

    Per-chunk server counts when every chunk has one; else the server total apportioned by text length;
    else one token per chunk (client estimate).
    """
    if not deltas:
        return [], None
    source: TokensSource
    if all(d.chunk_tokens is not None for d in deltas):
        counts = [int(d.chunk_tokens or 0) for d in deltas]
        source = "chunk_usage"
    elif all(a.chunk != b.chunk for a, b in pairwise(deltas)):
        # One delta per chunk (no chunk spans both phases), the common stream: a chunk's share is its
        # delta's count, as `chunk_token_counts` would find one group at a time.
        if total_tokens is not None and total_tokens >= len(deltas):
            counts = apportion(total_tokens, [d.chars for d in deltas])
            source = total_source
        else:
            counts = [1] * len(deltas)
            source = "client_estimate"
    else:
        counts, source = chunk_token_counts(deltas, total_tokens, total_source)
    events = [
        TokenEvent(t=d.t - sent_at, tokens=k, phase=d.phase, chars=d.chars)
        for d, k in zip(deltas, counts, strict=True)
        if k > 0  # a chunk the server says carried no new token (text held back by the detokenizer)
    ]
    return events, source


def chunk_token_counts(
    deltas: Sequence[DeltaLike], total_tokens: int | None, total_source: Literal["usage", "engine"]
) -> tuple[list[int], TokensSource]:
    """Tokens per delta without per-chunk server counts: the total split among chunks by text length (one
    token per chunk without a usable total), then each chunk's share among its phase parts."""
    source: TokensSource
    groups = _chunk_groups(deltas)
    if total_tokens is not None and total_tokens >= len(groups):
        per_chunk = apportion(total_tokens, [sum(deltas[i].chars for i in g) for g in groups])
        source = total_source
    else:
        per_chunk = [1] * len(groups)
        source = "client_estimate"
    counts: list[int] = []
    for g, k in zip(groups, per_chunk, strict=True):
        counts.extend(apportion(k, [deltas[i].chars for i in g], at_least_one=False))
    return counts, source


def _chunk_groups(deltas: Sequence[DeltaLike]) -> list[list[int]]:
    """Indexes of consecutive deltas that came from one chunk (a chunk spanning both phases gives two)."""
    groups: list[list[int]] = []
    for i, d in enumerate(deltas):
        if groups and deltas[groups[-1][-1]].chunk == d.chunk:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def total_tokens(events: Sequence[TokenEvent], phase: Phase | None = None) -> int:
    """Tokens carried by the events (of one phase when given)."""
    return sum(e.tokens for e in events if phase is None or e.phase == phase)


def ttft(events: Sequence[TokenEvent]) -> float | None:
    """Seconds from sending the request to the first content or reasoning token."""
    return events[0].t if events else None


def _gaps(events: Sequence[TokenEvent]) -> list[float]:
    """Per-token gaps: a chunk of k tokens gives its gap from the previous chunk then k-1 zeros."""
    if all(e.tokens == 1 for e in events):
        return [b.t - a.t for a, b in pairwise(events)]
    out: list[float] = []
    for i, e in enumerate(events):
        if i:
            out.append(e.t - events[i - 1].t)
            out.extend([0.0] * (e.tokens - 1))
        else:
            out.extend([0.0] * (e.tokens - 1))  # the first chunk's extra tokens arrived with it
    return out


def itl(events: Sequence[TokenEvent]) -> list[float]:
    """Inter-token latencies in seconds over the whole stream (n-1 values for n tokens)."""
    return _gaps(events)


def output_itl(events: Sequence[TokenEvent]) -> list[float]:
    """Inter-token latencies among output-phase tokens only (the think->output gap excluded)."""
    return _gaps([e for e in events if e.phase == "output"])


def ttot(events: Sequence[TokenEvent]) -> float | None:
    """Seconds from the last think token before the output to the first output token; None without both."""
    last_think: float | None = None
    for e in events:
        if e.phase == "think":
            last_think = e.t
        elif last_think is not None:
            return e.t - last_think
    return None


def phase_time(events: Sequence[TokenEvent], phase: Phase) -> float | None:
    """Seconds from the first to the last token event of one phase (0 for a one-event phase); None when the
    stream has none. With thinking first, TTFT + think + TTOT + output phase = E2E up to the last byte."""
    times = [e.t for e in events if e.phase == phase]
    return times[-1] - times[0] if times else None


def tpot(e2e_s: float | None, ttft_s: float | None, n_tokens: int) -> float | None:
    """Time per output token after the first: (E2E - TTFT) / (n - 1) seconds."""
    if e2e_s is None or ttft_s is None or n_tokens < 2:
        return None
    return max(e2e_s - ttft_s, 0.0) / (n_tokens - 1)


def normalized_latency(e2e_s: float | None, generated_tokens: int | None) -> float | None:
    """E2E / every generated token (reasoning included), seconds per token (seed 004); None without tokens."""
    if e2e_s is None or not generated_tokens:
        return None
    return e2e_s / generated_tokens


def client_stream_tps(events: Sequence[TokenEvent], n_tokens: int | None = None) -> float | None:
    """Decode tok/s over the first->last token window: (N - k1) / (t_last - t_first)."""
    if len(events) < 2:
        return None
    n = total_tokens(events) if n_tokens is None else n_tokens
    window = events[-1].t - events[0].t
    decoded = n - events[0].tokens
    if window <= 0 or decoded <= 0:
        return None
    return decoded / window


def decoded_in_one_read(events: Sequence[TokenEvent]) -> bool:
    """Whether every token after the first event's arrived in a single read (one stamp) and there were at
    least two of them: the first->last window then times the delivery of a buffered answer, not decoding."""
    if len(events) < 2:
        return False
    t = events[1].t
    return all(e.t == t for e in events[2:]) and sum(e.tokens for e in events[1:]) >= 2


def client_wall_tps(n_tokens: int | None, e2e_s: float | None) -> float | None:
    """Completion tokens per second of end-to-end wall time (last resort; includes network and prefill)."""
    if not n_tokens or not e2e_s or e2e_s <= 0:
        return None
    return n_tokens / e2e_s


def ollama_engine_tps(eval_count: int | None, eval_duration_ns: int | None) -> float | None:
    """Ollama eval_count / eval_duration (nanoseconds)."""
    if not eval_count or not eval_duration_ns or eval_duration_ns <= 0:
        return None
    return eval_count / (eval_duration_ns / 1e9)


def ollama_server_wall_tps(eval_count: int | None, total_duration_ns: int | None) -> float | None:
    """Ollama eval_count / total_duration (nanoseconds): includes load and prompt evaluation."""
    if not eval_count or not total_duration_ns or total_duration_ns <= 0:
        return None
    return eval_count / (total_duration_ns / 1e9)


def llamacpp_engine_tps(
    predicted_n: int | None, predicted_ms: float | None, predicted_per_second: float | None = None
) -> float | None:
    """llama.cpp's own `predicted_per_second` when sent, else predicted_n / (predicted_ms / 1000).

    Current llama-server samples the first token during prompt processing, so `predicted_ms` spans n-1 decode
    steps and its own figure is (n-1)/predicted_ms; preferring it keeps us equal to the server's number.
    """
    if predicted_per_second is not None and predicted_per_second > 0:
        return predicted_per_second
    if not predicted_n or not predicted_ms or predicted_ms <= 0:
        return None
    return predicted_n / (predicted_ms / 1000.0)


def llamacpp_prefill_tps(
    prompt_n: int | None, prompt_ms: float | None, prompt_per_second: float | None = None
) -> float | None:
    """llama.cpp's own `prompt_per_second` when sent, else prompt_n / (prompt_ms / 1000): the prompt tokens
    it computed (the cached ones left out) over its prompt-processing time."""
    if prompt_per_second is not None and prompt_per_second > 0:
        return prompt_per_second
    if not prompt_n or not prompt_ms or prompt_ms <= 0:
        return None
    return prompt_n / (prompt_ms / 1000.0)


def ollama_prefill_tps(prompt_eval_count: int | None, prompt_eval_duration_ns: int | None) -> float | None:
    """Ollama prompt_eval_count / prompt_eval_duration (nanoseconds)."""
    if not prompt_eval_count or not prompt_eval_duration_ns or prompt_eval_duration_ns <= 0:
        return None
    return prompt_eval_count / (prompt_eval_duration_ns / 1e9)


def client_prefill_tps(
    prompt_tokens: int | None,
    cached_tokens: int | None,
    ttft_s: float | None,
    network_rtt_s: float | None = None,
) -> float | None:
    """Prompt tokens the server computed (prompt tokens less those it reports cached) over the time to the
    first token less the network round trip where measured: queueing and the first token's sampling stay
    in (docs/methodology.md, "Prefill speed")."""
    if not prompt_tokens or ttft_s is None:
        return None
    server_s = ttft_s - (network_rtt_s or 0.0)
    computed = prompt_tokens - (cached_tokens or 0)
    return computed / server_s if computed > 0 and server_s > 0 else None


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen tok/s figure."""

    source: TimingSource | None
    tokens_per_second: float | None
    server_shared: bool = False
    skipped: dict[TimingSource, str] = field(default_factory=dict)  # source -> why it was not used


def select_source(
    candidates: Mapping[TimingSource, float],
    preference: Sequence[TimingSource],
    *,
    counters_shared: bool = False,
    shared_policy: Literal["flag", "fallback"] = "fallback",
) -> Selection:
    """The first source of `preference` that has a figure, in the configured order; unlisted sources are
    never used (so `[client_stream]` measures on the client even when the server reports timings).

    A shared counter window (`counters_shared`) is skipped under "fallback" and used but flagged under "flag".
    """
    skipped: dict[TimingSource, str] = {}
    usable = dict(candidates)
    if counters_shared and TimingSource.VLLM_METRICS in usable and shared_policy == "fallback":
        del usable[TimingSource.VLLM_METRICS]
        skipped[TimingSource.VLLM_METRICS] = "shared window"
    for source in preference:
        if source in usable:
            shared = source is TimingSource.VLLM_METRICS and counters_shared
            return Selection(source, usable[source], shared, skipped)
    return Selection(None, None, False, skipped)


def select_within_tolerance(
    candidates: Mapping[TimingSource, float],
    preference: Sequence[TimingSource],
    bounds: Mapping[TimingSource, float],
    tolerance: float,
    *,
    counters_shared: bool = False,
    shared_policy: Literal["flag", "fallback"] = "fallback",
) -> tuple[Selection, bool]:
    """`select_source`, and whether its figure is set aside: when the chosen figure is a client one whose
    error bound (relative, from the client's own lateness; none: unmoved) exceeds `tolerance`, the first
    server figure of `preference` replaces it; with none, the client figure stays, set aside (True).

    A stalled client stamps tokens late, which can move its own figures but never the server's; another
    client source is no fallback, as it measures something else (docs/methodology.md, "Disturbance").
    """
    choose = functools.partial(
        select_source, preference=preference, counters_shared=counters_shared, shared_policy=shared_policy
    )
    chosen = choose(candidates)
    if chosen.source is None or chosen.source in SERVER_SOURCES:
        return chosen, False
    if bounds.get(chosen.source, 0.0) <= tolerance:
        return chosen, False
    instead = choose({s: v for s, v in candidates.items() if s in SERVER_SOURCES})
    if instead.source is None:
        return chosen, True
    return Selection(instead.source, instead.tokens_per_second, instead.server_shared, chosen.skipped), False
