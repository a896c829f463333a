"""The server's own /metrics over a run: snapshots before/after, KV-cache usage sampled during the run."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokwatch.bench.stamping import BENCH_USER_AGENT
from tokwatch.counters.adapters import read_counters
from tokwatch.counters.parse import MetricsParseError, MetricsSnapshot, parse_metrics
from tokwatch.counters.reading import CounterReading
from tokwatch.probes import probe_class
from tokwatch.transport.http import HttpClient, HttpStatusError, TransportError
from tokwatch.transport.http_route import RouteSource
from tokwatch.transport.measurement import MeasurementLoop

SCRAPE_TIMEOUT_S = 5.0


class ServerWatch:
    """Scrapes one /metrics URL; every failure only leaves a figure missing, it never stops the run."""

    def __init__(
        self,
        http: HttpClient,
        url: str,
        kind: str | None,
        model: str | None,
        mirror: Sequence[str] = (),
        sample_interval_s: float = 1.0,
        headers: Mapping[str, str] | None = None,
        redact: Callable[[str], str] = str,
        reach: RouteSource | None = None,
    ) -> None:
        self._http = http
        self._url = url
        self._headers = headers
        self._redact = redact
        self._reach = reach
        self._adapter = probe_class(kind).counter_adapter if kind is not None else None
        self._model = model
        self._mirror = tuple(mirror)
        self._interval = sample_interval_s
        self.before_text: str | None = None
        self.after_text: str | None = None
        self._before: tuple[float, CounterReading | None, MetricsSnapshot] | None = None
        self._after: tuple[float, CounterReading | None, MetricsSnapshot] | None = None
        self._kv_peak: float | None = None
        self._running_peak: float | None = None
        self._waiting_peak: float | None = None
        self.problem: str | None = None

    async def _scrape(
        self, http: HttpClient | None = None
    ) -> tuple[str, float, CounterReading | None, MetricsSnapshot] | None:
        try:
            text = await (http or self._http).get_text(
                self._url, timeout=SCRAPE_TIMEOUT_S, headers=self._headers, reach=self._reach
            )
            snap = parse_metrics(text)
        except (TransportError, HttpStatusError, MetricsParseError) as exc:
            self.problem = self._redact(f"cannot read {self._url}: {exc}")
            return None
        reading = read_counters(snap, self._adapter, self._model)
        if reading is not None:
            self._track_peaks(reading)
        return text, time.perf_counter(), reading, snap

    def _track_peaks(self, r: CounterReading) -> None:
        peaks = (("_kv_peak", r.kv_cache_usage), ("_running_peak", r.running), ("_waiting_peak", r.waiting))
        for attr, value in peaks:
            if value is not None:
                current = getattr(self, attr)
                setattr(self, attr, value if current is None else max(current, value))

    async def start(self) -> None:
        """Take the before-run snapshot."""
        got = await self._scrape()
        if got is not None:
            self.before_text, t, reading, snap = got
            self._before = (t, reading, snap)

    async def sample_forever(self, http: HttpClient | None = None) -> None:
        """Sample gauges (KV usage, queue depth) until cancelled, with `http` when given (another loop's)."""
        while True:
            await asyncio.sleep(self._interval)
            await self._scrape(http)

    async def finish(self) -> None:
        """Take the after-run snapshot."""
        got = await self._scrape()
        if got is not None:
            self.after_text, t, reading, snap = got
            self._after = (t, reading, snap)

    def figures(self) -> dict[str, Any]:
        """Server figures over the run (deltas of counters, peaks of gauges); empty when unavailable."""
        out: dict[str, Any] = {}
        if self.problem:
            out["problem"] = self.problem
        if self._before is None or self._after is None:
            return out
        (t0, r0, s0), (t1, r1, s1) = self._before, self._after
        span = t1 - t0
        if r0 is not None and r1 is not None:
            out["server"] = r1.server
            for name in ("generation_tokens", "prompt_tokens", "finished_requests", "preemptions"):
                a, b = getattr(r0, name), getattr(r1, name)
                if a is not None and b is not None and b >= a:
                    out[f"{name}_delta"] = b - a
            gen = out.get("generation_tokens_delta")
            if gen is not None and span > 0:
                out["generation_tokens_per_s"] = gen / span
        for attr, key in (
            ("_kv_peak", "kv_cache_usage_peak"),
            ("_running_peak", "running_peak"),
            ("_waiting_peak", "waiting_peak"),
        ):
            if getattr(self, attr) is not None:
                out[key] = getattr(self, attr)
        for name in self._mirror:
            a, b = s0.total(name), s1.total(name)
            if a is not None and b is not None:
                out[f"{name}_delta"] = b - a
        return out


async def watch_during(watch: ServerWatch) -> asyncio.Task[None]:
    """Start sampling (cancel the task, then `await finish()`, when the run ends).

    The samples are scraped and parsed in a thread with its own loop and HTTP client, so a large /metrics
    body never delays the stamping of the streams the run measures (docs/methodology.md, "Measurement
    isolation"); the before and after snapshots, outside the measured phase, stay on the run's loop.
    """
    side = MeasurementLoop(name="tokwatch-bench-watch")
    side.start()

    async def sample() -> None:
        async with HttpClient(user_agent=BENCH_USER_AGENT) as http:
            await watch.sample_forever(http)

    async def run() -> None:
        try:
            await side.call(sample())
        finally:
            await asyncio.to_thread(side.stop)

    return asyncio.create_task(run(), name="bench-server-watch")


async def stop_task(task: asyncio.Task[None]) -> None:
    """Cancel a helper task and wait for it."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
