"""Ollama's server-side signals (it has no /metrics): cold reloads from run results, VRAM share from /api/ps.

For the app (one per endpoint whose kind has `ollama_signals`, i.e. `kind: ollama`)::

    signals = OllamaSignals(endpoint: EndpointSettings, http: HttpClient, *, timeout: float | None = None)
    collector.add(signals.state)        # ServerCollector, tokwatch.counters.collector
    signals.observe(result)             # after every timed Ollama run: result.cold -> reload counted
    await signals.start()               # polls /api/ps every endpoint.scrape_interval
    await signals.close()

A timed run whose `load_duration` > 0 (`RunResult.cold`) found the model unloaded although the warm-up
had just loaded it: it was evicted and reloaded, counted in `tokwatch_server_model_reloads_total`. A model
partly offloaded to the CPU (`size_vram < size` in /api/ps) shows `tokwatch_server_model_vram_ratio` < 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tokwatch.counters.loop import BackgroundLoop
from tokwatch.counters.scraper import effective_interval, scrape_timeout
from tokwatch.counters.state import ServerState, log
from tokwatch.figures.result import RunResult
from tokwatch.settings.access import with_query
from tokwatch.settings.config import server_root
from tokwatch.settings.reach import Reach
from tokwatch.settings.redact import Redactor
from tokwatch.transport.http import HttpStatusError, TransportError

if TYPE_CHECKING:
    from tokwatch.settings.config import EndpointSettings
    from tokwatch.transport.http import HttpClient

MAX_PS_BYTES = 1024 * 1024


class OllamaPsError(ValueError):
    """An /api/ps answer that is not the documented JSON shape."""


def _same_model(wanted: str, entry: dict[str, Any]) -> bool:
    # Ollama reports "llama3:latest" for a model requested as "llama3".
    names = {str(entry.get("name", "")), str(entry.get("model", ""))}
    return wanted in names or (":" not in wanted and f"{wanted}:latest" in names)


def vram_ratio_from_ps(text: str, model: str) -> float | None:
    """size_vram / size of `model` in an /api/ps body; None when it is not loaded. Raises OllamaPsError."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise OllamaPsError(f"/api/ps is not JSON: {exc}") from None
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, list):
        raise OllamaPsError("/api/ps has no 'models' list")
    for entry in models:
        if not isinstance(entry, dict) or not _same_model(model, entry):
            continue
        size, size_vram = entry.get("size"), entry.get("size_vram")
        if not isinstance(size, int | float) or not isinstance(size_vram, int | float) or size <= 0:
            raise OllamaPsError(f"/api/ps entry for {model!r} lacks numeric size and size_vram")
        return min(max(size_vram / size, 0.0), 1.0)
    return None


class OllamaSignals:
    """Ollama eviction and offload signals for one endpoint."""

    def __init__(
        self,
        endpoint: EndpointSettings,
        http: HttpClient,
        *,
        timeout: float | None = None,
        credentials: Callable[[], Mapping[str, str]] | None = None,
        redactor: Callable[[], Redactor] | None = None,
    ) -> None:
        self.endpoint = endpoint
        # The endpoint's own server: its headers, credential and query go with every poll.
        self.url = with_query(f"{server_root(endpoint.base_url)}/api/ps", endpoint.query)
        self._credentials = credentials
        self._redactor = redactor
        self._http = http
        self._reach = Reach(endpoint.name, endpoint)  # through the endpoint's proxy, with its TLS settings
        self._timeout = timeout if timeout is not None else scrape_timeout(endpoint.scrape_interval)
        self.state = ServerState(endpoint.name, endpoint.labels, ollama=True)
        self._loop_task = BackgroundLoop(self._loop, f"tokwatch-ollama-ps-{endpoint.name}")

    def observe(self, result: RunResult) -> None:
        """Account one timed run: a cold hot-run (model reloaded) counts as a reload/eviction."""
        if result.cold:
            self.state.record_reload()
            # Per run, so at DEBUG (a fleet's logs keep one line per round); the counter counts every one.
            log.debug(
                "endpoint %s: model %s was reloaded (evicted since the warm-up)",
                self.endpoint.name,
                self.endpoint.model,
            )

    async def poll(self) -> float | None:
        """Read /api/ps once; returns the VRAM ratio (None when unloaded or on failure, which is counted)."""
        started = time.perf_counter()
        try:
            headers = self._credentials() if self._credentials is not None else None
            text = await self._http.get_text(
                self.url, timeout=self._timeout, max_bytes=MAX_PS_BYTES, headers=headers, reach=self._reach
            )
            ratio = vram_ratio_from_ps(text, self.endpoint.model)
        except (TransportError, HttpStatusError, OllamaPsError) as exc:
            message = f"{self.url}: {type(exc).__name__}: {exc}"
            if self._redactor is not None:
                message = self._redactor()(message)
            self.state.record_error(time.perf_counter() - started, message)
            return None
        self.state.record_ollama(ratio, time.perf_counter() - started)
        return ratio

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception as exc:  # the loop must outlive any surprise in the server's answer
                log.exception("endpoint %s: unexpected error while polling /api/ps", self.endpoint.name)
                self.state.record_error(None, type(exc).__name__)
            await asyncio.sleep(effective_interval(self.endpoint.scrape_interval))

    async def start(self) -> None:
        """Start polling /api/ps (idempotent)."""
        await self._loop_task.start()

    async def close(self) -> None:
        """Stop polling and wait for the loop to end."""
        await self._loop_task.close()
