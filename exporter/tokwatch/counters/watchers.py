"""The server watchers of the configured endpoints, kept in step with the config, on the main loop.

A `ServerCounters` scraper for every endpoint with a metrics URL and an `OllamaSignals` poller for every
Ollama endpoint; their figures go to one `ServerCollector`. They share an HTTP client of their own, so
scraping and parsing a server's /metrics never runs on the measurement loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from tokwatch.counters.collector import ServerCollector
from tokwatch.counters.ollama import OllamaSignals
from tokwatch.counters.scraper import ServerCounters
from tokwatch.probes import metrics_url, probe_class
from tokwatch.settings.config import EndpointSettings
from tokwatch.settings.redact import Redactor
from tokwatch.transport.http import HttpClient

W = TypeVar("W", ServerCounters, OllamaSignals)


class ServerWatchers:
    """Starts, replaces and stops the watchers as endpoints come, change and go (unchanged ones run on)."""

    def __init__(
        self,
        collector: ServerCollector,
        headers: Callable[[str], Mapping[str, str]] | None = None,
        redactor: Callable[[], Redactor] | None = None,
    ) -> None:
        self._collector = collector
        # An endpoint's request headers now and the redactor knowing their secrets (tokwatch.probes.keys),
        # for
        # scrapes of its own server.
        self._headers = headers
        self._redactor = redactor
        self._http: HttpClient | None = None
        self._counters: dict[str, ServerCounters] = {}
        self._ollama: dict[str, OllamaSignals] = {}

    @property
    def counters(self) -> Mapping[str, ServerCounters]:
        """The server-counter scrapers by endpoint name."""
        return self._counters

    @property
    def ollama(self) -> Mapping[str, OllamaSignals]:
        """The Ollama pollers by endpoint name."""
        return self._ollama

    async def start(self, endpoints: Sequence[EndpointSettings]) -> None:
        """Open the client and start the watchers `endpoints` need."""
        self._http = HttpClient()
        await self._http.__aenter__()
        await self.sync(endpoints)

    async def sync(self, endpoints: Sequence[EndpointSettings]) -> None:
        """Watchers for these (enabled) endpoints; before `start`, nothing."""
        http = self._http
        if http is None:
            return
        wanted = {ep.name: ep for ep in endpoints}
        await self._sync(
            self._counters,
            wanted,
            lambda ep: metrics_url(ep) is not None,
            lambda ep: ServerCounters(
                ep, http, credentials=self._credentials(ep.name), redactor=self._redactor
            ),
        )
        await self._sync(
            self._ollama,
            wanted,
            lambda ep: probe_class(ep.kind).ollama_signals,
            lambda ep: OllamaSignals(
                ep, http, credentials=self._credentials(ep.name), redactor=self._redactor
            ),
        )

    def _credentials(self, name: str) -> Callable[[], Mapping[str, str]] | None:
        headers = self._headers
        return None if headers is None else (lambda: headers(name))

    async def _sync(
        self,
        watchers: dict[str, W],
        wanted: dict[str, EndpointSettings],
        applies: Callable[[EndpointSettings], bool],
        make: Callable[[EndpointSettings], W],
    ) -> None:
        for name, watcher in list(watchers.items()):
            if wanted.get(name) != watcher.endpoint:
                await watcher.close()
                self._collector.remove(name)
                del watchers[name]
        for name, ep in wanted.items():
            if applies(ep) and name not in watchers:
                watchers[name] = watcher = make(ep)
                self._collector.add(watcher.state)
                await watcher.start()

    async def close(self) -> None:
        """Stop every watcher and close the client."""
        for counters in self._counters.values():
            await counters.close()
        for signals in self._ollama.values():
            await signals.close()
        self._counters.clear()
        self._ollama.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None
