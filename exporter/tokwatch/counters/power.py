"""GPU and node power from a DCGM exporter's or node_exporter's /metrics (docs/methodology.md, "Cost and
energy").

DCGM exporter: `DCGM_FI_DEV_POWER_USAGE` (watts, a gauge per GPU) and `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`
(millijoules since the driver loaded, a counter per GPU). node_exporter: `node_rapl_package_joules_total`
(joules, a counter per CPU package). An energy counter read before and after an interval is exact whatever
the exporter's sampling period; power gauges are integrated between samples.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from tokwatch.counters.parse import MetricsParseError, MetricsSnapshot, parse_metrics
from tokwatch.figures.energy import PowerSample, counter_energy, integrate_power
from tokwatch.transport.http import HttpClient, HttpStatusError, TransportError
from tokwatch.transport.http_route import RouteSource

DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"
DCGM_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
NODE_RAPL_ENERGY = "node_rapl_package_joules_total"


@dataclass(frozen=True, slots=True)
class PowerReading:
    """One scrape of a power source: the summed power of its devices and their summed energy counter."""

    watts: float | None  # the devices' power now, summed
    energy_j: float | None  # their energy counters, summed, in joules
    devices: int  # how many devices the figures sum (GPUs, or CPU packages)


def read_power(snap: MetricsSnapshot, gpus: frozenset[str] | None = None) -> PowerReading | None:
    """The power figures of one /metrics snapshot, over the GPUs named in `gpus` (their `gpu` label; all when
    None). None when the snapshot has neither DCGM's nor node_exporter's figures."""
    # A counter family whose samples lack `_total` is read back with it (prometheus_client's text parser).
    energy_name = next((n for n in (DCGM_ENERGY, DCGM_ENERGY + "_total") if snap.has(n)), None)
    if snap.has(DCGM_POWER) or energy_name is not None:
        power = _pick(snap, DCGM_POWER, gpus)
        energy = _pick(snap, energy_name, gpus) if energy_name is not None else []
        devices = max(len(power), len(energy))
        return PowerReading(
            watts=sum(power) if power else None,
            energy_j=sum(energy) / 1000.0 if energy else None,  # DCGM counts millijoules
            devices=devices,
        )
    if snap.has(NODE_RAPL_ENERGY):
        packages = [s.value for s in snap.select(NODE_RAPL_ENERGY)]
        return PowerReading(watts=None, energy_j=sum(packages), devices=len(packages))
    return None


@dataclass
class PowerTrace:
    """What a sampler saw over an interval, on the `time.monotonic` clock: (time, watts) power samples and
    (time, joules) energy-counter readings."""

    samples: list[PowerSample] = field(default_factory=list)
    energy: list[tuple[float, float]] = field(default_factory=list)
    failures: int = 0

    def joules(self, t0: float, t1: float) -> float | None:
        """Energy over [t0, t1]: the energy counter interpolated at both ends when its readings bracket the
        interval (exact to the power's change within one sampling gap), else the power samples' integral;
        None when neither covers it or the counter went back."""
        e0, e1 = _at(self.energy, t0), _at(self.energy, t1)
        if e0 is not None and e1 is not None:
            return counter_energy(e0, e1)
        return integrate_power(self.samples, t0, t1)

    def add(self, at: float, reading: PowerReading) -> None:
        """Keep one reading taken at `at`."""
        if reading.watts is not None:
            self.samples.append((at, reading.watts))
        if reading.energy_j is not None:
            self.energy.append((at, reading.energy_j))


def _at(readings: list[tuple[float, float]], t: float) -> float | None:
    """A cumulative counter's value at `t`, linear between the readings around it; None outside them."""
    for (ta, ea), (tb, eb) in itertools.pairwise(readings):
        if ta <= t <= tb:
            return ea if tb == ta else ea + (eb - ea) * (t - ta) / (tb - ta)
    return None


async def sample_power(
    http: HttpClient,
    url: str,
    interval_s: float,
    trace: PowerTrace,
    stop: asyncio.Event,
    *,
    timeout_s: float = 2.0,
    max_bytes: int = 1024 * 1024,
    reach: RouteSource | None = None,
) -> None:
    """Scrape `url` every `interval_s` into `trace` until `stop` is set, then once more (so the trace ends
    after the interval it measures). Each reading is stamped halfway between sending and receiving."""
    while True:
        last = stop.is_set()
        sent = time.monotonic()
        try:
            text = await http.get_text(url, timeout=timeout_s, max_bytes=max_bytes, reach=reach)
            reading = read_power(parse_metrics(text, max_chars=max_bytes))
        except (TransportError, HttpStatusError, MetricsParseError):
            reading = None
        if reading is None:
            trace.failures += 1
        else:
            trace.add((sent + time.monotonic()) / 2.0, reading)
        if last:
            return
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass


def _pick(snap: MetricsSnapshot, name: str, gpus: frozenset[str] | None) -> list[float]:
    return [s.value for s in snap.select(name) if gpus is None or s.labels.get("gpu") in gpus]
