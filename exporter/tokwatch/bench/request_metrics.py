"""The per-request record of a benchmark run: lifecycle times, status, token counts and latency figures.

Latency figures start at the actual send; time spent before it (scheduling lag against the planned
arrival, waiting for a concurrency slot) is kept in separate fields so client queueing never hides
inside TTFT or E2E.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import accumulate
from typing import Any

from tokwatch.figures.result import RunResult, Status, TimingSource
from tokwatch.figures.timing import TokensSource, normalized_latency

# Scalar per-request figures, in seconds unless named otherwise; list figures are per token or chunk.
SCALAR_METRICS = (
    "ttft",
    "ttot",
    "tpot",
    "e2e",
    "normalized_latency",
    "fluidity_index",
    "scheduling_lag",
    "queue_time",
    "connect",
    "prompt_tokens",
    "output_tokens",
    "think_tokens",
)
LIST_METRICS = ("tbt", "inter_chunk", "output_itl")
# The attribute of each scalar figure whose name is not the figure's plus `_s`.
_SCALAR_ATTRS = {
    "fluidity_index": "fluidity_index",
    "scheduling_lag": "scheduling_lag_s",
    "queue_time": "queue_time_s",
    "prompt_tokens": "prompt_tokens",
    "output_tokens": "output_tokens",
    "think_tokens": "think_tokens",
}
# Think tokens within this share under the budget count as the budget hit: without a per-phase count from the
# server, the split of its total between the phases is apportioned by text length and can misplace a few
# tokens across the boundary (docs/methodology.md, "Reasoning requests").
BUDGET_TOLERANCE = 0.02
# finish_reason / stop_reason / done_reason values that mean the max_tokens limit ended the stream.
LENGTH_FINISH = frozenset({"length", "max_tokens"})
# Figures where larger is better (SLOs on them use `>=`).
HIGHER_IS_BETTER = frozenset({"fluidity_index"})


@dataclass(slots=True)
class RequestRecord:
    """One benchmark request. Times ending in `_at_s` are seconds since the run start (perf_counter)."""

    request_id: int
    category: str  # "chat", "reasoning" or "dataset"
    warmup: bool = False
    conversation_id: int | None = None
    turn: int | None = None
    intended_at_s: float | None = None  # planned send time (open loop); None in a closed loop
    dispatched_at_s: float = 0.0  # when the generator released it (after any scheduling lag)
    started_at_s: float = 0.0  # when it got its concurrency slot and the client began the request
    sent_at_s: float = 0.0  # when the request's last byte was handed to the socket (t = 0 of TTFT, E2E)
    completed_at_s: float | None = None
    processed_at_s: float | None = None  # when the client had computed its figures and kept the record
    # Setting up the connection this request opened (lookup + TCP connect + TLS + proxy tunnel, inside the
    # send delay); None when it went over a connection already open.
    connect_time_s: float | None = None
    status: Status = Status.OK
    http_status: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    finish_reason: str | None = None
    response_model: str | None = None  # the model the server says answered (the span's gen_ai.response.model)
    server_request_id: str | None = None
    prompt_tokens_target: int | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    fixed_output: bool = False  # the server was asked for exactly max_tokens (ignore_eos/min_tokens)
    output_tokens: int | None = None  # non-reasoning tokens
    think_tokens: int | None = None
    tokens_source: TokensSource | None = None
    chunks: int = 0
    ttft_s: float | None = None
    ttot_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    # Per token after the first: a k-token chunk gives its gap then k-1 zeros.
    tbt_s: list[float] = field(default_factory=list)
    inter_chunk_s: list[float] = field(default_factory=list)  # per chunk after the first
    output_itl_s: list[float] = field(default_factory=list)  # per token after the first output-phase token
    fluidity_index: float | None = None
    decode_tokens_per_s: float | None = None  # timing.client_stream_tps: first-to-last token window
    merged_reads: int | None = None  # socket reads that carried two or more content chunks
    max_stall_s: float | None = None  # the client loop's largest stall while this request streamed
    # The most a stall could have delayed a stamp the request's figures use (tokens, last byte): the loop's
    # lateness at those stamps, or with the receive watcher the smaller of it and the watcher's own.
    stamp_lateness_s: float | None = None
    # The latency figures (ttft, itl, tpot, ttot, e2e) whose error bound from the client's own lateness
    # exceeds the probe's default tolerance (docs/methodology.md, "Disturbance"): the `client timing` check.
    beyond_tolerance: list[str] = field(default_factory=list)
    # The error bound of each latency figure from the client's own lateness (seconds; None where the figure
    # or the bound is): TTFT and E2E can only be late (the true value is within [value - bound, value]),
    # TPOT and TTOT either way. Each `tbt_s` gap lies in [gap - tbt_down_s[i], gap + tbt_up_s[i]], both
    # empty when no stamp was late. The run's published figures are bounded by them (bench/run_bounds.py).
    ttft_error_s: float | None = None
    tpot_error_s: float | None = None
    ttot_error_s: float | None = None
    e2e_error_s: float | None = None
    tbt_down_s: Sequence[float] = ()  # the exchange's own tuples, not copied
    tbt_up_s: Sequence[float] = ()
    # Multi-turn (seed 003): user turns carried in the prompt (turn + 1), the conversation's user turns,
    # tokens of the prompt the previous turn already sent (its prompt plus the model's reply; server-counted
    # when reported, else client-counted), and the client pause before this turn (trace replay `wait_s`;
    # not part of any latency).
    turns: int | None = None
    conversation_turns: int | None = None
    history_tokens: int | None = None
    wait_before_s: float | None = None
    cached_tokens: int | None = None  # cached prompt tokens, when the server reports them (the kind's reader)
    # Reasoning requests (seed 001): the think budget drawn for the request (raised to the kind's minimum),
    # the body field that asked the server for it (None: the kind's API has none, only max_tokens bounds the
    # think phase), and each phase's time, first to last token of the phase (timing.phase_time).
    think_budget: int | None = None
    think_budget_field: str | None = None
    think_s: float | None = None
    answer_s: float | None = None
    reply_text: str = ""  # the model's answer; used for multi-turn history, never written out

    @property
    def scheduling_lag_s(self) -> float | None:
        """How late the generator released the request against its planned time (open loop only)."""
        if self.intended_at_s is None:
            return None
        return max(0.0, self.dispatched_at_s - self.intended_at_s)

    @property
    def queue_time_s(self) -> float:
        """Time spent waiting for a concurrency slot before the send."""
        return max(0.0, self.started_at_s - self.dispatched_at_s)

    @property
    def connect_s(self) -> float:
        """Send delay: from starting the request to its last byte on the socket (pool wait, a new
        connection, serialisation, the body-writing task's turn); the latency clock starts after it."""
        return max(0.0, self.sent_at_s - self.started_at_s)

    @property
    def normalized_latency_s(self) -> float | None:
        """E2E per generated token, reasoning included (seed 004): `timing.normalized_latency`."""
        return normalized_latency(self.e2e_s, self.generated_tokens)

    @property
    def generated_tokens(self) -> int:
        """Think plus output tokens."""
        return (self.output_tokens or 0) + (self.think_tokens or 0)

    @property
    def think_end(self) -> str | None:
        """How an ok reasoning request's think phase ended (docs/methodology.md, "Reasoning requests"):
        `budget` when it thought its requested budget (within BUDGET_TOLERANCE), `length` when max_tokens
        ended the stream before any answer token, else `natural`; None for other requests."""
        if self.category != "reasoning" or not self.ok:
            return None
        think = self.think_tokens or 0
        budget = self.think_budget if self.think_budget_field is not None else None
        if budget is not None and think >= budget - int(budget * BUDGET_TOLERANCE):
            return "budget"
        if not self.output_tokens and self.finish_reason in LENGTH_FINISH:
            return "length"
        return "natural"

    @property
    def ok(self) -> bool:
        """True when the request completed and counts towards latency figures."""
        return self.status is Status.OK

    def scalar(self, name: str) -> float | None:
        """The scalar figure `name` (one of SCALAR_METRICS)."""
        value = getattr(self, _SCALAR_ATTRS.get(name) or f"{name}_s")
        return None if value is None else float(value)

    def series(self, name: str) -> list[float]:
        """The list figure `name` (one of LIST_METRICS)."""
        return list(getattr(self, f"{name}_s"))

    def token_times_s(self) -> list[float]:
        """Receive time of every generated token, seconds since the run start."""
        if self.ttft_s is None:
            return []
        first = self.sent_at_s + self.ttft_s
        return [first, *(first + t for t in accumulate(self.tbt_s))]

    def to_run_result(self, endpoint: str, run_started_unix: float, instance: str = "") -> RunResult:
        """The request as the exporter's shared record (for the store); tok/s is the client-stream figure."""
        return RunResult(
            endpoint=endpoint,
            started_at=run_started_unix + self.sent_at_s,
            status=self.status,
            http_status=self.http_status,
            error_class=self.error_class,
            error_message=self.error_message,
            tokens_per_second=self.decode_tokens_per_s,
            source=TimingSource.CLIENT_STREAM if self.decode_tokens_per_s is not None else None,
            candidates=(
                {TimingSource.CLIENT_STREAM: self.decode_tokens_per_s} if self.decode_tokens_per_s else {}
            ),
            output_tokens=self.output_tokens,
            think_tokens=self.think_tokens,
            prompt_tokens=self.prompt_tokens,
            tokens_source=self.tokens_source,
            ttft_s=self.ttft_s,
            ttot_s=self.ttot_s,
            tpot_s=self.tpot_s,
            e2e_s=self.e2e_s,
            itl_s=list(self.tbt_s),
            output_itl_s=list(self.output_itl_s),
            streamed=True,
            finish_reason=self.finish_reason,
            instance=instance,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the request_level_metrics.jsonl line; docs/bench.md)."""
        # A shallow copy: `asdict` deep-copies every float of the per-token lists, which was 70 % of writing
        # the results of a 16,000-request run (benchmarks/bench_teardown.py). The lists are only read.
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "reply_text"}
        d["status"] = self.status.value
        d["scheduling_lag_s"] = self.scheduling_lag_s
        d["queue_time_s"] = self.queue_time_s
        d["connect_s"] = self.connect_s  # schema v1 name of the send delay
        d["send_delay_s"] = self.connect_s
        d["normalized_latency_s"] = self.normalized_latency_s
        d["think_end"] = self.think_end
        return d
