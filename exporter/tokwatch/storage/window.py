"""Window figures from the store (they survive restarts), and a cache refreshed off the scrape path.

`window_figures` is the one path every surface takes to them: the /metrics window gauges (through
`WindowCache`), the status page and `tokwatch report`, each with the configuration's `WindowRule`. Figures
are per series (endpoint x workload x site); /metrics takes its own site's, the page and the report every
site's, side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from tokwatch.figures.series import SeriesKey
from tokwatch.settings.config import EndpointSettings
from tokwatch.storage.base import RunStore, WindowStats
from tokwatch.windows.window import (
    FleetComparison,
    FleetRanking,
    WindowFigures,
    WindowSnapshot,
    primary_ranking,
    rank_series,
    snapshot_of,
    window_label,
    window_lengths,
)
from tokwatch.windows.window_rule import WindowRule

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
        workload=stats.workload,
        site=stats.site,
        prefill_median=stats.prefill_median,
        prefill_runs=stats.prefill_samples,
        cache_assisted_runs=stats.cache_assisted,
        prompt_size_missed_runs=stats.prompt_size_missed,
        decode_percentiles=stats.tps_percentiles,
        prefill_percentiles=stats.prefill_percentiles,
        ttft_percentiles=stats.ttft_percentiles,
    )


async def window_figures(
    store: RunStore,
    now: float,
    *,
    rule: WindowRule,
    window_s: float = WINDOW_S,
    endpoints: Sequence[str] | None = None,
    site: str | None = None,
) -> dict[SeriesKey, WindowFigures]:
    """Per series (of `endpoints` and `site` where given), sorted: median, sample stddev, CV of ok-run tok/s,
    the prefill median, uptime, runs and ok runs in the window, over the runs `rule` counts."""
    stats = await store.window_stats(now - window_s, now, rule=rule, site=site)
    label = window_label(window_s)
    wanted = set(endpoints) if endpoints is not None else None
    return {
        key: figures_from_stats(s, label)
        for key, s in sorted(stats.items())
        if wanted is None or key.endpoint in wanted
    }


async def fleet_comparison(
    store: RunStore,
    now: float,
    *,
    rule: WindowRule,
    window_s: float = FLEET_WINDOW_S,
    endpoints: Sequence[str] | None = None,
    site: str | None = None,
) -> FleetComparison | None:
    """Seed 000's comparison strip: the 7-day median decides fastest and slowest (the primary workload's)."""
    rankings = await fleet_rankings(store, now, rule=rule, window_s=window_s, endpoints=endpoints, site=site)
    return primary_ranking(rankings, window_label(window_s)).extremes


async def fleet_rankings(
    store: RunStore,
    now: float,
    *,
    rule: WindowRule,
    window_s: float = FLEET_WINDOW_S,
    endpoints: Sequence[str] | None = None,
    site: str | None = None,
) -> list[FleetRanking]:
    """Per workload and site: every endpoint with an ok run in the window, by median tok/s, fastest first."""
    figures = await window_figures(store, now, rule=rule, window_s=window_s, endpoints=endpoints, site=site)
    return rank_series(figures, window_label(window_s))


class WindowCache:
    """Holds the latest window figures; `run()` refreshes them every `refresh_interval_s` from the store."""

    def __init__(
        self,
        store: RunStore,
        *,
        rule: WindowRule,
        window_s: float = WINDOW_S,
        windows_s: Sequence[float] = (),
        fleet_window_s: float = FLEET_WINDOW_S,
        refresh_interval_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._rule = rule
        self._window_s = window_s
        self._windows_s = window_lengths(window_s, windows_s)
        self._fleet_window_s = fleet_window_s
        self._interval = refresh_interval_s
        self._clock = clock
        self._endpoints: list[str] | None = None
        self._fleet: list[str] | None = None
        self._site: str | None = None
        self._static: dict[str, dict[str, str]] = {}
        self._snapshot = WindowSnapshot()
        self._task: asyncio.Task[None] | None = None
        self.refresh_errors = 0

    def configure(
        self,
        endpoints: Sequence[EndpointSettings],
        fleet: Sequence[EndpointSettings] | None = None,
        rule: WindowRule | None = None,
        site: str | None = None,
        window_s: float | None = None,
        windows_s: Sequence[float] | None = None,
    ) -> None:
        """Export only these endpoints, each with its static `labels:`, and only runs from this exporter's
        `site` (None: unchanged; "" for an exporter without one); compare the `fleet` (default: the same
        endpoints; a sharded replica passes every endpoint of the fleet, read from the shared store);
        count the runs `rule` counts and figure the primary window `window_s` and the other `windows_s`
        (None: unchanged). Applies from the next refresh."""
        if rule is not None:
            self._rule = rule
        if window_s is not None or windows_s is not None:
            self._window_s = self._window_s if window_s is None else window_s
            others = self._windows_s if windows_s is None else windows_s
            self._windows_s = window_lengths(self._window_s, others)
        if site is not None:
            self._site = site
        self._endpoints = [e.name for e in endpoints]
        self._fleet = [e.name for e in fleet] if fleet is not None else None
        self._static = {e.name: dict(e.labels) for e in endpoints}

    def snapshot(self) -> WindowSnapshot:
        """The latest figures (no I/O)."""
        return self._snapshot

    async def refresh(self) -> bool:
        """Query the store now; on failure keep the previous figures and return False."""
        now = self._clock()
        # One query per window length: the fleet's comparison window is usually one of the windows too.
        lengths = sorted({*self._windows_s, self._fleet_window_s})
        try:
            every = [
                await window_figures(self._store, now, rule=self._rule, window_s=s, site=self._site)
                for s in lengths
            ]
        except Exception as exc:
            self.refresh_errors += 1
            log.warning("storage: window figures not refreshed: %s", exc)
            return False
        by_length = dict(zip(lengths, every, strict=True))
        exported = set(self._endpoints) if self._endpoints is not None else None
        compared = set(self._fleet) if self._fleet is not None else exported
        windows = {window_label(s): _only(by_length[s], exported) for s in self._windows_s}
        label = window_label(self._fleet_window_s)
        rankings = rank_series(_only(by_length[self._fleet_window_s], compared), label)
        figures = windows[window_label(self._window_s)]
        self._snapshot = snapshot_of(figures, rankings, label, now, dict(self._static), windows)
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


def _only(
    figures: dict[SeriesKey, WindowFigures], endpoints: set[str] | None
) -> dict[SeriesKey, WindowFigures]:
    """The figures of these endpoints' series (all when None)."""
    if endpoints is None:
        return figures
    return {k: f for k, f in figures.items() if k.endpoint in endpoints}
