"""Runs one probe for a target (an endpoint and a workload); a target already in flight is joined, never
probed twice at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from tokwatch.figures.result import RunResult
from tokwatch.probes.base import ProbeLog


@dataclass
class ProbeOutcome:
    """A finished probe: its result and its (redacted) log lines."""

    result: RunResult
    log: ProbeLog


class ProbeRunner:
    """Deduplicates concurrent requests for the same target and counts probes in flight."""

    def __init__(self) -> None:
        self._in_flight: dict[Hashable, asyncio.Future[ProbeOutcome]] = {}

    @property
    def in_flight(self) -> int:
        """Number of probes running now."""
        return len(self._in_flight)

    async def run(self, name: Hashable, probe: Callable[[], Awaitable[ProbeOutcome]]) -> ProbeOutcome:
        """Run `probe()` for target `name` now, or wait for the run already in flight for it (whatever
        started that one: its `probe` is the one that runs)."""
        task = self._in_flight.get(name)
        if task is None:
            task = asyncio.ensure_future(probe())
            self._in_flight[name] = task
            task.add_done_callback(lambda _t: self._in_flight.pop(name, None))
        # shield: a client that disconnects from /probe must not cancel a run others are waiting for
        return await asyncio.shield(task)

    async def cancel_all(self) -> None:
        """Cancel every probe in flight and wait for them to end (shutdown)."""
        tasks = list(self._in_flight.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
