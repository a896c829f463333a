"""A power source sampled on its own (node_exporter's RAPL energy counter over real loopback HTTP): the idle
baseline from readings taken while no probe ran, a probe's own readings never idle, a run's energy from the
counter around it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from tests.support.waiting import wait_until
from tokwatch.counters.power_watch import PowerWatch
from tokwatch.transport.http import HttpClient


class Package:
    """A CPU package drawing `watts` (changed by the test), its energy counter exact at every read."""

    def __init__(self) -> None:
        self.watts, self._joules, self._since = 50.0, 1000.0, time.monotonic()

    def set(self, watts: float) -> None:
        now = time.monotonic()
        self._joules += self.watts * (now - self._since)
        self.watts, self._since = watts, now

    def joules(self) -> float:
        return self._joules + self.watts * (time.monotonic() - self._since)


@pytest.fixture
async def rapl(serve: Callable[..., Awaitable[str]]) -> tuple[str, Package]:
    package = Package()

    async def metrics(_: web.Request) -> web.Response:
        sample = f'node_rapl_package_joules_total{{index="0",path="x"}} {package.joules():.6f}\n'
        return web.Response(text=sample)

    return f"{await serve({'/metrics': metrics})}/metrics", package


async def test_the_idle_baseline_leaves_out_a_probes_readings(rapl: tuple[str, Package]) -> None:
    url, package = rapl
    watch = PowerWatch(url, 0.05)
    async with HttpClient() as http:
        task = asyncio.create_task(watch.run(http))
        try:
            # Energy-only readings: the power between two of them is the idle figure.
            await wait_until(lambda: len(watch.trace.energy) >= 6, 10.0, "six readings", interval=0.01)
            assert watch.idle_watts == pytest.approx(50.0, rel=0.05)
            with watch.busy():
                t0 = time.monotonic()
                package.set(200.0)  # the probe's load
                await asyncio.sleep(0.5)
                package.set(50.0)
                t1 = time.monotonic()
            reading = await watch.energy(t0, t1, wait_s=2.0)
            await asyncio.sleep(0.3)  # readings after the settle time are idle again
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert reading is not None
    # 200 W over the run: the counter interpolated at both ends between readings 50 ms apart.
    assert reading.total_j == pytest.approx(200.0 * (t1 - t0), rel=0.05)
    assert watch.idle_watts == pytest.approx(50.0, rel=0.05)  # the 200 W readings are not idle
    assert reading.idle_watts == pytest.approx(50.0, rel=0.05)
    assert watch.failures == 0
