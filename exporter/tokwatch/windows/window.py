"""Window figures: median, stddev and CV of ok-run tok/s, the prefill median, p50/p90/p99 of decode tok/s,
prefill tok/s and TTFT, uptime, and the fleet fastest-vs-slowest comparison, per series (endpoint x workload
x site, tokwatch.figures.series) and per configured window.

One set of types for both sources: the store (figures survive restarts, tokwatch.storage.window) and the
in-memory window used when storage is disabled (`MemoryWindows`). Both keep every run and count the ones the
window rule (tokwatch.windows.window_rule) takes when the figures are computed. Fleet rankings compare
endpoints
within one workload and site: a 10k-token prompt's figures never rank against a 100-token one's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from tokwatch.figures.result import RunResult
from tokwatch.figures.series import DEFAULT_WORKLOAD, NO_SITE, SeriesKey
from tokwatch.figures.stats import coefficient_of_variation, median, sample_stddev
from tokwatch.settings.config import EndpointSettings
from tokwatch.settings.setting_values import window_label
from tokwatch.windows.window_percentiles import NO_PERCENTILES, Percentiles
from tokwatch.windows.window_rule import WindowRule

CV_TIGHT = 0.05  # seed 000: below 5 % is tight (green)
CV_TYPICAL = 0.15  # 5-15 % typical for shared infrastructure (amber); above: jittery (red)


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
    """One series' figures over a window; tok/s figures come from `ok` runs only, the prefill median from
    those the prefix cache did not help (cache-assisted runs are counted apart)."""

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
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE
    prefill_median: float | None = None
    prefill_runs: int = 0  # runs giving the prefill median a sample
    cache_assisted_runs: int = 0
    prompt_size_missed_runs: int = 0
    decode_percentiles: Percentiles = NO_PERCENTILES  # of the tok/s samples
    prefill_percentiles: Percentiles = NO_PERCENTILES  # of the prefill samples
    ttft_percentiles: Percentiles = NO_PERCENTILES  # of the TTFT samples (tokwatch.windows.window_rule)

    @property
    def key(self) -> SeriesKey:
        """(endpoint, workload, site)."""
        return SeriesKey(self.endpoint, self.workload, self.site)

    @property
    def band(self) -> str | None:
        """tight / typical / jittery."""
        return cv_band(self.cv)


@dataclass(frozen=True, slots=True)
class Counted:
    """What a window counted of one series: runs, ok runs, flagged runs and the samples."""

    runs: int = 0
    ok_runs: int = 0
    tps: Sequence[float] = ()
    prefill: Sequence[float] = ()
    cache_assisted: int = 0
    prompt_size_missed: int = 0
    disturbed: int = 0  # runs with a client-timed figure set aside (timing_disturbed)
    tps_set_aside: int = 0  # ok runs whose tok/s was set aside
    ttft: Sequence[float] = ()


def figures_from_samples(key: SeriesKey, window: str, counted: Counted) -> WindowFigures:
    """Window figures from the run counts and the samples of one series."""
    ok_tps, runs = counted.tps, counted.runs
    return WindowFigures(
        endpoint=key.endpoint,
        window=window,
        runs=runs,
        ok_runs=counted.ok_runs,
        median=median(ok_tps) if ok_tps else None,
        stddev=sample_stddev(ok_tps) if len(ok_tps) >= 2 else None,
        cv=coefficient_of_variation(ok_tps),
        uptime=counted.ok_runs / runs if runs else None,
        workload=key.workload,
        site=key.site,
        prefill_median=median(counted.prefill) if counted.prefill else None,
        prefill_runs=len(counted.prefill),
        cache_assisted_runs=counted.cache_assisted,
        prompt_size_missed_runs=counted.prompt_size_missed,
        disturbed_runs=counted.disturbed,
        tps_set_aside=counted.tps_set_aside,
        decode_percentiles=Percentiles.of(ok_tps),
        prefill_percentiles=Percentiles.of(counted.prefill),
        ttft_percentiles=Percentiles.of(counted.ttft),
    )


@dataclass(frozen=True, slots=True)
class FleetComparison:
    """Fastest vs slowest endpoint by median tok/s of `ok` runs over a window (seed 000 comparison), within
    one workload and site."""

    fastest: str
    slowest: str
    fastest_median: float
    slowest_median: float
    window: str
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE

    @property
    def ratio(self) -> float:
        """fastest median / slowest median (>= 1)."""
        return self.fastest_median / self.slowest_median

    @property
    def percent_faster(self) -> float:
        """How much faster the fastest is, in percent."""
        return (self.ratio - 1.0) * 100.0

    def text(self) -> str:
        """'X is N% faster than Y (7d median ...)', the workload named unless it is seed000."""
        what = "" if self.workload == DEFAULT_WORKLOAD else f" {self.workload}"
        where = f" at {self.site}" if self.site else ""
        medians = f"{self.fastest_median:.1f} vs {self.slowest_median:.1f} tok/s"
        return (
            f"{self.fastest} is {self.percent_faster:.0f}% faster than {self.slowest} "
            f"({self.window}{what} median {medians}{where})"
        )


@dataclass(frozen=True, slots=True)
class FleetRanking:
    """Endpoints by median tok/s of ok runs over a window, fastest first (seed 000's comparison strip),
    within one workload and site."""

    ranked: tuple[tuple[str, float], ...]
    window: str
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE

    def neighbours(self) -> list[FleetComparison]:
        """'X is N % faster than Y' for each endpoint and the next slower one."""
        return [
            FleetComparison(a, b, ma, mb, self.window, self.workload, self.site)
            for (a, ma), (b, mb) in zip(self.ranked, self.ranked[1:], strict=False)
        ]

    @property
    def extremes(self) -> FleetComparison | None:
        """Fastest vs slowest; None with fewer than two ranked endpoints."""
        if len(self.ranked) < 2:
            return None
        (fast, fast_m), (slow, slow_m) = self.ranked[0], self.ranked[-1]
        return FleetComparison(fast, slow, fast_m, slow_m, self.window, self.workload, self.site)


def rank_fleet(
    medians: Mapping[str, float | None],
    window: str,
    workload: str = DEFAULT_WORKLOAD,
    site: str = NO_SITE,
) -> FleetRanking:
    """Endpoints with a positive median, fastest first (ties by name)."""
    positive = ((n, m) for n, m in medians.items() if m is not None and m > 0)
    ranked = sorted(positive, key=lambda x: (-x[1], x[0]))
    return FleetRanking(tuple(ranked), window, workload, site)


def compare_fleet(medians: Mapping[str, float | None], window: str) -> FleetComparison | None:
    """Fastest vs slowest among endpoints with a positive median; None with fewer than two."""
    return rank_fleet(medians, window).extremes


def rank_series(figures: Mapping[SeriesKey, WindowFigures], window: str) -> list[FleetRanking]:
    """One ranking per workload and site in `figures` (every endpoint with a positive median), in the
    order the workloads and sites first appear."""
    groups: dict[tuple[str, str], dict[str, float | None]] = {}
    for key, fig in figures.items():
        groups.setdefault((key.workload, key.site), {})[key.endpoint] = fig.median
    return [rank_fleet(medians, window, w, site) for (w, site), medians in groups.items()]


def primary_ranking(rankings: Sequence[FleetRanking], window: str) -> FleetRanking:
    """The ranking the single-ranking figures use: seed000's when there is one, else the first."""
    for r in rankings:
        if r.workload == DEFAULT_WORKLOAD:
            return r
    return rankings[0] if rankings else FleetRanking((), window)


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    """What the window collector exports; replaced whole on every refresh, read without I/O. `figures` are
    the primary window's (`schedule.window`), `windows` every configured window's by label, shortest
    first (the primary one among them); `ranking` and `fleet` are the primary workload's
    (`primary_ranking`), `rankings` every workload's."""

    figures: dict[SeriesKey, WindowFigures] = field(default_factory=dict)
    fleet: FleetComparison | None = None
    refreshed_at: float | None = None
    static_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    ranking: FleetRanking | None = None
    rankings: tuple[FleetRanking, ...] = ()
    windows: dict[str, dict[SeriesKey, WindowFigures]] = field(default_factory=dict)

    def by_window(self) -> dict[str, dict[SeriesKey, WindowFigures]]:
        """Every window's figures; a snapshot built with the primary window's alone gives that one."""
        if self.windows:
            return self.windows
        if not self.figures:
            return {}
        return {next(iter(self.figures.values())).window: self.figures}


def snapshot_of(
    figures: dict[SeriesKey, WindowFigures],
    rankings: Sequence[FleetRanking],
    window: str,
    now: float,
    static_labels: dict[str, dict[str, str]],
    windows: dict[str, dict[SeriesKey, WindowFigures]] | None = None,
) -> WindowSnapshot:
    """A snapshot with the primary ranking picked out of `rankings`."""
    primary = primary_ranking(rankings, window)
    return WindowSnapshot(
        figures, primary.extremes, now, static_labels, primary, tuple(rankings), dict(windows or {})
    )


def window_lengths(primary_s: float, others_s: Sequence[float]) -> tuple[float, ...]:
    """The windows figures are computed over: the primary one and the others, each once, shortest first."""
    return tuple(sorted({primary_s, *others_s}))


class KeptRun(NamedTuple):
    """What the in-memory window keeps of a run: what the window rule reads, named as the store's columns."""

    time: float
    status: str
    tokens_per_second: float | None
    triggered_by: str
    timing_disturbed: bool
    timing_source: str | None
    tps_set_aside: bool | None
    prefill_tokens_per_second: float | None = None
    cache_assisted: bool = False
    prompt_size_missed: bool = False
    set_aside: str | None = None  # the figures set aside, comma-separated, as stored
    ttft_s: float | None = None

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
            r.prefill_tokens_per_second,
            r.cache_assisted,
            r.prompt_size_missed,
            ",".join(r.set_aside) or None,
            r.ttft_s,
        )


