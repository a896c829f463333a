"""Continuous per-endpoint /metrics scraping, and the one object the app creates per endpoint.

For the app (one per endpoint whose `tokwatch.probes.metrics_url` is not None)::

    counters = ServerCounters(endpoint: EndpointSettings, http: HttpClient, *,
                              timeout: float | None = None, max_bytes: int = 4 MiB,
                              headers: Mapping[str, str] | None = None)
    collector.add(counters.state)       # ServerCollector, tokwatch.counters.collector
    await counters.start()              # scrape loop every endpoint.scrape_interval
    ctx.counters = counters.window      # CounterWindow for the probe
    await counters.close()              # on shutdown or config reload

A malformed, truncated, oversized, slow or failing /metrics never raises out of here: it is counted in
`tokwatch_server_scrape_errors_total{endpoint}`, logged with the endpoint name (URL credentials masked),
and the endpoint shows `tokwatch_server_up 0` with no stale gauges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tokwatch.counters.adapters import read_counters
from tokwatch.counters.loop import BackgroundLoop
from tokwatch.counters.parse import MetricsParseError, MetricsSnapshot, parse_metrics
from tokwatch.counters.reading import CounterReading
from tokwatch.counters.state import ServerState, log
from tokwatch.counters.window import ServerCounterWindow
from tokwatch.probes import metrics_url, probe_class
from tokwatch.settings.access import with_query
from tokwatch.settings.config import server_key
from tokwatch.settings.reach import Reach
from tokwatch.settings.redact import Redactor
from tokwatch.transport.http import HttpStatusError, TransportError

if TYPE_CHECKING:
    from tokwatch.settings.config import EndpointSettings
    from tokwatch.transport.http import HttpClient

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
MAX_SCRAPE_TIMEOUT_S = 10.0
MIN_SCRAPE_INTERVAL_S = 0.05  # a zero interval must not turn the loop into a busy scrape storm


def effective_interval(scrape_interval: float) -> float:
    """The scrape period actually used: the configured one, bounded below."""
    return max(MIN_SCRAPE_INTERVAL_S, scrape_interval)


def scrape_timeout(scrape_interval: float) -> float:
    """Per-scrape deadline: never longer than the interval, so a slow server cannot pile up scrapes."""
    return max(0.5, min(MAX_SCRAPE_TIMEOUT_S, scrape_interval))


class ServerCounters:
    """One endpoint's server counters: scrape loop, in-memory state and the probe's CounterWindow."""

    def __init__(
        self,
        endpoint: EndpointSettings,
        http: HttpClient,
        *,
        timeout: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        headers: Mapping[str, str] | None = None,
        credentials: Callable[[], Mapping[str, str]] | None = None,
        redactor: Callable[[], Redactor] | None = None,
    ) -> None:
        url = metrics_url(endpoint)
        if url is None:
            raise ValueError(f"endpoint {endpoint.name}: kind {endpoint.kind} has no metrics_url")
        self.endpoint = endpoint
        # The endpoint's own server gets its headers, credential and query (a gateway in front of it asks
        # for them on every route); a metrics_url elsewhere gets none of them.
        same_server = server_key(url) == server_key(endpoint.base_url)
        self.url = with_query(url, endpoint.query) if same_server else url
        self._credentials = credentials if same_server else None
        self._redactor = redactor  # the keys' redactor now: it knows every secret the credentials hold
        self._adapter = probe_class(endpoint.kind).counter_adapter
        self._http = http
        self._timeout = timeout if timeout is not None else scrape_timeout(endpoint.scrape_interval)
        self._max_bytes = max_bytes
        self._headers = dict(headers or {})
        self._reach = Reach(endpoint.name, endpoint)  # through the endpoint's proxy, with its TLS settings
        self._redact = Redactor([*self._headers.values(), *self._reach.secrets])
        self.state = ServerState(endpoint.name, endpoint.labels, mirror=endpoint.mirror_metrics)
        self.window = ServerCounterWindow(self.read)
        self._loop_task = BackgroundLoop(self._loop, f"tokwatch-scrape-{endpoint.name}")

    async def fetch(self) -> tuple[CounterReading | None, MetricsSnapshot] | None:
        """Scrape and parse once; None (counted, logged, up 0) when /metrics could not be read or parsed."""
        started = time.perf_counter()
        headers = self._headers
        if self._credentials is not None:
            headers = {**headers, **self._credentials()}
        try:
            text = await self._http.get_text(
                self.url,
                timeout=self._timeout,
                max_bytes=self._max_bytes,
                headers=headers or None,
                reach=self._reach,
            )
            snap = parse_metrics(text, max_chars=self._max_bytes)
        except (TransportError, HttpStatusError, MetricsParseError) as exc:
            duration = time.perf_counter() - started
            redact = (
                self._redact
                if self._redactor is None
                else self._redactor().with_secrets([*self._headers.values(), *self._reach.secrets])
            )
            self.state.record_error(duration, redact(f"{self.url}: {type(exc).__name__}: {exc}"))
            return None
        return read_counters(snap, self._adapter, self.endpoint.model), snap

    async def read(self) -> CounterReading | None:
        """The server's current reading, for the probe's window.

        It leaves the exported rates alone: those stay rates over the scrape interval, not over whatever
        short span separates a window snapshot from the last loop scrape. Failures are still counted.
        """
        fetched = await self.fetch()
        return None if fetched is None else fetched[0]

    async def scrape_once(self) -> CounterReading | None:
        """One scrape that updates the exported state; returns the reading (None on failure)."""
        started = time.perf_counter()
        fetched = await self.fetch()
        if fetched is None:
            return None
        reading, snap = fetched
        self.state.record(reading, snap, time.monotonic(), time.perf_counter() - started)
        return reading

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = effective_interval(self.endpoint.scrape_interval)
        next_at = loop.time()
        while True:
            try:
                await self.scrape_once()
            except Exception as exc:  # the loop must outlive any surprise in a server's exposition
                log.exception("endpoint %s: unexpected error scraping server metrics", self.endpoint.name)
                self.state.record_error(None, f"{type(exc).__name__}")
            next_at += interval
            # A scrape that overran its slot skips ahead instead of firing back-to-back.
            now = loop.time()
            if next_at < now:
                next_at = now + interval
            await asyncio.sleep(next_at - now)

    async def start(self) -> None:
        """Start the scrape loop (idempotent)."""
        await self._loop_task.start()

    async def close(self) -> None:
        """Stop the scrape loop and wait for it."""
        await self._loop_task.close()
