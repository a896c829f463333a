"""Window figures: median, stddev and CV of ok-run tok/s, uptime, and the fleet fastest-vs-slowest comparison.

One set of types for both sources: the store (figures survive restarts, tokwatch.storage.window) and the
in-memory window used when storage is disabled (`MemoryWindows`). Both keep every run and count the ones the
window rule (tokwatch.window_rule) takes when the figures are computed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from tokwatch.config import EndpointSettings
from tokwatch.result import RunResult
from tokwatch.stats import coefficient_of_variation, median, sample_stddev
from tokwatch.window_rule import WindowRule

CV_TIGHT = 0.05  # seed 000: below 5 % is tight (green)
CV_TYPICAL = 0.15  # 5-15 % typical for shared infrastructure (amber); above: jittery (red)


def window_label(seconds: float) -> str:
    """Prometheus-style label for a window length: 86400 -> '24h', 604800 -> '7d'."""
    s = int(seconds)
    if s >= 7 * 86400 and s % 86400 == 0:
        return f"{s // 86400}d"
    if s >= 3600 and s % 3600 == 0:
        return f"{s // 3600}h"
    if s >= 60 and s % 60 == 0:
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
    disturbed_runs: int = 0  # runs with a client-timed figure set aside (timing_disturbed)
    tps_set_aside: int = 0  # ok runs whose tok/s was set aside, so not a sample of the median, CV, stddev

    @property
    def band(self) -> str | None:
        """tight / typical / jittery."""
        return cv_band(self.cv)


def figures_from_samples(
    endpoint: str,
    window: str,
    runs: int,
    ok_runs: int,
    ok_tps: Sequence[float],
    disturbed_runs: int = 0,
    tps_set_aside: int = 0,
) -> WindowFigures:
    """Window figures from the run counts and the tok/s samples of the ok runs."""
    return WindowFigures(
        endpoint=endpoint,
        window=window,
        runs=runs,
        ok_runs=ok_runs,
        median=median(ok_tps) if ok_tps else None,
        stddev=sample_stddev(ok_tps) if len(ok_tps) >= 2 else None,
        cv=coefficient_of_variation(ok_tps),
        uptime=ok_runs / runs if runs else None,
        disturbed_runs=disturbed_runs,
        tps_set_aside=tps_set_aside,
    )


@dataclass(frozen=True, slots=True)
class FleetComparison:
    """Fastest vs slowest endpoint by median tok/s of `ok` runs over a window (seed 000 comparison)."""

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
        """'X is N% faster than Y (7d median ...)'."""
        return (
            f"{self.fastest} is {self.percent_faster:.0f}% faster than {self.slowest} "
            f"({self.window} median {self.fastest_median:.1f} vs {self.slowest_median:.1f} tok/s)"
        )


@dataclass(frozen=True, slots=True)
class FleetRanking:
    """Endpoints by median tok/s of ok runs over a window, fastest first (seed 000's comparison strip)."""

    ranked: tuple[tuple[str, float], ...]
    window: str

    def neighbours(self) -> list[FleetComparison]:
        """'X is N % faster than Y' for each endpoint and the next slower one."""
        return [
            FleetComparison(a, b, ma, mb, self.window)
            for (a, ma), (b, mb) in zip(self.ranked, self.ranked[1:], strict=False)
        ]

    @property
    def extremes(self) -> FleetComparison | None:
        """Fastest vs slowest; None with fewer than two ranked endpoints."""
        if len(self.ranked) < 2:
            return None
        (fast, fast_m), (slow, slow_m) = self.ranked[0], self.ranked[-1]
        return FleetComparison(fast, slow, fast_m, slow_m, self.window)


def rank_fleet(medians: Mapping[str, float | None], window: str) -> FleetRanking:
    """Endpoints with a positive median, fastest first (ties by name)."""
    positive = ((n, m) for n, m in medians.items() if m is not None and m > 0)
    ranked = sorted(positive, key=lambda x: (-x[1], x[0]))
    return FleetRanking(tuple(ranked), window)


def compare_fleet(medians: Mapping[str, float | None], window: str) -> FleetComparison | None:
    """Fastest vs slowest among endpoints with a positive median; None with fewer than two."""
    return rank_fleet(medians, window).extremes


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    """What the window collector exports; replaced whole on every refresh, read without I/O."""

    figures: dict[str, WindowFigures] = field(default_factory=dict)
    fleet: FleetComparison | None = None
    refreshed_at: float | None = None
    static_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    ranking: FleetRanking | None = None


class KeptRun(NamedTuple):
    """What the in-memory window keeps of a run: what the window rule reads, named as the store's columns."""

    time: float
    status: str
    tokens_per_second: float | None
    triggered_by: str
    timing_disturbed: bool
    timing_source: str | None
    tps_set_aside: bool | None

    @classmethod
    def of(cls, r: RunResult) -> KeptRun:
        """The kept fields of one timed run."""
        source = str(r.source) if r.source is not None else None
        return cls(
            r.started_at,
            str(r.status),
            r.tokens_per_second,
            r.trigger,
            r.timing_disturbed,
            source,
            r.tps_set_aside,
        )


class RunWindow:
    """The runs of one endpoint inside a sliding time window (bounded: at most `max_runs`)."""

    def __init__(self, seconds: float, max_runs: int = 100_000) -> None:
        self.seconds = seconds
        self._runs: deque[KeptRun] = deque(maxlen=max_runs)

    def add(self, run: KeptRun) -> None:
        """Add one run, whether or not the window rule counts it (the rule applies when figures are read)."""
        self._runs.append(run)

    def figures(self, endpoint: str, now: float, rule: WindowRule) -> WindowFigures:
        """Figures over the runs `rule` counts that started within `seconds` before `now`."""
        cutoff = now - self.seconds
        while self._runs and self._runs[0].time < cutoff:
            self._runs.popleft()
        counted = [r for r in self._runs if rule.counts(r)]
        ok_runs = sum(r.status == "ok" for r in counted)
        tps = [v for r in counted if (v := rule.sample(r)) is not None]
        disturbed = sum(r.timing_disturbed for r in counted)
        set_aside = sum(rule.set_aside(r) for r in counted)
        label = window_label(self.seconds)
        return figures_from_samples(endpoint, label, len(counted), ok_runs, tps, disturbed, set_aside)


class MemoryWindows:
    """Window figures kept in memory per endpoint, for `storage: {enabled: false}` (lost on restart)."""

    def __init__(self) -> None:
        self._windows: dict[str, RunWindow] = {}
        self._static: dict[str, dict[str, str]] = {}
        self._seconds = 86400.0
        self._rule = WindowRule()

    def configure(self, endpoints: Sequence[EndpointSettings], seconds: float, rule: WindowRule) -> None:
        """Apply a (re)loaded config; windows of endpoints that stay keep their runs."""
        if seconds != self._seconds:
            self._windows, self._seconds = {}, seconds
        self._windows = {e.name: self._windows.get(e.name) or RunWindow(seconds) for e in endpoints}
        self._static = {e.name: dict(e.labels) for e in endpoints}
        self._rule = rule

    def add(self, result: RunResult) -> None:
        """Account one timed run."""
        window = self._windows.get(result.endpoint)
        if window is not None:
            window.add(KeptRun.of(result))

    def snapshot(self) -> WindowSnapshot:
        """Current figures for every endpoint, and the fleet comparison over the same window."""
        now = time.time()
        figures = {name: w.figures(name, now, self._rule) for name, w in self._windows.items()}
        ranking = rank_fleet({n: f.median for n, f in figures.items()}, window_label(self._seconds))
        return WindowSnapshot(figures, ranking.extremes, now, dict(self._static), ranking)
