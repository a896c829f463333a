"""prometheus_client collector for the storage self-metrics (no I/O in collect)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokwatch.storage.writer import RunWriter


class StorageCollector(Collector):
    """`tokwatch_storage_*`: queue, outbox, writes, errors, oldest unwritten run, database up. Sample::

        tokwatch_storage_queue_depth 0.0
        tokwatch_storage_outbox_runs 0.0
        tokwatch_storage_writes_total 1440.0
        tokwatch_storage_write_errors_total 0.0
        tokwatch_storage_dropped_runs_total 0.0
        tokwatch_storage_oldest_unwritten_age_seconds 0.0
        tokwatch_storage_up{backend="sqlite"} 1.0
    """

    def __init__(self, writer: RunWriter) -> None:
        self._writer = writer

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
        up.add_metric([self._writer.backend], 1.0 if s.up else 0.0)
        yield up
