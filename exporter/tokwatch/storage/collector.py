"""prometheus_client collectors: storage self-metrics and store-backed window gauges (no I/O in collect)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokwatch.storage.window import WindowCache
from tokwatch.storage.writer import RunWriter


class StorageCollector(Collector):
    """`tokwatch_storage_*`: queue, outbox, writes, errors, oldest unwritten run, database up."""

    def __init__(self, writer: RunWriter, backend: str) -> None:
        self._writer = writer
        self._backend = backend

    def collect(self) -> Iterator[Metric]:
        """Yield the families from the writer's in-memory counters."""
        s = self._writer.stats()
        yield GaugeMetricFamily(
            "tokwatch_storage_queue_depth", "Runs waiting in memory for the database.", value=s.queue_depth
        )
        yield GaugeMetricFamily(
            "tokwatch_storage_outbox_runs", "Runs in the durable outbox awaiting replay.", value=s.outbox_runs
        )
        yield CounterMetricFamily(
            "tokwatch_storage_writes",
            "Runs written to the database (replays included).",
            value=s.writes_total,
        )
        yield CounterMetricFamily(
            "tokwatch_storage_write_errors", "Failed database write attempts.", value=s.write_errors_total
        )
        yield CounterMetricFamily(
            "tokwatch_storage_dropped_runs",
            "Runs lost because the outbox could not be written.",
            value=s.dropped_total,
        )
        yield GaugeMetricFamily(
            "tokwatch_storage_oldest_unwritten_age_seconds",
            "Age of the oldest run not yet in the database (0 when none).",
            value=s.oldest_unwritten_age_seconds,
        )
        up = GaugeMetricFamily(
            "tokwatch_storage_up", "1 if the last database operation succeeded.", labels=["backend"]
        )
        up.add_metric([self._backend], 1.0 if s.up else 0.0)
        yield up


_WINDOW_FAMILIES = (
    ("tokwatch_window_decode_tokens_per_second_median", "Median tok/s of ok runs in the window.", "median"),
    (
        "tokwatch_window_decode_tokens_per_second_stddev",
        "Sample stddev of ok-run tok/s.",
        "stddev",
    ),
    ("tokwatch_window_decode_tokens_per_second_cv_ratio", "Coefficient of variation (stddev / mean).", "cv"),
    ("tokwatch_window_uptime_ratio", "ok runs / all runs in the window.", "uptime"),
    ("tokwatch_window_runs", "Runs in the window.", "runs"),
    ("tokwatch_window_ok_runs", "ok runs in the window.", "ok_runs"),
)


class WindowCollector(Collector):
    """The `tokwatch_window_*` families for every endpoint, plus the fleet fastest-vs-slowest ratio."""

    def __init__(self, cache: WindowCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        """Yield the cached figures; a figure that is undefined (e.g. CV of one run) is left out."""
        snap = self._cache.snapshot()
        static_names = sorted({k for labels in snap.static_labels.values() for k in labels})
        label_names = ["endpoint", "window", *static_names]
        for name, doc, attr in _WINDOW_FAMILIES:
            family = GaugeMetricFamily(name, doc, labels=label_names)
            for fig in snap.figures.values():
                value = getattr(fig, attr)
                if value is None:
                    continue
                static = snap.static_labels.get(fig.endpoint, {})
                family.add_metric(
                    [fig.endpoint, fig.window, *(static.get(k, "") for k in static_names)], value
                )
            yield family
        fleet = GaugeMetricFamily(
            "tokwatch_fleet_fastest_vs_slowest_ratio",
            "Median tok/s of the fastest endpoint over that of the slowest (ok runs).",
            labels=["fastest", "slowest", "window"],
        )
        if snap.fleet is not None:
            fleet.add_metric([snap.fleet.fastest, snap.fleet.slowest, snap.fleet.window], snap.fleet.ratio)
        yield fleet
