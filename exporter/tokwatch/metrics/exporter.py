"""The exporter's own figures: build, configuration reloads, the scheduler and probes in flight.

Names, types and labels are the contract in docs/metrics.md.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokwatch import __version__


@dataclass
class SchedulerStats:
    """What the scheduler reports about itself (exported as self-metrics)."""

    rounds: int = 0
    skipped_slots: int = 0  # planned rounds not run because the previous one overran them
    crashes: int = 0  # the scheduler loop itself failed and was restarted
    running: bool = False
    last_error: str | None = None


@dataclass
class ExporterStatus:
    """The exporter's own health figures, updated by the app and scheduler."""

    interval_s: float = 0.0
    reload_ok: bool = False
    reload_success_ts: float = 0.0
    lag_s: float = 0.0
    last_round_ts: float = 0.0
    next_round_ts: float = 0.0


class ExporterCollector(Collector):
    """Self-metrics: build info, config reload, scheduler lag, probes in flight. Sample::

        tokwatch_build_info{python="3.11.7",version="0.1.0"} 1.0
        tokwatch_config_last_reload_successful 1.0
        tokwatch_config_last_reload_success_timestamp_seconds 1.7e+09
        tokwatch_scheduler_interval_seconds 3600.0
        tokwatch_scheduler_lag_seconds 0.25
        tokwatch_scheduler_last_round_timestamp_seconds 1.7000072e+09
        tokwatch_scheduler_next_round_timestamp_seconds 1.7000108e+09
        tokwatch_probes_in_flight 0.0
        tokwatch_scheduler_rounds_total 3.0
        tokwatch_scheduler_skipped_rounds_total 0.0
        tokwatch_scheduler_crashes_total 0.0
        tokwatch_scheduler_up 1.0
    """

    def __init__(
        self,
        status: ExporterStatus,
        in_flight: Callable[[], int],
        scheduler: Callable[[], SchedulerStats | None] = lambda: None,
    ) -> None:
        self._s = status
        self._in_flight = in_flight
        self._scheduler = scheduler

    def describe(self) -> Iterable[Metric]:
        """Static set, but described lazily like the others."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Families from the status object."""
        s = self._s
        info = GaugeMetricFamily(
            "tokwatch_build_info", "Build information; always 1.", labels=["version", "python"]
        )
        info.add_metric([__version__, platform.python_version()], 1.0)
        yield info
        yield GaugeMetricFamily(
            "tokwatch_config_last_reload_successful",
            "1 if the last configuration (re)load succeeded.",
            value=float(s.reload_ok),
        )
        yield GaugeMetricFamily(
            "tokwatch_config_last_reload_success_timestamp_seconds",
            "When the configuration was last loaded successfully.",
            value=s.reload_success_ts,
        )
        yield GaugeMetricFamily(
            "tokwatch_scheduler_interval_seconds", "Configured probe interval.", value=s.interval_s
        )
        yield GaugeMetricFamily(
            "tokwatch_scheduler_lag_seconds",
            "How late the last round started against its planned time.",
            value=s.lag_s,
        )
        yield GaugeMetricFamily(
            "tokwatch_scheduler_last_round_timestamp_seconds",
            "When the last round started.",
            value=s.last_round_ts,
        )
        yield GaugeMetricFamily(
            "tokwatch_scheduler_next_round_timestamp_seconds",
            "When the next round is planned.",
            value=s.next_round_ts,
        )
        yield GaugeMetricFamily(
            "tokwatch_probes_in_flight", "Probes running now.", value=float(self._in_flight())
        )
        stats = self._scheduler()
        if stats is not None:
            yield CounterMetricFamily(
                "tokwatch_scheduler_rounds", "Scheduled rounds completed.", value=stats.rounds
            )
            yield CounterMetricFamily(
                "tokwatch_scheduler_skipped_rounds",
                "Planned rounds not run because the previous round overran them.",
                value=stats.skipped_slots,
            )
            yield CounterMetricFamily(
                "tokwatch_scheduler_crashes",
                "Times the scheduler loop failed and was restarted.",
                value=stats.crashes,
            )
            yield GaugeMetricFamily(
                "tokwatch_scheduler_up",
                "1 while the scheduler runs, 0 while it restarts after a crash (/-/ready answers 503).",
                value=float(stats.running),
            )
