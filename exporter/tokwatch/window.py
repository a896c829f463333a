"""In-memory window figures (median, stddev, CV of ok-run tok/s; uptime) used when no store is configured."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tokwatch.stats import coefficient_of_variation, median, sample_stddev


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """Figures over one time window for one endpoint."""

    window_label: str
    runs: int
    ok_runs: int
    median: float | None
    stddev: float | None
    cv: float | None

    @property
    def uptime(self) -> float:
        """Ok runs / all runs (0 when there were none)."""
        return self.ok_runs / self.runs if self.runs else 0.0


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


def figures(label: str, runs: int, ok_tps: Sequence[float]) -> WindowFigures:
    """Window figures from a run count and the tok/s of the ok runs."""
    return WindowFigures(
        window_label=label,
        runs=runs,
        ok_runs=len(ok_tps),
        median=median(ok_tps) if ok_tps else None,
        stddev=sample_stddev(ok_tps) if len(ok_tps) >= 2 else None,
        cv=coefficient_of_variation(ok_tps),
    )


class RunWindow:
    """The runs of one endpoint inside a sliding time window (bounded: at most `max_runs`)."""

    def __init__(self, seconds: float, max_runs: int = 100_000) -> None:
        self.seconds = seconds
        self._runs: deque[tuple[float, bool, float | None]] = deque(maxlen=max_runs)

    def add(self, started_at: float, ok: bool, tokens_per_second: float | None) -> None:
        """Add one run (unix start time, ok?, tok/s when ok)."""
        self._runs.append((started_at, ok, tokens_per_second if ok else None))

    def figures(self, now: float) -> WindowFigures:
        """Figures over runs that started within `seconds` before `now`."""
        cutoff = now - self.seconds
        while self._runs and self._runs[0][0] < cutoff:
            self._runs.popleft()
        ok_tps = [tps for _, ok, tps in self._runs if ok and tps is not None]
        return figures(window_label(self.seconds), len(self._runs), ok_tps)
