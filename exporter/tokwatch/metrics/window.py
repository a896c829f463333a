"""Window and fleet figures: the `tokwatch_window_*` and `tokwatch_fleet_*` gauges, read from a snapshot.

The snapshot comes from the store's window cache or the in-memory window (tokwatch.window); collecting it
does no I/O. Names, types and labels are the contract in docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from tokwatch.window import WindowFigures, WindowSnapshot

_FLEET = "__fleet__"  # the window collector's part that is not an endpoint

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
)


class WindowCollector(Collector):
    """`tokwatch_window_*` per endpoint and the fleet figures, from the store cache or the memory window.

    One part per endpoint and one for the fleet (exported by one replica of a sharded fleet). Sample::

        tokwatch_window_decode_tokens_per_second_median{endpoint="a",gpu="3090",window="24h"} 100.0
        tokwatch_window_decode_tokens_per_second_stddev{endpoint="a",gpu="3090",window="24h"} 4.0
        tokwatch_window_decode_tokens_per_second_cv_ratio{endpoint="a",gpu="3090",window="24h"} 0.04
        tokwatch_window_uptime_ratio{endpoint="a",gpu="3090",window="24h"} 1.0
        tokwatch_window_runs{endpoint="a",gpu="3090",window="24h"} 3.0
        tokwatch_window_ok_runs{endpoint="a",gpu="3090",window="24h"} 3.0
        tokwatch_window_timing_disturbed_runs{endpoint="a",gpu="3090",window="24h"} 1.0
        tokwatch_window_decode_tokens_per_second_set_aside_runs{endpoint="a",gpu="3090",window="24h"} 0.0
        tokwatch_fleet_fastest_vs_slowest_ratio{fastest="a",slowest="b",window="7d"} 1.8181818181818181
        tokwatch_fleet_median_tokens_per_second{endpoint="a",window="7d"} 100.0
        tokwatch_fleet_rank{endpoint="a",window="7d"} 1.0
        tokwatch_fleet_faster_than_next_ratio{endpoint="a",next="b",window="7d"} 1.8181818181818181
    """

    def __init__(
        self, snapshot: Callable[[], WindowSnapshot], *, export_fleet: bool | Callable[[], bool] = True
    ) -> None:
        self._snapshot = snapshot
        # One replica of a sharded fleet exports the fleet figures, the others do not; which one can change
        # while running (a replica takes over while a lower one is down), hence a callable.
        if callable(export_fleet):
            self._export_fleet = export_fleet
        else:
            always = bool(export_fleet)
            self._export_fleet = lambda: always
        self._parts_snapshot: WindowSnapshot | None = None  # the one `parts()` saw, for `collect_part`
        self._parts_static: tuple[str, ...] | None = None

    def describe(self) -> Iterable[Metric]:
        """Families depend on config; nothing up front."""
        return []

    def parts(self) -> Iterator[tuple[Hashable, Hashable]]:
        """One part per endpoint, revised when its figures change, and one for the fleet comparison."""
        snap = self._parts_snapshot = self._snapshot()
        static = self._parts_static = _static_names(snap)
        for name, fig in snap.figures.items():
            yield name, (fig, static, tuple(sorted(snap.static_labels.get(name, {}).items())))
        if self._export_fleet():
            yield _FLEET, (snap.fleet, snap.ranking)

    def collect_part(self, key: Hashable) -> Iterator[Metric]:
        """One endpoint's window figures, or the fleet comparison (from the snapshot `parts()` saw)."""
        snap = self._parts_snapshot or self._snapshot()
        if key == _FLEET:
            yield from self._fleet(snap)
            return
        fig = snap.figures.get(str(key))
        yield from self._figures(snap, [fig] if fig is not None else [], self._parts_static)

    def collect(self) -> Iterator[Metric]:
        """Yield the latest figures; a figure that is undefined (e.g. CV of one run) is left out."""
        snap = self._snapshot()
        yield from self._figures(snap, list(snap.figures.values()))
        if self._export_fleet():
            yield from self._fleet(snap)

    def _figures(
        self, snap: WindowSnapshot, figures: Sequence[WindowFigures], static: Sequence[str] | None = None
    ) -> Iterator[Metric]:
        static_names = list(static) if static is not None else _static_names(snap)
        label_names = ["endpoint", *static_names, "window"]
        for name, doc, attr in _WINDOW_FAMILIES:
            family = GaugeMetricFamily(name, doc, labels=label_names)
            for fig in figures:
                value = getattr(fig, attr)
                if value is None:
                    continue
                own = snap.static_labels.get(fig.endpoint, {})
                values = [fig.endpoint, *(own.get(k, "") for k in static_names), fig.window]
                family.add_metric(values, value)
            yield family

    @staticmethod
    def _fleet(snap: WindowSnapshot) -> Iterator[Metric]:
        fleet = GaugeMetricFamily(
            "tokwatch_fleet_fastest_vs_slowest_ratio",
            "Median tok/s of the fastest endpoint over that of the slowest (ok runs).",
            labels=["fastest", "slowest", "window"],
        )
        if snap.fleet is not None:
            fleet.add_metric([snap.fleet.fastest, snap.fleet.slowest, snap.fleet.window], snap.fleet.ratio)
        yield fleet
        medians = GaugeMetricFamily(
            "tokwatch_fleet_median_tokens_per_second",
            "Median tok/s of ok runs over the comparison window, per ranked endpoint.",
            labels=["endpoint", "window"],
        )
        rank = GaugeMetricFamily(
            "tokwatch_fleet_rank",
            "Place in the comparison ranking by median tok/s (1 = fastest).",
            labels=["endpoint", "window"],
        )
        faster = GaugeMetricFamily(
            "tokwatch_fleet_faster_than_next_ratio",
            "Median tok/s of an endpoint over that of the next slower one in the ranking.",
            labels=["endpoint", "next", "window"],
        )
        if snap.ranking is not None:
            window = snap.ranking.window
            for i, (name, median) in enumerate(snap.ranking.ranked, start=1):
                medians.add_metric([name, window], median)
                rank.add_metric([name, window], float(i))
            for pair in snap.ranking.neighbours():
                faster.add_metric([pair.fastest, pair.slowest, window], pair.ratio)
        yield from (medians, rank, faster)


def _static_names(snap: WindowSnapshot) -> tuple[str, ...]:
    return tuple(sorted({k for labels in snap.static_labels.values() for k in labels}))
