"""Aligned probe rounds: every `interval`, `offset` past the boundary, with bounded parallelism."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence

log = logging.getLogger("tokwatch.scheduler")


def next_round_time(now: float, interval: float, offset: float) -> float:
    """Smallest t >= now with (t - offset) a multiple of `interval` (epoch-aligned: hh:30 for 1h/30m)."""
    k = math.ceil((now - offset) / interval)
    return offset + k * interval


async def run_round(
    names: Sequence[str], probe: Callable[[str], Awaitable[object]], parallelism: int
) -> None:
    """Probe every endpoint once, at most `parallelism` at a time (1 = sequential: no mutual disturbance)."""
    sem = asyncio.Semaphore(parallelism)

    async def one(name: str) -> None:
        async with sem:
            try:
                await probe(name)
            except asyncio.CancelledError:
                raise
            except Exception:  # a probe bug must not end the round for the other endpoints
                log.exception("probe of endpoint %s failed unexpectedly", name)

    await asyncio.gather(*(one(n) for n in names))


class Scheduler:
    """Runs rounds forever on the aligned schedule; settings are read each round so a reload takes effect."""

    def __init__(
        self,
        settings: Callable[[], tuple[float, float, int, Sequence[str]]],
        probe: Callable[[str], Awaitable[object]],
        on_round: Callable[[float, float, float], None],
        *,
        run_on_start: bool = True,
        after_round: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings  # -> (interval, offset, parallelism, endpoint names)
        self._probe = probe
        self._on_round = on_round  # (planned, actual start, next planned)
        self._run_on_start = run_on_start
        self._after_round = after_round
        self._clock = clock
        self._wake = asyncio.Event()
        self.rounds = 0

    def reschedule(self) -> None:
        """Recompute the next round time now (after a config reload)."""
        self._wake.set()

    async def run(self) -> None:
        """Loop until cancelled."""
        planned: float | None = self._clock() if self._run_on_start else None
        while True:
            interval, offset, parallelism, names = self._settings()
            target = planned if planned is not None else next_round_time(self._clock(), interval, offset)
            delay = target - self._clock()
            if delay > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
                    planned = None  # woken by a reload: recompute against the new settings
                    continue
                except TimeoutError:
                    pass
            started = self._clock()
            # A round that overran skips the slots it missed rather than running them back to back.
            following = next_round_time(max(started, target) + 1e-6, interval, offset)
            self._on_round(target, started, following)
            await run_round(names, self._probe, parallelism)
            self.rounds += 1
            if self._after_round is not None:
                self._after_round()
            planned = following
