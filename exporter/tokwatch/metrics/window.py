"""Window and fleet figures: the `tokwatch_window_*` and `tokwatch_fleet_*` gauges, read from a snapshot.

The snapshot comes from the store's window cache or the in-memory window (tokwatch.windows.window);
collecting it
does no I/O. Every figure is one series' (endpoint x workload, and the exporter's site) over one configured
window: `workload`, `window` and (when configured) `site` labels; percentiles add `percentile` (50, 90,
99). Names, types and labels are the contract in docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokwatch.figures.series import SeriesKey

if TYPE_CHECKING:
    from tokwatch.windows.window import WindowFigures, WindowSnapshot
    from tokwatch.windows.window_percentiles import Percentiles

_FLEET = "__fleet__"  # the window collector's part that is not an endpoint

# The window's run breakdown (runs set aside, cache-assisted, prompt size missed): with `metrics.diagnostics`
# only; the probe counters of the same names (`increase(...[24h])`) and the API carry them otherwise.
DIAGNOSTIC_FAMILIES = frozenset(
    {
        "tokwatch_window_timing_disturbed_runs",
        "tokwatch_window_decode_tokens_per_second_set_aside_runs",
        "tokwatch_window_cache_assisted_runs",
        "tokwatch_window_prompt_size_missed_runs",
    }
)

_WINDOW_FAMILIES = (
    ("tokwatch_window_decode_tokens_per_second_median", "Median tok/s of ok runs in the window.", "median"),
    ("tokwatch_window_decode_tokens_per_second_stddev", "Sample stddev of ok-run tok/s.", "stddev"),
    ("tokwatch_window_decode_tokens_per_second_cv_ratio", "Coefficient of variation (stddev / mean).", "cv"),
    ("tokwatch_window_uptime_ratio", "ok runs / all runs in the window.", "uptime"),
    ("tokwatch_window_runs", "Runs in the window.", "runs"),
    ("tokwatch_window_ok_runs", "ok runs in the window.", "ok_runs"),
    (
        "tokwatch_window_timing_disturbed_runs",
        "Runs in the window with a client-timed figure set aside (the exporter ran late).",
        "disturbed_runs",
    ),
    (
        "tokwatch_window_decode_tokens_per_second_set_aside_runs",
        "ok runs in the window whose tok/s was set aside, so not in the median, stddev and CV.",
        "tps_set_aside",
    ),
    (
        "tokwatch_window_prefill_tokens_per_second_median",
        "Median prefill tok/s of ok runs in the window, cache-assisted runs left out.",
        "prefill_median",
    ),
    (
        "tokwatch_window_cache_assisted_runs",
        "Runs in the window the prefix cache served beyond the chat template's preamble.",
        "cache_assisted_runs",
    ),
    (
        "tokwatch_window_prompt_size_missed_runs",
        "Runs in the window whose prompt the server counted off the workload's size.",
        "prompt_size_missed_runs",
    ),
    ("tokwatch_window_decode_samples", "tok/s samples the decode percentiles are taken over.", "decode"),
    ("tokwatch_window_prefill_samples", "Samples the prefill median and percentiles take.", "prefill"),
    ("tokwatch_window_ttft_samples", "TTFT samples the TTFT percentiles are taken over.", "ttft"),
)
# Percentile families: (name, help, WindowFigures attribute holding the Percentiles).
_PERCENTILE_FAMILIES = (
    (
        "tokwatch_window_decode_percentile_tokens_per_second",
        "Percentile of ok-run tok/s in the window (shown from a minimum sample count).",
        "decode_percentiles",
    ),
    (
        "tokwatch_window_prefill_percentile_tokens_per_second",
        "Percentile of prefill tok/s in the window, cache-assisted runs left out.",
        "prefill_percentiles",
    ),
    (
        "tokwatch_window_ttft_percentile_seconds",
        "Percentile of TTFT in the window (ok runs, cache-assisted runs left out).",
        "ttft_percentiles",
    ),
)


class WindowCollector(Collector):
    """`tokwatch_window_*` per endpoint and the fleet figures, from the store cache or the memory window.

    One part per series and one for the fleet (exported by one replica of a sharded fleet); fleet figures
    rank endpoints within each workload. Sample::

        tokwatch_window_decode_tokens_per_second_median{endpoint="a",gpu="3090",workload="seed000",window="24h"} 100
        tokwatch_window_decode_tokens_per_second_cv_ratio{endpoint="a",gpu="3090",workload="seed000",window="24h"} 0.04
        tokwatch_window_prefill_tokens_per_second_median{endpoint="a",gpu="3090",workload="long",window="24h"} 2150
        tokwatch_window_uptime_ratio{endpoint="a",gpu="3090",workload="seed000",window="24h"} 1.0
        tokwatch_window_runs{endpoint="a",gpu="3090",workload="seed000",window="24h"} 3.0
        tokwatch_window_timing_disturbed_runs{endpoint="a",gpu="3090",workload="seed000",window="24h"} 1.0
        tokwatch_window_decode_tokens_per_second_set_aside_runs{endpoint="a",gpu="3090",workload="seed000",window="24h"} 0.0
        tokwatch_window_ttft_percentile_seconds{endpoint="a",gpu="3090",percentile="90",workload="long",window="72h"} 1.9
        tokwatch_window_ttft_samples{endpoint="a",gpu="3090",workload="long",window="72h"} 24.0
        tokwatch_fleet_fastest_vs_slowest_ratio{workload="seed000",window="7d"} 1.818
        tokwatch_fleet_median_tokens_per_second{endpoint="a",workload="seed000",window="7d"} 100.0
        tokwatch_fleet_rank{endpoint="a",workload="seed000",window="7d"} 1.0
        tokwatch_fleet_faster_than_next_ratio{endpoint="a",workload="seed000",window="7d"} 1.818
    """  # noqa: E501

    def __init__(
        self,
        snapshot: Callable[[], WindowSnapshot],
        *,
        export_fleet: bool | Callable[[], bool] = True,
        windows: Collection[str] | None = None,
        diagnostics: bool = False,
    ) -> None:
        self._snapshot = snapshot
        self.select(windows, diagnostics)
        # One replica of a sharded fleet exports the fleet figures, the others do not; which one can change
        # while running (a replica takes over while a lower one is down), hence a callable.
        if callable(export_fleet):
            self._export_fleet = export_fleet
        else:
            always = bool(export_fleet)
            self._export_fleet = lambda: always
        self._parts_snapshot: WindowSnapshot | None = None  # the one `parts()` saw, for `collect_part`
        self._parts_static: tuple[str, ...] | None = None

    def select(self, windows: Collection[str] | None, diagnostics: bool = False) -> None:
        """Export the window figures of these windows only (by label; None: every window of the snapshot),
        and the run-breakdown families with `diagnostics` (config `metrics:`)."""
        self._windows = None if windows is None else frozenset(windows)
        self._families = tuple(f for f in _WINDOW_FAMILIES if diagnostics or f[0] not in DIAGNOSTIC_FAMILIES)
        self._selection = (None if windows is None else tuple(sorted(windows)), diagnostics)

    def describe(self) -> Iterable[Metric]:
        """Families depend on config; nothing up front."""
        return []

    def _by_window(self, snap: WindowSnapshot) -> dict[str, dict[SeriesKey, WindowFigures]]:
        """The snapshot's figures of the exported windows."""
        every = snap.by_window()
        return every if self._windows is None else {w: f for w, f in every.items() if w in self._windows}

    def parts(self) -> Iterator[tuple[Hashable, Hashable]]:
        """One part per endpoint, revised when its figures change, and one for the fleet comparison."""
        snap = self._parts_snapshot = self._snapshot()
        static = self._parts_static = _static_names(snap)
        for key, figs in _per_series(self._by_window(snap)).items():
            labels = tuple(sorted(snap.static_labels.get(key.endpoint, {}).items()))
            yield key, (figs, static, labels, self._selection)
        if self._export_fleet():
            yield _FLEET, snap.rankings

    def collect_part(self, key: Hashable) -> Iterator[Metric]:
        """One series' window figures, or the fleet comparison (from the snapshot `parts()` saw)."""
        snap = self._parts_snapshot or self._snapshot()
        if key == _FLEET:
            yield from self._fleet(snap)
            return
        figs = _per_series(self._by_window(snap)).get(key, ()) if isinstance(key, SeriesKey) else ()
        yield from self._figures(snap, figs, self._parts_static)

    def collect(self) -> Iterator[Metric]:
        """Yield the latest figures; a figure that is undefined (e.g. CV of one run) is left out."""
        snap = self._snapshot()
        yield from self._figures(snap, [f for figs in self._by_window(snap).values() for f in figs.values()])
        if self._export_fleet():
            yield from self._fleet(snap)

    def _figures(
        self, snap: WindowSnapshot, figures: Sequence[WindowFigures], static: Sequence[str] | None = None
    ) -> Iterator[Metric]:
        static_names = list(static) if static is not None else _static_names(snap)
        site = _with_site(snap)
        label_names = ["endpoint", *static_names, *(["site"] if site else []), "workload", "window"]

        def labels(fig: WindowFigures) -> list[str]:
            own = snap.static_labels.get(fig.endpoint, {})
            return [
                fig.endpoint,
                *(own.get(k, "") for k in static_names),
                *([fig.site] if site else []),
                fig.workload,
                fig.window,
            ]

        for name, doc, attr in self._families:
            family = GaugeMetricFamily(name, doc, labels=label_names)
            for fig in figures:
                value = _figure(fig, attr)
                if value is not None:
                    family.add_metric(labels(fig), value)
            yield family
        for name, doc, attr in _PERCENTILE_FAMILIES:
            family = GaugeMetricFamily(name, doc, labels=[*label_names, "percentile"])
            for fig in figures:
                pct: Percentiles = getattr(fig, attr)
                for percentile, value in pct.shown():
                    family.add_metric([*labels(fig), percentile], value)
            yield family

    @staticmethod
    def _fleet(snap: WindowSnapshot) -> Iterator[Metric]:
        site = _with_site(snap)
        where = ["site"] if site else []
        # No endpoint name as a label value of a per-workload figure: which endpoint is fastest changes from
        # round to round, and each change would be a new series (issue 36). `tokwatch_fleet_rank` says who.
        fleet = GaugeMetricFamily(
            "tokwatch_fleet_fastest_vs_slowest_ratio",
            "Median tok/s of the fastest endpoint over that of the slowest (ok runs), per workload.",
            labels=[*where, "workload", "window"],
        )
        medians = GaugeMetricFamily(
            "tokwatch_fleet_median_tokens_per_second",
            "Median tok/s of ok runs over the comparison window, per ranked endpoint and workload.",
            labels=["endpoint", *where, "workload", "window"],
        )
        rank = GaugeMetricFamily(
            "tokwatch_fleet_rank",
            "Place in the workload's comparison ranking by median tok/s (1 = fastest).",
            labels=["endpoint", *where, "workload", "window"],
        )
        faster = GaugeMetricFamily(
            "tokwatch_fleet_faster_than_next_ratio",
            "Median tok/s of an endpoint over that of the next slower one in the workload's ranking.",
            labels=["endpoint", *where, "workload", "window"],
        )
        # A snapshot built with one ranking only (`ranking=`) exports that one.
        rankings = snap.rankings or ((snap.ranking,) if snap.ranking is not None else ())
        for ranking in rankings:
            series = [*([ranking.site] if site else []), ranking.workload, ranking.window]
            if (extremes := ranking.extremes) is not None:
                fleet.add_metric(series, extremes.ratio)
            for i, (name, median) in enumerate(ranking.ranked, start=1):
                medians.add_metric([name, *series], median)
                rank.add_metric([name, *series], float(i))
            for pair in ranking.neighbours():
                faster.add_metric([pair.fastest, *series], pair.ratio)
        yield from (fleet, medians, rank, faster)


def _figure(fig: WindowFigures, attr: str) -> float | None:
    """A window family's value: a figure, or the sample count of the percentiles named `attr`."""
    if attr in ("decode", "prefill", "ttft"):
        return float(getattr(fig, f"{attr}_percentiles").samples)
    value: float | None = getattr(fig, attr)
    return value


def _per_series(
    by_window: dict[str, dict[SeriesKey, WindowFigures]],
) -> dict[SeriesKey, tuple[WindowFigures, ...]]:
    """Each series' figures over every window given, shortest window first."""
    out: dict[SeriesKey, list[WindowFigures]] = {}
    for figures in by_window.values():
        for key, fig in figures.items():
            out.setdefault(key, []).append(fig)
    return {k: tuple(v) for k, v in out.items()}


def _static_names(snap: WindowSnapshot) -> tuple[str, ...]:
    return tuple(sorted({k for labels in snap.static_labels.values() for k in labels}))


def _with_site(snap: WindowSnapshot) -> bool:
    """Figures from an exporter with a site carry a `site` label (as every series of that exporter does)."""
    return any(f.site for figs in snap.by_window().values() for f in figs.values()) or any(
        r.site for r in snap.rankings
    )
