"""The price sources of `pricing:` (docs/configuration.md, "Pricing"): the price table file and OpenRouter's
models list, read at (re)load, the list fetched from its URL every `pricing.refresh` when one is configured
(nothing is fetched otherwise). A refresh that fails keeps the prices it had and is counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.settings.pricing import (
    PriceSource,
    Pricing,
    PricingSettings,
    read_openrouter_models,
    read_price_files,
    resolve_priced,
)
from tokwatch.settings.redact import redact
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.transport.http import HttpClient, HttpStatusError, TransportError

log = logging.getLogger("tokwatch")

FETCH_TIMEOUT_S = 30.0
MAX_LIST_BYTES = 32 * 1024 * 1024  # OpenRouter's full list is a few MB
RETRY_S = 300.0  # a failed fetch is tried again this soon, whatever `refresh` says


@dataclass
class SourceState:
    """One configured price source: its prices, when they were last read, how many reads failed."""

    prices: dict[str, Pricing] = field(default_factory=dict)
    last_refresh: float | None = None
    failures: int = 0


class PriceSources:
    """The configured price sources and each endpoint's resolved prices."""

    def __init__(self) -> None:
        self._settings = PricingSettings()
        self._states: dict[str, SourceState] = {}
        self._task: asyncio.Task[None] | None = None
        self._http: HttpClient | None = None

    @property
    def settings(self) -> PricingSettings:
        """The `pricing:` block in force."""
        return self._settings

    @property
    def states(self) -> Mapping[str, SourceState]:
        """Each configured source by its label (`table`, `openrouter`)."""
        return self._states

    def load(self, settings: PricingSettings) -> dict[str, SourceState]:
        """Read the configured files (not the URL); ConfigError naming the file and line of a bad one."""
        now = time.time()
        states: dict[str, SourceState] = {
            source: SourceState(prices, now) for source, prices in read_price_files(settings).items()
        }
        if not settings.openrouter_file and settings.openrouter_url:
            old = self._states.get("openrouter")
            same = old is not None and self._settings.openrouter_url == settings.openrouter_url
            states["openrouter"] = old if same and old is not None else SourceState()
        return states

    def apply(self, settings: PricingSettings, states: dict[str, SourceState]) -> None:
        """Use `load`'s result; (re)start the URL's refresh when one is configured."""
        url_changed = settings.openrouter_url != self._settings.openrouter_url
        refresh_changed = settings.refresh != self._settings.refresh
        self._settings, self._states = settings, states
        if self._task is not None and (url_changed or refresh_changed or not settings.openrouter_url):
            self._task.cancel()
            self._task = None
        if settings.openrouter_url and self._task is None and self._http is not None:
            self._task = asyncio.create_task(self._refresh_loop(), name="tokwatch-price-refresh")

    async def start(self) -> None:
        """Open the client and start refreshing the URL, when one is configured."""
        self._http = HttpClient()
        await self._http.__aenter__()
        self.apply(self._settings, self._states)

    async def close(self) -> None:
        """Stop refreshing and close the client."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    def pricing(self, ep: EndpointSettings, config: Config) -> tuple[Pricing, PriceSource] | None:
        """An endpoint's prices and where they came from; None when nothing prices it."""
        table = self._states.get("table")
        openrouter = self._states.get("openrouter")
        return resolve_priced(
            ep.pricing,
            ep.model,
            config.pricing,
            table.prices if table else {},
            openrouter.prices if openrouter else {},
        )

    async def refresh(self) -> bool:
        """Fetch OpenRouter's list from its URL once; False (counted, logged) when that failed."""
        url, state = self._settings.openrouter_url, self._states.get("openrouter")
        if url is None or state is None or self._http is None:
            return False
        try:
            text = await self._http.get_text(url, timeout=FETCH_TIMEOUT_S, max_bytes=MAX_LIST_BYTES)
            state.prices = read_openrouter_models(text, "pricing.openrouter_url")
        except (TransportError, HttpStatusError, ConfigError) as exc:
            state.failures += 1
            log.warning("pricing: cannot refresh OpenRouter's models list (openrouter_url): %s", _short(exc))
            return False
        state.last_refresh = time.time()
        return True

    async def _refresh_loop(self) -> None:
        while True:
            ok = await self.refresh()
            await asyncio.sleep(self._settings.refresh if ok else min(RETRY_S, self._settings.refresh))


def _short(exc: Exception) -> str:
    """The error's first line, secrets in the URL (a key in its query) masked."""
    return redact(str(exc).splitlines()[0][:200]) if str(exc) else type(exc).__name__

