"""A simulated server's GPU power, served as a DCGM exporter would serve it, with its exact energy as truth.

Power follows the engines' running requests: each GPU draws `idle_watts`, plus `watts_per_running` for every
running request up to `max_watts` in all. The energy counter is the exact integral of that piecewise-constant
power, so a client's integral over an interval can be checked against `energy_j()` (the truth).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tokwatch.sim.config import GpuPowerSettings
from tokwatch.sim.truth import RequestTruth

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PowerMeter:
    """The power of one simulated server's GPUs; an engine observer (it watches the running requests)."""

    def __init__(self, settings: GpuPowerSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._running: dict[int, int] = {}
        self._since = clock()
        self._energy_j = 0.0
        self._watts = self._power(0)

    @property
    def watts(self) -> float:
        """All GPUs' power now."""
        return self._watts

    def energy_j(self) -> float:
        """All GPUs' energy since the meter started, in joules: the truth a client's figure is held to."""
        return self._energy_j + self._watts * (self._clock() - self._since)

    def on_state(self, engine: int, running: int, waiting: int, kv_used: int) -> None:
        """The running requests changed: close the interval at the old power, then draw the new one."""
        now = self._clock()
        self._energy_j += self._watts * (now - self._since)
        self._since = now
        self._running[engine] = running
        self._watts = self._power(sum(self._running.values()))

    def on_scheduled(self, engine: int, rec: RequestTruth) -> None:
        """Power follows on_state alone."""

    def on_token(self, engine: int, rec: RequestTruth, running: int, gap: float | None) -> None:
        """Power follows on_state alone."""

    def on_preempted(self, engine: int, rec: RequestTruth) -> None:
        """Power follows on_state alone."""

    def on_finished(self, engine: int, rec: RequestTruth) -> None:
        """Power follows on_state alone."""

    def render(self) -> bytes:
        """The DCGM exporter's two power families, one series per GPU (power and energy split evenly)."""
        s = self.settings
        watts, energy_mj = self._watts / s.gpus, self.energy_j() * 1000.0 / s.gpus
        lines = [
            "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).",
            "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
            *(f"DCGM_FI_DEV_POWER_USAGE{{{_labels(i, s.model_name)}}} {watts:.6f}" for i in range(s.gpus)),
            "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).",
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
            *(
                f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{_labels(i, s.model_name)}}} {energy_mj:.3f}"
                for i in range(s.gpus)
            ),
        ]
        return ("\n".join(lines) + "\n").encode()

    def _power(self, running: int) -> float:
        s = self.settings
        return min(s.gpus * s.idle_watts + running * s.watts_per_running, s.gpus * s.max_watts)


def _labels(gpu: int, model_name: str) -> str:
    return (
        f'gpu="{gpu}",UUID="GPU-sim-{gpu:04d}",device="nvidia{gpu}",modelName="{model_name}",Hostname="sim"'
    )
