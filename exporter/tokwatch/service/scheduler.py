"""Aligned probe rounds: every `interval`, `offset` past the boundary; one server at a time per server,
several servers at once; supervised, so a crash is counted and the schedule goes on.

A round probes targets (an endpoint name, or an endpoint and a workload); several schedules (workloads with
their own interval) share one `ProbeSlots`, so their rounds never load one server at once either."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokwatch.figures.wording import counted
from tokwatch.metrics.exporter import SchedulerStats
from tokwatch.transport.event_wait import wait_event

log = logging.getLogger("tokwatch.service.scheduler")

# After the scheduler loop itself crashed, wait before restarting it (doubling up to the maximum), so a
# bug that crashes it at once does not spin.
RESTART_BACKOFF_S = (1.0, 60.0)


def next_round_time(now: float, interval: float, offset: float) -> float:
    """Smallest t >= now with (t - offset) a multiple of `interval` (epoch-aligned: hh:30 for 1h/30m)."""
    k = math.ceil((now - offset) / interval)
    return offset + k * interval


@dataclass(frozen=True)
class RoundPlan:
    """What one round probes: targets (endpoint names, or (endpoint, workload) pairs) grouped by the server
    (host:port) they run on."""

    servers: Mapping[str, Sequence[Any]]
    parallelism: int = 4  # servers probed at once
    per_server: int = 1  # probes at once against one server

    @property
    def names(self) -> list[Any]:
        """Every target of the round."""
        return [n for group in self.servers.values() for n in group]


class ProbeSlots:
    """How many servers are probed at once and how many probes at once run against one server, shared by
    every schedule of an exporter (a round's own when none is given)."""

    def __init__(self, parallelism: int = 4, per_server: int = 1) -> None:
        self._per_server = max(1, per_server)
        self.servers = asyncio.Semaphore(max(1, parallelism))
        self._parallelism = max(1, parallelism)
        self._by_server: dict[str, asyncio.Semaphore] = {}

    def configure(self, parallelism: int, per_server: int) -> None:
        """Apply (re)loaded limits; probes holding a slot of the old limits finish under them."""
        if max(1, parallelism) != self._parallelism:
            self._parallelism = max(1, parallelism)
            self.servers = asyncio.Semaphore(self._parallelism)
        if max(1, per_server) != self._per_server:
            self._per_server = max(1, per_server)
            self._by_server = {}

    def server(self, key: str) -> asyncio.Semaphore:
        """The slots of one server (host:port)."""
        if key not in self._by_server:
            self._by_server[key] = asyncio.Semaphore(self._per_server)
        return self._by_server[key]


async def run_round(
    plan: RoundPlan, probe: Callable[[Any], Awaitable[object]], slots: ProbeSlots | None = None
) -> None:
    """Probe every target once: `per_server` at a time within a server, `parallelism` servers at once
    (the shared `slots`' limits when given: other schedules' rounds then count against them too).

    Targets of one server are probed one after another by default, so they do not load the server
    for each other; a slow or hostile server delays only its own targets, never another server's.
    """
    slots = slots or ProbeSlots(plan.parallelism, plan.per_server)

    async def one(target: Hashable, server_slots: asyncio.Semaphore) -> None:
        async with server_slots:
            try:
                await probe(target)
            except asyncio.CancelledError:
                raise
            except Exception:  # a probe bug must not end the round for the other endpoints
                log.exception("probe of %s failed unexpectedly", _describe(target))

    async def server(key: str, targets: Sequence[Hashable]) -> None:
        async with slots.servers:
            server_slots = slots.server(key)
            await asyncio.gather(*(one(t, server_slots) for t in targets))

    await asyncio.gather(*(server(key, group) for key, group in plan.servers.items()))


def _describe(target: Hashable) -> str:
    if isinstance(target, tuple):
        return "endpoint " + " workload ".join(str(part) for part in target)
    return f"endpoint {target}"


class Scheduler:
    """Runs rounds forever on the aligned schedule; settings are read each round so a reload takes effect."""

    def __init__(
        self,
        settings: Callable[[], tuple[float, float, RoundPlan]],
        probe: Callable[[Any], Awaitable[object]],
        on_round: Callable[[float, float, float], None],
        *,
        run_on_start: bool = True,
        after_round: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        slots: ProbeSlots | None = None,
    ) -> None:
        self._settings = settings  # -> (interval, offset, round plan)
        self._probe = probe
        self._slots = slots
        self._on_round = on_round  # (planned, actual start, next planned)
        self._run_on_start = run_on_start
        self._after_round = after_round
        self._clock = clock
        self._wake = asyncio.Event()
        self.stats = SchedulerStats()

    @property
    def rounds(self) -> int:
        """Rounds completed."""
        return self.stats.rounds

    def reschedule(self) -> None:
        """Recompute the next round time now (after a config reload)."""
        self._wake.set()

    async def supervise(self, *, backoff_s: tuple[float, float] = RESTART_BACKOFF_S) -> None:
        """Run the loop; when it crashes, log it, count it and start it again after a back-off."""
        delay, ceiling = backoff_s
        first = True
        while True:
            self.stats.running = True
            try:
                await self._run(run_now=self._run_on_start and first)
            except asyncio.CancelledError:
                self.stats.running = False
                raise
            except Exception as exc:
                self.stats.running = False
                self.stats.crashes += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.exception("the scheduler crashed (restart %d in %.0fs)", self.stats.crashes, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, ceiling)
            first = False

    async def run(self) -> None:
        """The loop without supervision (tests, one-off use); crashes propagate."""
        await self._run(run_now=self._run_on_start)

    async def _run(self, *, run_now: bool) -> None:
        planned: float | None = self._clock() if run_now else None
        while True:
            interval, offset, plan = self._settings()
            target = planned if planned is not None else next_round_time(self._clock(), interval, offset)
            delay = target - self._clock()
            if delay > 0:
                self._wake.clear()
                if await wait_event(self._wake, delay):
                    planned = None  # woken by a reload: recompute against the new settings
                    continue
            started = self._clock()
            following = next_round_time(max(started, target) + 1e-6, interval, offset)
            self._on_round(target, started, following)
            t0 = time.monotonic()
            await run_round(plan, self._probe, self._slots)
            self.stats.rounds += 1
            took = time.monotonic() - t0
            log.info(
                "round %d: %s on %s in %.1fs (every %gs)",
                self.stats.rounds,
                counted(len(plan.names), "probe"),
                counted(len(plan.servers), "server"),
                took,
                interval,
                extra={
                    "round": self.stats.rounds,
                    "probes": len(plan.names),
                    "servers": len(plan.servers),
                    "duration_seconds": round(took, 3),
                },
            )
            if self._after_round is not None:
                self._after_round()
            # A round that ended past the next slot skips the slots it missed rather than running them
            # back to back. Only one that took longer than the interval overran (warned and counted): the
            # start-up round starts at no slot, and a round that started late ends late too.
            now = self._clock()
            if now > following:
                missed = math.floor((now - following) / interval) + 1
                following = next_round_time(now, interval, offset)
                at = time.strftime("%H:%M:%S", time.localtime(following))
                took = now - started
                if took > interval:
                    self.stats.skipped_slots += missed
                    log.warning(
                        "the round took longer than the interval (%.1fs of %gs): %s skipped, next at %s",
                        took,
                        interval,
                        counted(missed, "planned round"),
                        at,
                    )
                else:
                    log.info(
                        "the round (%.1fs, started %.1fs after its slot) ended past the next one: next at %s",
                        took,
                        max(0.0, started - target),
                        at,
                    )
            planned = following
