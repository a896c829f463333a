"""The status page served at `/`, `/endpoints/NAME` and `/compare?workload=`: a tile per endpoint (its
workloads and sites as rows), an endpoint's history, a workload's comparison; read from the store."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tokwatch.settings.config import Config
from tokwatch.settings.redact import redact
from tokwatch.statuspage.model import (
    Overview,
    Tile,
    build_comparison,
    build_endpoint_page,
    build_overview,
    fleet_workloads,
)
from tokwatch.statuspage.render import (
    endpoint_href,
    render_comparison,
    render_endpoint,
    render_message,
    render_overview,
)
from tokwatch.storage.base import RunStore
from tokwatch.storage.cost_figures import Pricer
from tokwatch.storage.errors import StorageError
from tokwatch.windows.window import FleetRanking

log = logging.getLogger(__name__)

__all__ = ["Page", "StatusPages", "endpoint_href"]


@dataclass(frozen=True, slots=True)
class Page:
    """An HTTP answer: status code, HTML body, and a location for redirects."""

    status: int
    body: str
    location: str | None = None


class StatusPages:
    """Builds the pages from the store; while it fails, the last good overview is shown with a notice."""

    def __init__(
        self,
        store: Callable[[], RunStore | None],
        config: Callable[[], Config],
        clock: Callable[[], float] = time.time,
        pricing: Pricer | None = None,
    ) -> None:
        self._store = store
        self._pricing: Pricer = pricing or (lambda _: None)
        self._config = config
        self._clock = clock
        self._last_good: Overview | None = None

    async def overview(self) -> Page:
        """The tile wall of every endpoint of the fleet (a sharded replica shows them all)."""
        config, store, now = self._config(), self._store(), self._clock()
        if store is None:
            return Page(200, render_message("Storage is off", _NO_STORE, now, config))
        try:
            ov = await build_overview(store, config, now)
        except StorageError as exc:
            message = redact(str(exc))
            log.warning("status page: store unavailable: %s", message)
            if self._last_good is not None:
                note = (
                    f"Store unavailable ({message}); figures as of {_hhmm(self._last_good.generated_at)} UTC."
                )
                return Page(200, render_overview(self._last_good, config, note))
            tiles = [Tile(e, None, None, []) for e in config.endpoints]
            empty = Overview(now, tiles, FleetRanking((), "7d"), [])
            return Page(200, render_overview(empty, config, f"Store unavailable ({message})."))
        self._last_good = ov
        return Page(200, render_overview(ov, config))

    async def endpoint(self, name: str, workload: str | None = None, site: str | None = None) -> Page:
        """One endpoint's history (of one of its workloads, from one site: its first and this exporter's
        when not given); a former name redirects to the current one."""
        config, store, now = self._config(), self._store(), self._clock()
        ep = config.endpoint(name)
        if ep is None:
            renamed = next((e for e in config.endpoints if name in e.renamed_from), None)
            if renamed is not None:
                return Page(301, "", endpoint_href(renamed.name, workload, site))
            return Page(404, render_message("Unknown endpoint", f"No endpoint named {name!r}.", now, config))
        if workload is not None and config.workload_for(ep, workload) is None:
            message = f"Endpoint {ep.name} has no workload {workload!r}."
            return Page(404, render_message("Unknown workload", message, now, config))
        if store is None:
            return Page(200, render_message(ep.name, _NO_STORE, now, config))
        try:
            page = await build_endpoint_page(
                store, config, ep, now, workload=workload, site=site, pricing=self._pricing
            )
        except StorageError as exc:
            return Page(503, render_message(ep.name, f"Store unavailable ({redact(str(exc))}).", now, config))
        return Page(200, render_endpoint(page, config))

    async def compare(
        self, workload: str | None, sort: str = "decode", site: str | None = None, order: str | None = None
    ) -> Page:
        """A workload's comparison (the first workload of the fleet when none is given); `sort`, `site` and
        `order` pick the column the table is sorted by."""
        config, store, now = self._config(), self._store(), self._clock()
        workloads = fleet_workloads(config)
        if workload is None and workloads:
            workload = workloads[0]
        if workload not in workloads:
            message = f"No endpoint runs a workload named {workload!r}."
            return Page(404, render_message("Unknown workload", message, now, config))
        if store is None:
            return Page(200, render_message(f"Compare {workload}", _NO_STORE, now, config))
        try:
            cmp = await build_comparison(store, config, workload, now, self._pricing)
        except StorageError as exc:
            return Page(
                503, render_message("Compare", f"Store unavailable ({redact(str(exc))}).", now, config)
            )
        return Page(200, render_comparison(cmp, config, sort, site, order))


_NO_STORE = (
    "The status page reads every run from the store, and storage is switched off (storage.enabled: false). "
    "The gauges on /metrics still carry the in-memory window figures."
)


def _hhmm(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t))
