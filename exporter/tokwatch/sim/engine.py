"""One simulated engine: admission queue, KV-cache accounting, preemption and decode contention."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from tokwatch.sim.truth import RequestTruth


class EngineObserver(Protocol):
    """Receives engine events; the /metrics backends implement it."""

    def on_state(self, engine: int, running: int, waiting: int, kv_used: int) -> None:
        """Queue lengths or KV usage changed."""

    def on_scheduled(self, engine: int, rec: RequestTruth) -> None:
        """A request left the queue and started prefill."""

    def on_token(self, engine: int, rec: RequestTruth, running: int, gap: float | None) -> None:
        """One token was generated; `gap` is the time since the request's previous token."""

    def on_preempted(self, engine: int, rec: RequestTruth) -> None:
        """A running request was preempted to free KV cache."""

    def on_finished(self, engine: int, rec: RequestTruth) -> None:
        """A request finished (completed, failed or abandoned)."""


@dataclass(eq=False)
class Sequence:
    """A request's place in an engine: its KV footprint and whether it may run now."""

    rec: RequestTruth
    kv: int
    running: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Engine:
    """FIFO admission limited by `max_running` and KV capacity; the newest running request is preempted
    when growing sequences overflow the KV cache, and resumes (recomputing its KV) when space frees."""

    def __init__(self, index: int, kv_capacity: int | None, max_running: int, observer: ObserverRef) -> None:
        self.index = index
        self.kv_capacity = kv_capacity
        self.max_running = max_running
        self._observer = observer
        self.running: list[Sequence] = []
        self.waiting: deque[Sequence] = deque()

    @property
    def kv_used(self) -> int:
        """KV tokens held by running requests (preempted requests free theirs)."""
        return sum(s.kv for s in self.running)

    def concurrency(self) -> int:
        """Requests decoding together now (at least 1); profiles turn it into a slowdown via `contention`."""
        return max(1, len(self.running))

    async def admit(self, seq: Sequence) -> None:
        """Queue `seq` and wait until it is scheduled."""
        self.waiting.append(seq)
        self._schedule()
        await seq.wake.wait()

    async def wait_running(self, seq: Sequence) -> None:
        """Return once `seq` runs (immediately unless it was preempted)."""
        while not seq.running:
            await seq.wake.wait()

    def on_token(self, seq: Sequence, gap: float | None) -> None:
        """Account one generated token, then preempt if the KV cache overflowed."""
        seq.kv += 1
        self._observer.get().on_token(self.index, seq.rec, len(self.running), gap)
        self._relieve_pressure()

    def release(self, seq: Sequence) -> None:
        """Remove a finished or abandoned request and admit whoever now fits."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.running = False
        self._schedule()

    def _fits(self, seq: Sequence) -> bool:
        if not self.running:
            return True  # an empty engine always takes the next request, or nothing would ever run
        if len(self.running) >= self.max_running:
            return False
        return self.kv_capacity is None or self.kv_used + seq.kv <= self.kv_capacity

    def _schedule(self) -> None:
        while self.waiting and self._fits(self.waiting[0]):
            seq = self.waiting.popleft()
            seq.running = True
            self.running.append(seq)
            seq.wake.set()
            if seq.rec.scheduled_at is None:
                self._observer.get().on_scheduled(self.index, seq.rec)
        self._publish()

    def _relieve_pressure(self) -> None:
        cap = self.kv_capacity
        preempted = False
        while cap is not None and self.kv_used > cap and len(self.running) > 1:
            victim = self.running.pop()
            victim.running = False
            victim.wake.clear()
            victim.rec.preemptions += 1
            # vLLM puts preempted requests at the front of the waiting queue.
            self.waiting.appendleft(victim)
            self._observer.get().on_preempted(self.index, victim.rec)
            preempted = True
        if preempted:
            self._publish()

    def republish(self) -> None:
        """Push the current gauges to the observer (after it was replaced)."""
        self._publish()

    def _publish(self) -> None:
        self._observer.get().on_state(self.index, len(self.running), len(self.waiting), self.kv_used)


class ObserverRef(Protocol):
    """Indirection so a counter reset (simulated restart) can swap the observer under running requests."""

    def get(self) -> EngineObserver:
        """The current observer."""
        ...
