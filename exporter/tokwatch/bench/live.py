"""Live view of a running benchmark: progress bar, a periodic figures line, optional Prometheus metrics."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures.result import Status
from tokwatch.figures.stats import percentile, percentiles

_RECENT = 5000  # values kept for live percentiles; the final figures use every value


@dataclass
class LiveStats:
    """Running counts and recent latency values, updated as requests finish (event-loop thread only)."""

    started: float = field(default_factory=time.perf_counter)
    in_flight: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    tokens: int = 0
    ttft: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))
    tbt: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))
    token_times: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))
    # (seconds since start, tokens so far) samples when counts come from other processes (--workers)
    token_totals: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=1000))

    def add(self, r: RequestRecord) -> None:
        """Account one finished request (warm-up requests only count as in flight)."""
        if r.warmup:
            return
        self.by_status[r.status.value] += 1
        if r.ok:
            if r.ttft_s is not None:
                self.ttft.append(r.ttft_s)
            self.tbt.extend(r.tbt_s)
            times = r.token_times_s()
            self.tokens += len(times)
            self.token_times.extend(times)

    def absorb(self, by_status: Mapping[str, int], in_flight: int, tokens: int) -> None:
        """Counts kept by the worker processes (`--workers`): no latency values cross while they measure."""
        self.by_status = Counter(by_status)
        self.in_flight = in_flight
        self.tokens = tokens
        self.token_totals.append((time.perf_counter() - self.started, tokens))

    @property
    def completed(self) -> int:
        """Measured requests finished, any status."""
        return sum(self.by_status.values())

    def tokens_per_s(self, now_s: float, window_s: float = 10.0) -> float:
        """Tokens received per second over the last `window_s` (seconds since the run start)."""
        start = max(0.0, now_s - window_s)
        if self.token_totals:
            samples = list(self.token_totals)
            first = next(((t, n) for t, n in samples if t >= start), samples[-1])
            last = samples[-1]
            return (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else 0.0
        # Copy first: the /metrics thread may read while the event loop appends.
        n = sum(1 for t in list(self.token_times) if t >= start)
        return n / (now_s - start) if now_s > start else 0.0

    def line(self) -> str:
        """`[10.2s] Completed: 156 | TTFT p99: 45ms | TBT p99: 18ms | Throughput: 234 tok/s` (seed 002)."""
        now = time.perf_counter() - self.started
        ttft = f"{percentile(self.ttft, 99) * 1e3:.0f}ms" if self.ttft else "-"
        tbt = f"{percentile(self.tbt, 99) * 1e3:.1f}ms" if self.tbt else "-"
        errors = self.completed - self.by_status.get(Status.OK.value, 0)
        return (
            f"[{now:.1f}s] Completed: {self.completed} | Errors: {errors} | In flight: {self.in_flight} | "
            f"TTFT p99: {ttft} | TBT p99: {tbt} | Throughput: {self.tokens_per_s(now):.0f} tok/s"
        )

    def seed_line(self) -> str:
        """Seed 002's own streaming-metrics line, names and fields as the seed prints it:
        `[10.2s] Completed: 156 | TTFC p99: 45ms | TBC p99: 18ms | Throughput: 234 tok/s`."""
        now = time.perf_counter() - self.started
        ttfc = f"{percentile(self.ttft, 99) * 1e3:.0f}ms" if self.ttft else "-"
        tbc = f"{percentile(self.tbt, 99) * 1e3:.0f}ms" if self.tbt else "-"
        return (
            f"[{now:.1f}s] Completed: {self.completed} | TTFC p99: {ttfc} | TBC p99: {tbc} | "
            f"Throughput: {self.tokens_per_s(now):.0f} tok/s"
        )


class LiveCollector(Collector):
    """Prometheus view of LiveStats; reads memory only."""

    def __init__(self, stats: LiveStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        """Yield the live bench metric families."""
        s = self._stats
        runs = CounterMetricFamily(
            "tokwatch_bench_requests", "Measured bench requests by status", labels=["status"]
        )
        for status in Status:
            runs.add_metric([status.value], s.by_status.get(status.value, 0))
        yield runs
        yield GaugeMetricFamily("tokwatch_bench_in_flight", "Bench requests in flight", value=s.in_flight)
        tokens = CounterMetricFamily("tokwatch_bench_tokens", "Generated tokens received", value=s.tokens)
        yield tokens
        for name, values, help_ in (
            ("tokwatch_bench_ttft_seconds", s.ttft, "TTFT percentiles over recent requests"),
            ("tokwatch_bench_tbt_seconds", s.tbt, "Time between tokens percentiles over recent tokens"),
        ):
            g = GaugeMetricFamily(name, help_, labels=["quantile"])
            snapshot = list(values)
            if snapshot:
                quantiles = (0.5, 0.9, 0.99)
                for q, v in zip(quantiles, percentiles(snapshot, [q * 100 for q in quantiles]), strict=True):
                    g.add_metric([str(q)], v)
            yield g
        now = time.perf_counter() - s.started
        yield GaugeMetricFamily(
            "tokwatch_bench_tokens_per_second",
            "Tokens received per second, last 10 s",
            value=s.tokens_per_s(now),
        )


def serve_live_metrics(stats: LiveStats, host: str, port: int) -> tuple[Any, CollectorRegistry]:
    """Serve the live metrics from their own registry; returns (server, registry); `server.shutdown()`."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(LiveCollector(stats))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, registry


def make_progress(console: Console) -> Progress:
    """A rich progress bar over requests (indeterminate when the run is bounded by duration only)."""
    return Progress(
        TextColumn("[bold]bench"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )
