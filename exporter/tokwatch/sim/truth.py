"""Ground truth: what the simulator really did for each request, kept in a bounded ring."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tokwatch.figures.result import Phase

MAX_RECORDED_TOKENS = 100_000  # an endless stream stops recording here so memory stays bounded


@dataclass
class RequestTruth:
    """One request. Times are time.perf_counter() values (CLOCK_MONOTONIC, comparable across processes)."""

    request_id: str
    server: str
    model: str
    dialect: str
    route: str
    seq: int
    engine: int
    stream: bool
    arrival: float
    prompt_tokens: int
    max_tokens: int | None
    tokens_per_chunk: int
    background: bool = False
    fault: str | None = None
    http_status: int = 200
    cached_tokens: int = 0
    cold: bool = False
    load_seconds: float = 0.0
    prefill_seconds: float = 0.0
    scheduled_at: float | None = None
    generated_at: list[float] = field(default_factory=list)  # when each token was produced
    planned_at: list[float] = field(default_factory=list)  # when the schedule meant it to be produced
    phases: list[Phase] = field(default_factory=list)
    chunks: list[tuple[float, int, Phase]] = field(default_factory=list)  # (write time, tokens, phase)
    preemptions: int = 0
    finish_reason: str | None = None
    finished_at: float | None = None
    # Thinking on request (profile `natural_think`): the budget the request set, the length the model would
    # have thought unbounded, and how its think phase ended ("natural", "budget", "length"); None otherwise.
    think_budget: int | None = None
    natural_think_tokens: int | None = None
    think_end: str | None = None
    completed: bool = False  # the whole response reached the socket

    def add_token(self, planned: float, actual: float, phase: Phase) -> None:
        """Record one generated token."""
        if len(self.generated_at) < MAX_RECORDED_TOKENS:
            self.planned_at.append(planned)
            self.generated_at.append(actual)
            self.phases.append(phase)

    def add_chunk(self, written: float, tokens: int, phase: Phase) -> None:
        """Record one streamed chunk at the moment its bytes were handed to the socket."""
        if len(self.chunks) < MAX_RECORDED_TOKENS:
            self.chunks.append((written, tokens, phase))

    @property
    def tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.generated_at)

    @property
    def think_tokens(self) -> int:
        """Reasoning-phase tokens generated."""
        return sum(1 for p in self.phases if p == "think")

    @property
    def output_tokens(self) -> int:
        """Output-phase tokens generated."""
        return self.tokens - self.think_tokens

    @property
    def emitted_at(self) -> list[float]:
        """When each token became visible to the client: its chunk's write time when streamed."""
        if not self.stream or not self.chunks:
            return list(self.generated_at)
        out: list[float] = []
        for written, n, _ in self.chunks:
            out.extend([written] * n)
        return out

    @property
    def prefill_end(self) -> float | None:
        """Planned end of queue + load + prefill: the start of the first token's decode step."""
        if self.scheduled_at is None:
            return None
        return self.scheduled_at + self.load_seconds + self.prefill_seconds

    @property
    def prefill_tps(self) -> float | None:
        """True prefill rate: the prompt tokens computed (cached ones left out) over the prefill time."""
        computed = self.prompt_tokens - self.cached_tokens
        return computed / self.prefill_seconds if self.prefill_seconds > 0 and computed > 0 else None

    @property
    def decode_seconds(self) -> float | None:
        """First to last generated token (covers tokens - 1 gaps), as vLLM's request_decode_time."""
        if len(self.generated_at) < 2:
            return None
        return self.generated_at[-1] - self.generated_at[0]

    @property
    def decode_tps(self) -> float | None:
        """True decode rate: tokens after the first divided by the first-to-last time."""
        d = self.decode_seconds
        return (self.tokens - 1) / d if d else None

    def to_json(self) -> dict[str, Any]:
        """JSON form served by GET /_sim/requests/<id>."""
        return {
            "request_id": self.request_id,
            "server": self.server,
            "model": self.model,
            "dialect": self.dialect,
            "route": self.route,
            "seq": self.seq,
            "engine": self.engine,
            "stream": self.stream,
            "background": self.background,
            "arrival": self.arrival,
            "scheduled_at": self.scheduled_at,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "max_tokens": self.max_tokens,
            "tokens_per_chunk": self.tokens_per_chunk,
            "fault": self.fault,
            "http_status": self.http_status,
            "cold": self.cold,
            "load_seconds": self.load_seconds,
            "prefill_seconds": self.prefill_seconds,
            "tokens": self.tokens,
            "think_tokens": self.think_tokens,
            "output_tokens": self.output_tokens,
            "generated_at": self.generated_at,
            "planned_at": self.planned_at,
            "emitted_at": self.emitted_at,
            "phases": self.phases,
            "chunks": [{"t": t, "tokens": n, "phase": p} for t, n, p in self.chunks],
            "preempted": self.preemptions > 0,
            "preemptions": self.preemptions,
            "finish_reason": self.finish_reason,
            "think_budget": self.think_budget,
            "natural_think_tokens": self.natural_think_tokens,
            "think_end": self.think_end,
            "finished_at": self.finished_at,
            "completed": self.completed,
            "prefill_end": self.prefill_end,
            "decode_seconds": self.decode_seconds,
            "decode_tps": self.decode_tps,
            "prefill_tps": self.prefill_tps,
        }


class TruthStore:
    """The last `capacity` requests by id (oldest evicted first)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, RequestTruth] = OrderedDict()

    def add(self, rec: RequestTruth) -> None:
        """Keep `rec`, evicting the oldest record when full."""
        self._items[rec.request_id] = rec
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def get(self, request_id: str) -> RequestTruth | None:
        """The record for `request_id`, or None when unknown or evicted."""
        return self._items.get(request_id)

    def __len__(self) -> int:
        return len(self._items)

    def recent(self, model: str | None = None, limit: int = 100) -> list[RequestTruth]:
        """Up to `limit` most recent non-background records (of `model` when given), oldest first."""
        out: list[RequestTruth] = []
        for rec in reversed(self._items.values()):
            if len(out) >= limit:
                break
            if not rec.background and (model is None or rec.model == model):
                out.append(rec)
        return out[::-1]

    def last(self, server: str | None = None) -> RequestTruth | None:
        """The most recent non-background record (of `server` when given)."""
        for rec in reversed(self._items.values()):
            if not rec.background and (server is None or rec.server == server):
                return rec
        return None
