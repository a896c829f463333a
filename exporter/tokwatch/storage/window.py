"""Window figures from the store (they survive restarts), and a cache refreshed off the scrape path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tokwatch.config import EndpointSettings
from tokwatch.storage.base import Store, WindowStats

log = logging.getLogger(__name__)

DAY_S = 86400.0
WINDOW_S = DAY_S  # per-endpoint figures: last 24 h
FLEET_WINDOW_S = 7 * DAY_S  # fastest-vs-slowest comparison: last 7 days
CV_TIGHT = 0.05
CV_TYPICAL = 0.15


def window_label(seconds: float) -> str:
    """Prometheus-style label for a window length: 86400 -> '24h', 604800 -> '7d'."""
    s = int(seconds)
    if s % 86400 == 0 and s >= 7 * 86400:
        return f"{s // 86400}d"
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def cv_band(cv: float | None) -> str | None:
    """Seed 000 bands: below 5 % tight, 5-15 % typical, above 15 % jittery."""
    if cv is None:
        return None
    if cv < CV_TIGHT:
        return "tight"
    if cv <= CV_TYPICAL:
        return "typical"
    return "jittery"


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One endpoint's figures over a window; tok/s figures come from `ok` runs only."""

    endpoint: str
    window: str
    runs: int
    ok_runs: int
    median: float | None
    stddev: float | None
    cv: float | None
    uptime: float | None

    @classmethod
    def from_stats(cls, stats: WindowStats, window: str) -> WindowFigures:
        """Derive CV (stddev / mean, None below two samples) and uptime (ok / all runs)."""
        cv = None
        if stats.tps_samples >= 2 and stats.mean and stats.stddev is not None:
            cv = stats.stddev / stats.mean
        uptime = stats.ok_runs / stats.runs if stats.runs else None
        return cls(stats.endpoint, window, stats.runs, stats.ok_runs, stats.median, stats.stddev, cv, uptime)

    @property
    def band(self) -> str | None:
        """tight / typical / jittery."""
        return cv_band(self.cv)


@dataclass(frozen=True, slots=True)
class FleetComparison:
    """Fastest vs slowest endpoint by median tok/s of `ok` runs over a (7-day) window."""

    fastest: str
    slowest: str
    fastest_median: float
    slowest_median: float
    window: str

    @property
    def ratio(self) -> float:
        """fastest median / slowest median (>= 1)."""
        return self.fastest_median / self.slowest_median

    @property
    def percent_faster(self) -> float:
        """How much faster the fastest is, in percent."""
        return (self.ratio - 1.0) * 100.0

    def text(self) -> str:
        """'X is N% faster than Y (7-day median tok/s)'."""
        return (
            f"{self.fastest} is {self.percent_faster:.0f}% faster than {self.slowest} "
            f"({self.window} median {self.fastest_median:.1f} vs {self.slowest_median:.1f} tok/s)"
        )


async def window_figures(
    store: Store, now: float, *, window_s: float = WINDOW_S, endpoints: Sequence[str] | None = None
) -> dict[str, WindowFigures]:
    """Per endpoint: median, sample stddev, CV of ok-run tok/s, uptime, runs and ok runs in the window."""
    stats = await store.window_stats(now - window_s, now)
    label = window_label(window_s)
    wanted = set(endpoints) if endpoints is not None else None
    return {
        name: WindowFigures.from_stats(s, label)
        for name, s in sorted(stats.items())
        if wanted is None or name in wanted
    }


def compare_fleet(medians: Mapping[str, float | None], window: str) -> FleetComparison | None:
    """Fastest vs slowest among endpoints with a positive median; None with fewer than two."""
    ranked = sorted((m, name) for name, m in medians.items() if m is not None and m > 0)
    if len(ranked) < 2:
        return None
    (slow_m, slow), (fast_m, fast) = ranked[0], ranked[-1]
    return FleetComparison(fast, slow, fast_m, slow_m, window)


async def fleet_comparison(
    store: Store, now: float, *, window_s: float = FLEET_WINDOW_S, endpoints: Sequence[str] | None = None
) -> FleetComparison | None:
    """Seed 000's comparison strip: the 7-day median decides fastest and slowest."""
    figures = await window_figures(store, now, window_s=window_s, endpoints=endpoints)
    return compare_fleet({n: f.median for n, f in figures.items()}, window_label(window_s))


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    """What the collector exports; replaced whole on every refresh."""

    figures: dict[str, WindowFigures] = field(default_factory=dict)
    fleet: FleetComparison | None = None
    refreshed_at: float | None = None
    static_labels: dict[str, dict[str, str]] = field(default_factory=dict)


class WindowCache:
    """Holds the latest window figures; `run()` refreshes them every `refresh_interval_s` from the store."""

    def __init__(
        self,
        store: Store,
        *,
        window_s: float = WINDOW_S,
        fleet_window_s: float = FLEET_WINDOW_S,
        refresh_interval_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._window_s = window_s
        self._fleet_window_s = fleet_window_s
        self._interval = refresh_interval_s
        self._clock = clock
        self._endpoints: list[str] | None = None
        self._static: dict[str, dict[str, str]] = {}
        self._snapshot = WindowSnapshot()
        self._task: asyncio.Task[None] | None = None
        self.refresh_errors = 0

    def configure(self, endpoints: Sequence[EndpointSettings]) -> None:
        """Export only these endpoints, each with its static `labels:`."""
        self._endpoints = [e.name for e in endpoints]
        self._static = {e.name: dict(e.labels) for e in endpoints}

    def snapshot(self) -> WindowSnapshot:
        """The latest figures (no I/O)."""
        return self._snapshot

    async def refresh(self) -> bool:
        """Query the store now; on failure keep the previous figures and return False."""
        now = self._clock()
        try:
            figures = await window_figures(
                self._store, now, window_s=self._window_s, endpoints=self._endpoints
            )
            fleet = await fleet_comparison(
                self._store, now, window_s=self._fleet_window_s, endpoints=self._endpoints
            )
        except Exception as exc:
            self.refresh_errors += 1
            log.warning("storage: window figures not refreshed: %s", exc)
            return False
        self._snapshot = WindowSnapshot(figures, fleet, now, dict(self._static))
        return True

    async def run(self) -> None:
        """Refresh forever, every `refresh_interval_s`."""
        while True:
            await self.refresh()
            await asyncio.sleep(self._interval)

    async def start(self) -> None:
        """Start the refresh task."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="tokwatch-window-cache")

    async def close(self) -> None:
        """Stop the refresh task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
