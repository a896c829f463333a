"""Window figures from the store (they survive restarts), and a cache refreshed off the scrape path.

`window_figures` is the one path every surface takes to them: the /metrics window gauges (through
`WindowCache`), the status page and `tokwatch report`, each with the configuration's `WindowRule`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from tokwatch.config import EndpointSettings
from tokwatch.storage.base import Store, WindowStats
from tokwatch.window import (
    FleetComparison,
    FleetRanking,
    WindowFigures,
    WindowSnapshot,
    rank_fleet,
    window_label,
)
from tokwatch.window_rule import WindowRule

log = logging.getLogger(__name__)

DAY_S = 86400.0
WINDOW_S = DAY_S  # per-endpoint figures: last 24 h
FLEET_WINDOW_S = 7 * DAY_S  # fastest-vs-slowest comparison: last 7 days


def figures_from_stats(stats: WindowStats, window: str) -> WindowFigures:
    """Derive CV (stddev / mean, None below two samples) and uptime (ok / all runs) from store aggregates."""
    cv = None
    if stats.tps_samples >= 2 and stats.mean and stats.stddev is not None:
        cv = stats.stddev / stats.mean
    uptime = stats.ok_runs / stats.runs if stats.runs else None
    return WindowFigures(
        stats.endpoint,
        window,
        stats.runs,
        stats.ok_runs,
        stats.median,
        stats.stddev,
        cv,
        uptime,
        stats.disturbed_runs,
        stats.tps_set_aside,
    )


async def window_figures(
    store: Store,
    now: float,
    *,
    rule: WindowRule,
    window_s: float = WINDOW_S,
    endpoints: Sequence[str] | None = None,
) -> dict[str, WindowFigures]:
    """Per endpoint: median, sample stddev, CV of ok-run tok/s, uptime, runs and ok runs in the window, over
    the runs `rule` counts."""
    stats = await store.window_stats(now - window_s, now, rule=rule)
    label = window_label(window_s)
    wanted = set(endpoints) if endpoints is not None else None
    return {
        name: figures_from_stats(s, label)
        for name, s in sorted(stats.items())
        if wanted is None or name in wanted
    }


async def fleet_comparison(
    store: Store,
    now: float,
    *,
    rule: WindowRule,
    window_s: float = FLEET_WINDOW_S,
    endpoints: Sequence[str] | None = None,
) -> FleetComparison | None:
    """Seed 000's comparison strip: the 7-day median decides fastest and slowest."""
    ranking = await fleet_ranking(store, now, rule=rule, window_s=window_s, endpoints=endpoints)
    return ranking.extremes


async def fleet_ranking(
    store: Store,
    now: float,
    *,
    rule: WindowRule,
    window_s: float = FLEET_WINDOW_S,
    endpoints: Sequence[str] | None = None,
) -> FleetRanking:
    """Every endpoint with an ok run in the window, by median tok/s, fastest first."""
    figures = await window_figures(store, now, rule=rule, window_s=window_s, endpoints=endpoints)
    return rank_fleet({n: f.median for n, f in figures.items()}, window_label(window_s))


class WindowCache:
    """Holds the latest window figures; `run()` refreshes them every `refresh_interval_s` from the store."""

    def __init__(
        self,
        store: Store,
        *,
        rule: WindowRule,
        window_s: float = WINDOW_S,
        fleet_window_s: float = FLEET_WINDOW_S,
        refresh_interval_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._rule = rule
        self._window_s = window_s
        self._fleet_window_s = fleet_window_s
        self._interval = refresh_interval_s
        self._clock = clock
        self._endpoints: list[str] | None = None
        self._fleet: list[str] | None = None
        self._static: dict[str, dict[str, str]] = {}
        self._snapshot = WindowSnapshot()
        self._task: asyncio.Task[None] | None = None
        self.refresh_errors = 0

    def configure(
        self,
        endpoints: Sequence[EndpointSettings],
        fleet: Sequence[EndpointSettings] | None = None,
        rule: WindowRule | None = None,
    ) -> None:
        """Export only these endpoints, each with its static `labels:`; compare the `fleet` (default: the
        same endpoints; a sharded replica passes every endpoint of the fleet, read from the shared store);
        count the runs `rule` counts (default: unchanged). Applies from the next refresh."""
        if rule is not None:
            self._rule = rule
        self._endpoints = [e.name for e in endpoints]
        self._fleet = [e.name for e in fleet] if fleet is not None else None
        self._static = {e.name: dict(e.labels) for e in endpoints}

    def snapshot(self) -> WindowSnapshot:
        """The latest figures (no I/O)."""
        return self._snapshot

    async def refresh(self) -> bool:
        """Query the store now; on failure keep the previous figures and return False."""
        now = self._clock()
        try:
            figures = await window_figures(
                self._store, now, rule=self._rule, window_s=self._window_s, endpoints=self._endpoints
            )
            ranking = await fleet_ranking(
                self._store,
                now,
                rule=self._rule,
                window_s=self._fleet_window_s,
                endpoints=self._fleet if self._fleet is not None else self._endpoints,
            )
        except Exception as exc:
            self.refresh_errors += 1
            log.warning("storage: window figures not refreshed: %s", exc)
            return False
        self._snapshot = WindowSnapshot(figures, ranking.extremes, now, dict(self._static), ranking)
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
