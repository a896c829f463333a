"""Runs one request through an engine on an absolute-time schedule, yielding chunks as tokens are produced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from tokwatch.figures.result import Phase
from tokwatch.sim.config import ModelProfile
from tokwatch.sim.engine import Engine, Sequence
from tokwatch.sim.profile import TokenPlan
from tokwatch.sim.runtime import ServerState
from tokwatch.sim.truth import RequestTruth


@dataclass(frozen=True, slots=True)
class Ping:
    """Time for an SSE keep-alive comment."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive tokens of one phase, sent together."""

    first: int
    texts: tuple[str, ...]
    phase: Phase
    last: bool

    @property
    def tokens(self) -> int:
        """Tokens in the chunk."""
        return len(self.texts)

    @property
    def text(self) -> str:
        """The chunk's text."""
        return "".join(self.texts)


async def sleep_until(deadline: float) -> None:
    """Sleep until the perf_counter reaches `deadline` (absolute, so lateness never accumulates)."""
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


class Generation:
    """One request's life in the engine: queue, (cold load), prefill, then tokens at planned times.

    Token i is due at t(i-1) + gap_i x (1 + contention x (running - 1)) where t are planned, not actual,
    times and t(-1) is the end of prefill; a preempted request waits for KV space, then recomputes its KV
    at prefill speed and carries on.
    """

    def __init__(
        self,
        server: ServerState,
        profile: ModelProfile,
        rec: RequestTruth,
        plan: TokenPlan,
        engine: Engine,
        *,
        load_seconds: float = 0.0,
        pings: bool = False,
    ) -> None:
        self.server = server
        self.profile = profile
        self.rec = rec
        self.plan = plan
        self.engine = engine
        self.load_seconds = load_seconds
        self.ping_interval = profile.ping_interval if pings else None
        self.texts: list[str] = []

    async def run(self) -> AsyncGenerator[Chunk | Ping, None]:
        """Yield pings and chunks until the plan is done; always releases the engine slot."""
        rec, plan, engine = self.rec, self.plan, self.engine
        seq = Sequence(rec, kv=rec.prompt_tokens)
        next_ping = rec.arrival + self.ping_interval if self.ping_interval else None
        try:
            await engine.admit(seq)
            rec.scheduled_at = time.perf_counter()
            rec.load_seconds = self.load_seconds
            rec.prefill_seconds = (rec.prompt_tokens - rec.cached_tokens) / self.profile.prefill_tps
            due = rec.scheduled_at + self.load_seconds + rec.prefill_seconds
            gaps = plan.gaps()
            pending: list[str] = []
            i = 0
            while plan.n is None or i < plan.n:
                # Every token, the first included, costs one decode step: the first arrives one gap after
                # prefill ends, so n tokens span n gaps from prefill end (Ollama's eval_duration).
                factor = 1.0 + self.profile.contention * (engine.concurrency() - 1)
                due += gaps.next() * factor
                while next_ping is not None and self.ping_interval and next_ping < due:
                    await sleep_until(next_ping)
                    next_ping += self.ping_interval
                    yield Ping()
                await sleep_until(due)
                while not seq.running:
                    await engine.wait_running(seq)
                    # vLLM V1 preemption frees the KV cache; resuming recomputes it at prefill speed.
                    due = max(due, time.perf_counter() + seq.kv / self.profile.prefill_tps)
                    await sleep_until(due)
                now = time.perf_counter()
                gap = now - rec.generated_at[-1] if rec.generated_at else None
                phase = plan.phase(i)
                text = plan.text(i)
                rec.add_token(due, now, phase)
                engine.on_token(seq, gap)
                pending.append(text)
                i += 1
                last = plan.n is not None and i >= plan.n
                if last:
                    rec.finished_at = now
                    rec.finish_reason = plan.finish_reason
                boundary = last or plan.phase(i) != phase
                if len(pending) >= rec.tokens_per_chunk or boundary:
                    chunk = Chunk(i - len(pending), tuple(pending), phase, last)
                    pending = []
                    self.texts.append(chunk.text)
                    yield chunk
        finally:
            if rec.finish_reason is None:
                rec.finish_reason = "abort"
                rec.finished_at = time.perf_counter()
            engine.release(seq)
            self.server.metrics.on_finished(engine.index, rec)
