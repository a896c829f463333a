"""The status API (`GET /api/v1/status`, `GET /api/v1/endpoints/NAME`): per endpoint x workload x site,
the newest run, uptime and p50/p90/p99 with their sample counts over every window, and the status — what a
router or an agent needs to pick the fastest healthy endpoint, as JSON (schema:
tokwatch.serve.status_api_schema,
docs/api.md).

Read from the store, every site side by side, through the same `window_figures` and window rule as the
/metrics window gauges, the status page and `tokwatch report`. One answer is computed at most every
`max_age_s` and shared by the requests in between, so a router polling every second costs the store one
set of aggregate queries per `max_age_s`, not one per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from tokwatch.figures.series import SeriesKey
from tokwatch.serve.status_api_schema import SCHEMA_VERSION
from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.settings.pricing import Pricing
from tokwatch.settings.redact import redact
from tokwatch.statuspage.model import series_of
from tokwatch.storage.base import LastRun, RunStore
from tokwatch.storage.cost_figures import priced_only, series_costs
from tokwatch.storage.errors import StorageError
from tokwatch.storage.network_time import network_time
from tokwatch.storage.window import WINDOW_S, window_figures
from tokwatch.windows.cost import CostFigures, EnergyFigures
from tokwatch.windows.window import WindowFigures, window_label, window_lengths
from tokwatch.windows.window_percentiles import MIN_SAMPLES, Percentiles, percentile_label
from tokwatch.windows.window_rule import WindowRule

log = logging.getLogger(__name__)

# Uptime the API always answers for, whatever schedule.windows holds: 30 min, 1 day (`24h`), 7 days.
API_WINDOWS_S = (1800.0, 86400.0, 7 * 86400.0)
MAX_AGE_S = 10.0


@dataclass(frozen=True, slots=True)
class ApiAnswer:
    """An HTTP answer: status code and the JSON document (a redirect carries `location`)."""

    status: int
    body: dict[str, Any]
    location: str | None = None


@dataclass(frozen=True, slots=True)
class _Computed:
    at: float
    config: Config
    series: list[dict[str, Any]]


class StatusApi:
    """Builds the API's answers from the store; an answer's figures are at most `max_age_s` old."""

    def __init__(
        self,
        store: Callable[[], RunStore | None],
        config: Callable[[], Config],
        clock: Callable[[], float] = time.time,
        max_age_s: float = MAX_AGE_S,
        pricing: Callable[[str], tuple[Pricing, str] | None] | None = None,
    ) -> None:
        self._store = store
        self._pricing = pricing or (lambda _: None)
        self._config = config
        self._clock = clock
        self._max_age_s = max_age_s
        self._computed: _Computed | None = None
        # Each endpoint view's network figures, with the `generated_at` of the series they were read with.
        self._network: dict[str, tuple[float, dict[SeriesKey, dict[str, Any]]]] = {}
        self._lock = asyncio.Lock()  # concurrent requests wait for one computation, not start their own

    async def status(self) -> ApiAnswer:
        """Every series of the (whole-fleet) config, from every site that stored runs of it."""
        got = await self._series()
        if isinstance(got, ApiAnswer):
            return got
        return ApiAnswer(200, {**self._head("status", got), "series": got.series})

    async def endpoint(self, name: str) -> ApiAnswer:
        """One endpoint's series; a former name redirects to the current one, an unknown one is a 404."""
        config = self._config()
        ep = config.endpoint(name)
        if ep is None:
            renamed = next((e for e in config.endpoints if name in e.renamed_from), None)
            if renamed is not None:
                return ApiAnswer(301, {}, endpoint_path(renamed.name))
            return _error(404, f"no endpoint named {name[:100]!r}")
        got = await self._series()
        if isinstance(got, ApiAnswer):
            return got
        store = self._store()
        if store is None:  # switched off by a reload since
            return _error(503, "storage is off (storage.enabled: false): the status API reads the store")
        cached = self._network.get(ep.name)
        if cached is not None and cached[0] == got.at:
            network = cached[1]  # as old as the series it goes with: one query per endpoint and max_age_s
        else:
            try:
                network = await network_of(store, got.config, ep.name, got.at)
            except StorageError as exc:
                return _error(503, f"store unavailable ({redact(str(exc))})")
            self._network = {
                **{k: v for k, v in self._network.items() if v[0] == got.at},
                ep.name: (got.at, network),
            }
        series = [
            {**s, "network": network.get(SeriesKey(s["endpoint"], s["workload"], s["site"]))}
            for s in got.series
            if s["endpoint"] == ep.name
        ]
        return ApiAnswer(200, {**self._head("endpoint", got), "endpoint": ep.name, "series": series})

    @staticmethod
    def _head(kind: str, got: _Computed) -> dict[str, Any]:
        schedule = got.config.schedule
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": kind,
            "generated_at": got.at,
            "site": got.config.site_name,
            "primary_window": window_label(schedule.window),
            "windows": [window_label(s) for s in api_windows(got.config)],
            "min_samples": {f"p{percentile_label(q)}": n for q, n in MIN_SAMPLES.items()},
        }

    async def _series(self) -> _Computed | ApiAnswer:
        store, config = self._store(), self._config()
        if store is None:
            return _error(503, "storage is off (storage.enabled: false): the status API reads the store")
        async with self._lock:
            now = self._clock()
            done = self._computed
            if done is not None and done.config is config and now - done.at < self._max_age_s:
                return done
            try:
                series = await build_series(store, config, now, self._pricing)
            except StorageError as exc:
                message = redact(str(exc))
                log.warning("status API: store unavailable: %s", message)
                return _error(503, f"store unavailable ({message})")
            self._computed = _Computed(now, config, series)
            return self._computed