class RunWindow:
    """The runs of one series inside a sliding time window (bounded: at most `max_runs`)."""

    def __init__(self, seconds: float, max_runs: int = 100_000) -> None:
        self.seconds = seconds
        self._runs: deque[KeptRun] = deque(maxlen=max_runs)

    def add(self, run: KeptRun) -> None:
        """Add one run, whether or not the window rule counts it (the rule applies when figures are read)."""
        self._runs.append(run)

    def figures(
        self, key: SeriesKey, now: float, rule: WindowRule, seconds: float | None = None
    ) -> WindowFigures:
        """Figures over the runs `rule` counts that started within `seconds` (at most the window's own,
        which is the default) before `now`."""
        while self._runs and self._runs[0].time < now - self.seconds:
            self._runs.popleft()
        span = self.seconds if seconds is None else min(seconds, self.seconds)
        counted = [r for r in self._runs if r.time >= now - span and rule.counts(r)]
        return figures_from_samples(
            key,
            window_label(span),
            Counted(
                runs=len(counted),
                ok_runs=sum(r.status == "ok" for r in counted),
                tps=[v for r in counted if (v := rule.sample(r)) is not None],
                prefill=[v for r in counted if (v := rule.prefill_sample(r)) is not None],
                cache_assisted=sum(r.cache_assisted for r in counted),
                prompt_size_missed=sum(r.prompt_size_missed for r in counted),
                disturbed=sum(r.timing_disturbed for r in counted),
                tps_set_aside=sum(rule.set_aside(r) for r in counted),
                ttft=[v for r in counted if (v := rule.ttft_sample(r)) is not None],
            ),
        )


