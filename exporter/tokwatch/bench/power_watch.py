"""The power of the endpoint's devices around a benchmark run (docs/bench.md, "Cost and energy"): a sampler
of a DCGM exporter's or node_exporter's /metrics in a task of its own (never on a request's path), an idle
baseline measured before the load, and the run's joules from the trace afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from tokwatch.bench.config import BenchOptions
from tokwatch.counters.power import PowerTrace, sample_power
from tokwatch.figures.energy import joules_per_token, run_energy
from tokwatch.settings.config import load_config
from tokwatch.transport.http import HttpClient

# How long to wait for the first reading, in sampling intervals (at least FIRST_READING_MIN_S).
FIRST_READING_INTERVALS = 5
FIRST_READING_MIN_S = 5.0
FAILURES_BEFORE_GIVING_UP = 3


def power_url(opts: BenchOptions) -> str | None:
    """Where the run's power is read: --power-metrics-url, else the `--endpoint`'s `power_metrics_url` in
    its config; None: no energy figures."""
    if opts.power_metrics_url is not None or opts.endpoint is None or opts.config is None:
        return opts.power_metrics_url
    ep = load_config(opts.config).endpoint(opts.endpoint)
    return ep.power_metrics_url if ep is not None else None


class PowerSourceError(Exception):
    """The power URL gave no reading at all: the run is not started (a wrong URL is a usage error)."""


@dataclass(frozen=True, slots=True)
class EnergyMeasure:
    """A run's energy: measured over [start, end] of the `time.monotonic` clock, with the idle baseline."""

    url: str  # redacted
    interval_s: float
    idle_watts: float | None
    idle_baseline_s: float
    total_j: float | None
    duration_s: float
    method: str | None  # "energy_counter", "power_samples", or None when the trace did not cover the run
    readings: int
    failures: int

    def figures(self, output_tokens: int) -> dict[str, Any]:
        """summary.json `energy`: joules of the run, the idle baseline taken out, and joules per output
        token."""
        if self.total_j is None:
            energy, mean_watts = None, None
        else:
            energy = run_energy(self.total_j, self.idle_watts, self.duration_s)
            mean_watts = self.total_j / self.duration_s if self.duration_s > 0 else None
        return {
            "source": self.url,
            "sampling_interval_s": self.interval_s,
            "method": self.method,
            "readings": self.readings,
            "failures": self.failures,
            "idle_watts": self.idle_watts,
            "idle_baseline_s": self.idle_baseline_s,
            "duration_s": self.duration_s,
            "joules": self.total_j,
            "idle_joules": energy.idle_j if energy else None,
            "net_joules": energy.net_j if energy else None,
            "mean_watts": mean_watts,
            "output_tokens": output_tokens,
            "joules_per_output_token": joules_per_token(energy.net_j, output_tokens) if energy else None,
            "gross_joules_per_output_token": (
                joules_per_token(energy.total_j, output_tokens) if energy else None
            ),
        }


class PowerWatch:
    """Samples `url` every `interval_s` from `start()` to `finish()` into one trace."""

    def __init__(self, url: str, interval_s: float, idle_s: float, *, shown_url: str | None = None) -> None:
        self.url = url
        self.shown_url = shown_url if shown_url is not None else url
        self.interval_s = interval_s
        self.idle_s = idle_s
        self.trace = PowerTrace()
        self.idle_watts: float | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._http = HttpClient(limit=1, kernel_stamps=False)  # its own connection, apart from the requests'

    async def start(self) -> None:
        """Start sampling and, with an idle baseline asked for, measure it before returning (the load has not
        started). Raises PowerSourceError when no reading comes in time."""
        self._task = asyncio.create_task(
            sample_power(self._http, self.url, self.interval_s, self.trace, self._stop), name="bench-power"
        )
        wait_s = max(FIRST_READING_MIN_S, FIRST_READING_INTERVALS * self.interval_s)
        await self._readings_after(0.0, wait_s)
        if not self.trace.samples and not self.trace.energy:
            await self.finish()
            raise PowerSourceError(
                f"power_metrics_url {self.shown_url}: no DCGM or node_exporter power reading "
                f"({self.trace.failures} failed scrape(s))"
            )
        if self.idle_s > 0:
            t0 = time.monotonic()
            await asyncio.sleep(self.idle_s)
            t1 = time.monotonic()
            await self._readings_after(t1, wait_s)
            joules = self.trace.joules(t0, t1)
            self.idle_watts = joules / (t1 - t0) if joules is not None else None

    async def finish(self) -> None:
        """Stop sampling after one last reading (so the trace ends after the run), and close the client."""
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=self.interval_s + 5.0)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        await self._http.close()

    def measure(self, start: float, end: float) -> EnergyMeasure:
        """The energy over [start, end] (`time.monotonic`), once `finish()` has returned."""
        counter = self.trace.energy
        covered = bool(counter) and counter[0][0] <= start and counter[-1][0] >= end
        total = self.trace.joules(start, end)
        method = None if total is None else ("energy_counter" if covered else "power_samples")
        return EnergyMeasure(
            url=self.shown_url,
            interval_s=self.interval_s,
            idle_watts=self.idle_watts,
            idle_baseline_s=self.idle_s,
            total_j=total,
            duration_s=max(end - start, 0.0),
            method=method,
            readings=max(len(self.trace.samples), len(counter)),
            failures=self.trace.failures,
        )

    async def _readings_after(self, after: float, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for a reading stamped after `after`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._has_reading_after(after):
            if self._task is not None and self._task.done():
                return
            if self.trace.failures >= FAILURES_BEFORE_GIVING_UP and not self._has_reading_after(0.0):
                return  # a URL that never gave a reading: no point waiting out the deadline
            await asyncio.sleep(min(self.interval_s, 0.05))

    def _has_reading_after(self, after: float) -> bool:
        last = [series[-1][0] for series in (self.trace.samples, self.trace.energy) if series]
        return bool(last) and max(last) > after