async def network_of(
    store: RunStore, config: Config, endpoint: str, now: float
) -> dict[SeriesKey, dict[str, Any]]:
    """Each series of the endpoint: network vs server time over its runs of the last 24 h that the window
    rule counts (tokwatch.storage.network_time), as JSON; a series without an ok run with a TTFT is absent."""
    rule = WindowRule.of(config.schedule.window_includes)
    runs = await store.recent_runs(now - WINDOW_S, None, endpoint=endpoint, rule=rule)
    return {key: split.as_dict() for key, rs in runs.items() if (split := network_time(rs)) is not None}


def api_windows(config: Config) -> tuple[float, ...]:
    """The windows the API answers for: the configured ones and API_WINDOWS_S, shortest first."""
    return window_lengths(config.schedule.window, (*config.schedule.windows, *API_WINDOWS_S))


def endpoint_path(name: str) -> str:
    """The API path of an endpoint."""
    return f"/api/v1/endpoints/{quote(name, safe='')}"


async def build_series(
    store: RunStore,
    config: Config,
    now: float,
    pricing: Callable[[str], tuple[Pricing, str] | None] = lambda _: None,
) -> list[dict[str, Any]]:
    """One document per series the status page shows (tokwatch.statuspage.model.series_of)."""
    rule = WindowRule.of(config.schedule.window_includes)
    lengths = api_windows(config)
    names = [e.name for e in config.endpoints]
    figures = await asyncio.gather(
        *(window_figures(store, now, rule=rule, window_s=s, endpoints=names) for s in lengths)
    )
    last = await store.last_runs(0.0)
    endpoints = {e.name: e for e in config.endpoints}
    labels = [window_label(s) for s in lengths]
    costs, capacities = await series_costs(store, config, now, pricing)
    out = []
    for key in series_of(config, list(last)):
        ep = endpoints[key.endpoint]
        cost, energy = costs.get(key) or priced_only(ep, config, pricing, capacities.get(ep.name))
        doc = _series_doc(ep, key, last.get(key), [f.get(key) for f in figures], labels)
        out.append({**doc, "cost": _cost_doc(cost), "energy": _energy_doc(energy)})
    return out


def _cost_doc(cost: CostFigures | None) -> dict[str, Any] | None:
    if cost is None:
        return None
    doc = dataclasses.asdict(cost)
    doc.pop("effective_prompt_per_mtok")
    return doc


def _energy_doc(energy: EnergyFigures | None) -> dict[str, Any] | None:
    return None if energy is None else dataclasses.asdict(energy)


def _series_doc(
    ep: EndpointSettings,
    key: SeriesKey,
    last: LastRun | None,
    figures: Sequence[WindowFigures | None],
    labels: Sequence[str],
) -> dict[str, Any]:
    return {
        "endpoint": key.endpoint,
        "workload": key.workload,
        "site": key.site,
        "model": ep.model,
        "labels": dict(ep.labels),
        "status": last.status if last else None,
        "last_run": None
        if last is None
        else {
            "time": last.time,
            "status": last.status,
            "ok_time": last.ok_time,
            "ok_tokens_per_second": last.ok_tokens_per_second,
            "ok_timing_source": last.ok_timing_source,
        },
        "windows": {label: _window_doc(f) for label, f in zip(labels, figures, strict=True)},
    }


def _window_doc(f: WindowFigures | None) -> dict[str, Any]:
    if f is None:  # no counted run in the window
        empty = _percentiles_doc(Percentiles())
        return {
            "runs": 0,
            "ok_runs": 0,
            "uptime": None,
            "cv": None,
            "cache_assisted_runs": 0,
            "decode_tokens_per_second": empty,
            "prefill_tokens_per_second": empty,
            "ttft_seconds": empty,
        }
    return {
        "runs": f.runs,
        "ok_runs": f.ok_runs,
        "uptime": f.uptime,
        "cv": f.cv,
        "cache_assisted_runs": f.cache_assisted_runs,
        "decode_tokens_per_second": _percentiles_doc(f.decode_percentiles),
        "prefill_tokens_per_second": _percentiles_doc(f.prefill_percentiles),
        "ttft_seconds": _percentiles_doc(f.ttft_percentiles),
    }


def _percentiles_doc(p: Percentiles) -> dict[str, Any]:
    return {"samples": p.samples, "p50": p.p50, "p90": p.p90, "p99": p.p99}


def _error(status: int, message: str) -> ApiAnswer:
    return ApiAnswer(status, {"schema_version": SCHEMA_VERSION, "kind": "error", "error": message})