class MemoryWindows:
    """Window figures kept in memory per series, for `storage: {enabled: false}` (lost on restart).

    A snapshot is computed on the first scrape after a run or a reload, else at most every `max_age_s` (as
    the windows slide), so scrapes between runs cost no sorting of every window's samples."""

    def __init__(self, max_age_s: float = 30.0) -> None:
        self._max_age_s = max_age_s
        self._cached: WindowSnapshot | None = None
        self._windows: dict[SeriesKey, RunWindow] = {}
        self._static: dict[str, dict[str, str]] = {}
        self._seconds = 86400.0
        self._lengths: tuple[float, ...] = (86400.0,)
        self._rule = WindowRule()

    def configure(
        self,
        endpoints: Sequence[EndpointSettings],
        seconds: float,
        rule: WindowRule,
        workloads: Mapping[str, Sequence[str]] | None = None,
        site: str = NO_SITE,
        windows: Sequence[float] = (),
    ) -> None:
        """Apply a (re)loaded config: the primary window `seconds` and the other `windows`, each endpoint's
        workloads (seed000 alone when not given); windows of series that stay keep their runs."""
        self._seconds = seconds
        self._lengths = window_lengths(seconds, windows)
        kept = self._lengths[-1]  # the longest window: the runs every shorter one reads
        if any(w.seconds != kept for w in self._windows.values()):
            self._windows = {}
        keys = [
            SeriesKey(e.name, w, site)
            for e in endpoints
            for w in (workloads.get(e.name, ()) if workloads is not None else (DEFAULT_WORKLOAD,))
        ]
        self._windows = {k: self._windows.get(k) or RunWindow(kept) for k in keys}
        self._static = {e.name: dict(e.labels) for e in endpoints}
        self._rule = rule
        self._cached = None

    def add(self, result: RunResult) -> None:
        """Account one timed run."""
        window = self._windows.get(result.series)
        if window is not None:
            window.add(KeptRun.of(result))
            self._cached = None

    def snapshot(self) -> WindowSnapshot:
        """Current figures for every series, and the fleet comparisons over the same window."""
        now = time.time()
        cached = self._cached
        if cached is not None and now - (cached.refreshed_at or 0.0) < self._max_age_s:
            return cached
        windows = {
            window_label(s): {key: w.figures(key, now, self._rule, s) for key, w in self._windows.items()}
            for s in self._lengths
        }
        label = window_label(self._seconds)
        figures = windows[label]
        rankings = rank_series(figures, label)
        self._cached = snapshot_of(figures, rankings, label, now, dict(self._static), windows)
        return self._cached
