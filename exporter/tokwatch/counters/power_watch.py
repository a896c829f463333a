"""Each configured power source (`power_metrics_url`) sampled on the main loop, never on the measurement loop:
the energy of a timed run from the readings around it, and the idle baseline from the readings taken
while no probe of the endpoints it powers was running (docs/methodology.md, "Cost and energy").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from tokwatch.counters.power import PowerTrace, sample_power
from tokwatch.figures.stats import median
from tokwatch.settings.config import EndpointSettings
from tokwatch.settings.reach import Reach
from tokwatch.settings.redact import redact
from tokwatch.transport.http import HttpClient

log = logging.getLogger("tokwatch")

KEEP_S = 900.0  # readings kept for runs' energy: far longer than any timed run
IDLE_WINDOW_S = 600.0  # the idle baseline is the median power of the idle readings of this long
SETTLE_INTERVALS = 2  # readings this many intervals after a probe ends are not idle yet (power ramps down)


@dataclass(frozen=True, slots=True)
class RunEnergyReading:
    """A run's measured energy and the idle baseline stated beside it."""

    total_j: float
    idle_watts: float | None


class PowerWatch:
    """One power source: a sampler task, the readings of the last `KEEP_S`, the idle baseline."""

    def __init__(self, url: str, interval_s: float, reach: Reach | None = None) -> None:
        self.url, self.interval_s, self.reach = url, interval_s, reach
        self.trace = PowerTrace()
        self._busy = 0
        self._idle_after = 0.0  # monotonic time from which readings count as idle again
        self._idle: deque[tuple[float, float]] = deque()
        self._new_reading = asyncio.Event()

    @property
    def failures(self) -> int:
        """Scrapes that gave no reading."""
        return self.trace.failures

    @property
    def idle_watts(self) -> float | None:
        """The median power of the idle readings of the last `IDLE_WINDOW_S`; None before any."""
        return median([w for _, w in self._idle]) if self._idle else None

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Mark a probe of an endpoint this source powers as running: its readings are not idle."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            self._idle_after = time.monotonic() + SETTLE_INTERVALS * self.interval_s

    async def run(self, http: HttpClient) -> None:
        """Sample until cancelled."""
        once = asyncio.Event()
        once.set()  # sample_power with its stop set scrapes exactly once
        while True:
            sent = time.monotonic()
            before = (len(self.trace.samples), len(self.trace.energy))
            try:
                await sample_power(
                    http, self.url, self.interval_s, self.trace, once, timeout_s=self._timeout,
                    reach=self.reach,
                )  # fmt: skip
            except (OSError, ValueError) as exc:  # a route that cannot be built (a TLS file gone): try again
                self.trace.failures += 1
                log.warning("power source %s: %s", redact(self.url), redact(str(exc)))
            self._take_idle(sent, before)
            self._trim(time.monotonic() - KEEP_S)
            self._new_reading.set()
            self._new_reading = asyncio.Event()
            await asyncio.sleep(max(self.interval_s - (time.monotonic() - sent), 0.0))

    async def energy(self, t0: float, t1: float, wait_s: float) -> RunEnergyReading | None:
        """The energy between monotonic `t0` and `t1` once a reading after `t1` is in (waiting at most
        `wait_s` for it); None when the readings do not cover the interval."""
        deadline = time.monotonic() + wait_s
        while not self._covers(t1):
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new_reading.wait(), left)
        joules = self.trace.joules(t0, t1)
        return None if joules is None else RunEnergyReading(joules, self.idle_watts)

    @property
    def _timeout(self) -> float:
        return max(min(self.interval_s, 2.0), 0.5)

    def _covers(self, t: float) -> bool:
        last = [s[-1][0] for s in (self.trace.samples, self.trace.energy) if s]
        return bool(last) and max(last) >= t

    def _take_idle(self, sent: float, before: tuple[int, int]) -> None:
        """Keep the new reading's power as idle when no probe ran since the last one settled."""
        if self._busy or sent < self._idle_after:
            return
        samples, energy = self.trace.samples, self.trace.energy
        watts: float | None = None
        if len(samples) > before[0]:
            at, watts = samples[-1]
        elif len(energy) > before[1] and len(energy) >= 2 and before[1] >= 1:
            (ta, ea), (at, eb) = energy[-2], energy[-1]
            watts = (eb - ea) / (at - ta) if at > ta and eb >= ea else None
            # An energy-only reading spans the gap since the previous one: that must have been idle too.
            if ta < self._idle_after:
                watts = None
        if watts is not None:
            self._idle.append((at, watts))
        while self._idle and self._idle[0][0] < time.monotonic() - IDLE_WINDOW_S:
            self._idle.popleft()

    def _trim(self, before: float) -> None:
        for readings in (self.trace.samples, self.trace.energy):
            cut = next((i for i, (t, _) in enumerate(readings) if t >= before), len(readings))
            # One reading before the cut stays, so an interval starting right at it is still bracketed.
            del readings[: max(cut - 1, 0)]


class PowerWatches:
    """A `PowerWatch` per power URL of the enabled endpoints (endpoints on one server share it), started,
    kept and stopped as the config changes; a client of their own, on the main loop."""

    def __init__(self) -> None:
        self._http: HttpClient | None = None
        self._watches: dict[str, tuple[PowerWatch, asyncio.Task[None]]] = {}
        self._by_endpoint: dict[str, str] = {}

    def for_endpoint(self, name: str) -> PowerWatch | None:
        """The power source of an endpoint, or None."""
        url = self._by_endpoint.get(name)
        return self._watches[url][0] if url is not None and url in self._watches else None

    @property
    def by_endpoint(self) -> Mapping[str, PowerWatch]:
        """Every endpoint's power source."""
        return {name: w for name in self._by_endpoint if (w := self.for_endpoint(name)) is not None}

    async def sync(self, endpoints: Sequence[EndpointSettings]) -> None:
        """Sources for these endpoints' `power_metrics_url`s: new ones started, unused ones stopped."""
        wanted = {ep.name: ep for ep in endpoints if ep.enabled and ep.power_metrics_url}
        by_url: dict[str, EndpointSettings] = {}
        for ep in wanted.values():
            by_url.setdefault(str(ep.power_metrics_url), ep)
        if by_url and self._http is None:
            self._http = HttpClient()
            await self._http.__aenter__()
        for url in [u for u in self._watches if u not in by_url]:
            await self._stop(url)
        for url, ep in by_url.items():
            old = self._watches.get(url)
            if old is not None and old[0].interval_s == ep.power_scrape_interval:
                old[0].reach = Reach(ep.name, ep)
                continue
            if old is not None:
                await self._stop(url)
            watch = PowerWatch(url, ep.power_scrape_interval, Reach(ep.name, ep))
            assert self._http is not None
            task = asyncio.create_task(watch.run(self._http), name=f"tokwatch-power-{ep.name}")
            self._watches[url] = (watch, task)
        self._by_endpoint = {name: str(ep.power_metrics_url) for name, ep in wanted.items()}

    async def close(self) -> None:
        """Stop every sampler and close the client."""
        for url in list(self._watches):
            await self._stop(url)
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _stop(self, url: str) -> None:
        _, task = self._watches.pop(url)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
