"""The exporter's HTTP interface: status page (/, /endpoints/NAME, /compare), status API (/api/v1/...),
/metrics, /probe, /-/ready, /-/reload."""

from __future__ import annotations

import asyncio
import gzip
import html
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import choose_encoder

from tokwatch.metrics.exposition import CONTENT_TYPES, negotiate
from tokwatch.metrics.probe import probe_result_families
from tokwatch.serve.status_api import ApiAnswer, StatusApi
from tokwatch.settings import webconfig
from tokwatch.settings.webconfig import WebConfig
from tokwatch.statuspage import Page, StatusPages

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from tokwatch.service.app import App

log = logging.getLogger("tokwatch.serve.server")
_GZIP_MIN_BYTES = 1024  # smaller bodies are not worth a thread hop
APP_KEY = web.AppKey("tokwatch_app", object)
PAGES_KEY = web.AppKey("tokwatch_pages", StatusPages)
API_KEY = web.AppKey("tokwatch_api", StatusApi)
_SCRAPE_TIMEOUT_OFFSET_S = 0.5  # leave Prometheus time to receive the answer, as blackbox_exporter does


class _Families:
    """Throwaway collector: /probe answers from a fresh registry, so probes' metrics never mix."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _app(request: web.Request) -> App:
    return request.app[APP_KEY]  # type: ignore[return-value]


def _exposition(request: web.Request, registry: CollectorRegistry) -> web.Response:
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return web.Response(body=encoder(registry), headers={"Content-Type": content_type})


async def metrics(request: web.Request) -> web.Response:
    """Scheduled-probe metrics from pre-rendered pieces; never waits on a probe, network or database.

    OpenMetrics when the Accept header asks for it (Prometheus does), else the text format 0.0.4. Gzipped
    when the scraper accepts it (Prometheus does), in a thread: zlib releases the interpreter lock, so
    compressing a large fleet's exposition holds neither the loop nor the probes' thread."""
    fmt = negotiate(request.headers.get("Accept", ""))
    body = _app(request).exposition.render(fmt)
    headers = {"Content-Type": CONTENT_TYPES[fmt], "Vary": "Accept"}
    if _accepts_gzip(request) and len(body) > _GZIP_MIN_BYTES:
        body = await asyncio.to_thread(_gzip, body)
        headers["Content-Encoding"] = "gzip"
        headers["Vary"] = "Accept, Accept-Encoding"
    return web.Response(body=body, headers=headers)


def _accepts_gzip(request: web.Request) -> bool:
    for part in request.headers.get("Accept-Encoding", "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def _gzip(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=1, mtime=0)  # level 1: ~5x smaller, several times faster than 6


async def probe(request: web.Request) -> web.Response:
    """Blackbox-style: probe one configured endpoint now (`workload=`: one of its workloads, else its
    first) and return only its metrics."""
    app = _app(request)
    target = request.query.get("target", "")
    if not target:
        return web.Response(status=400, text="target parameter is missing\n")
    ep = app.config.endpoint(target)
    owner = app.owner_of(target)
    if ep is None and owner is not None:
        return web.Response(
            status=400,
            text=f"{html.escape(target[:100])} is probed by shard {owner}/{app.shard.count}, not this one "
            f"({app.shard.label})\n",
        )
    if ep is None:
        # Only configured endpoint names: a URL or unknown name is refused, never requested (no open proxy).
        shown = html.escape(target[:100])
        return web.Response(
            status=400, text=f"unknown target {shown!r}: /probe accepts configured endpoint names\n"
        )
    workload = request.query.get("workload") or None
    if workload is not None and app.config.workload_for(ep, workload) is None:
        names = ", ".join(w.name for w in app.config.workloads_for(ep))
        return web.Response(
            status=400,
            text=f"endpoint {html.escape(target[:100])} has no workload {html.escape(workload[:40])!r} "
            f"(its workloads: {names})\n",
        )
    outcome = await app.probe_on_demand(target, _scrape_timeout(request), workload)
    if outcome is None:
        # The scraper would give up before the run ends; the run goes on with the endpoint's own timeout
        # and is recorded, so the scrape fails rather than report a timeout that did not happen.
        return web.Response(
            status=503, text=f"probe of {target} still running; its result will be recorded when it ends\n"
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(probe_result_families(outcome.result, ep, app.config.site_name)))
    if request.query.get("debug", "").lower() in ("true", "1", "yes"):
        body = (
            "Logs for the probe:\n"
            + "\n".join(outcome.log.lines)
            + "\n\nMetrics that would have been returned:\n"
        )
        return web.Response(text=body + generate_latest(registry).decode(), content_type="text/plain")
    return _exposition(request, registry)


def _scrape_timeout(request: web.Request) -> float | None:
    raw = request.headers.get("X-Prometheus-Scrape-Timeout-Seconds")
    if raw is None:
        return None
    try:
        return max(0.5, float(raw) - _SCRAPE_TIMEOUT_OFFSET_S)
    except ValueError:
        return None


async def healthy(request: web.Request) -> web.Response:
    """Liveness."""
    return web.Response(text="tokwatch is healthy\n")


async def ready(request: web.Request) -> web.Response:
    """Readiness: config loaded and probing started."""
    if _app(request).ready:
        return web.Response(text="tokwatch is ready\n")
    return web.Response(status=503, text="tokwatch is not ready\n")


async def reload(request: web.Request) -> web.Response:
    """Re-read the config file (as SIGHUP does)."""
    ok, message = await _app(request).reload()
    return web.Response(status=200 if ok else 500, text=message + "\n")


async def index(request: web.Request) -> web.Response:
    """The status page: a tile per endpoint of the fleet, read from the store."""
    return _html(await request.app[PAGES_KEY].overview())


async def endpoint_page(request: web.Request) -> web.Response:
    """One endpoint's 90-day history, incidents and last runs (`?workload=`, `?site=`: of that series)."""
    workload, site = request.query.get("workload"), request.query.get("site")
    return _html(await request.app[PAGES_KEY].endpoint(request.match_info["name"], workload, site))


async def compare_page(request: web.Request) -> web.Response:
    """A workload's endpoints side by side (`?workload=`, sorted by `?sort=` at `?site=`, `?order=`)."""
    q = request.query
    page = await request.app[PAGES_KEY].compare(
        q.get("workload"), q.get("sort", "decode"), q.get("site"), q.get("order")
    )
    return _html(page)


async def api_status(request: web.Request) -> web.Response:
    """Every series' newest run, uptime, percentiles and status as JSON (docs/api.md)."""
    return _json(await request.app[API_KEY].status())


async def api_endpoint(request: web.Request) -> web.Response:
    """One endpoint's series as JSON; 404 with a JSON error for an unknown endpoint."""
    return _json(await request.app[API_KEY].endpoint(request.match_info["name"]))


def _json(answer: ApiAnswer) -> web.Response:
    if answer.location is not None:
        raise web.HTTPMovedPermanently(answer.location)
    return web.json_response(answer.body, status=answer.status, headers={"Cache-Control": "no-store"})


def _html(page: Page) -> web.Response:
    if page.location is not None:
        raise web.HTTPMovedPermanently(page.location)
    return web.Response(status=page.status, text=page.body, content_type="text/html")


def build_web_app(app: App, web_config: WebConfig | None = None) -> web.Application:
    """The aiohttp application serving `app`; `web_config` adds basic auth and headers to every route."""
    web_app = web.Application(middlewares=[webconfig.middleware(web_config)] if web_config else [])
    web_app[APP_KEY] = app
    web_app[PAGES_KEY] = StatusPages(lambda: app.store, lambda: app.full_config, pricing=app.fleet_pricing)
    web_app[API_KEY] = StatusApi(lambda: app.store, lambda: app.full_config, pricing=app.fleet_pricing)
    web_app.add_routes(
        [
            web.get("/", index),
            web.get("/endpoints/{name}", endpoint_page),
            web.get("/compare", compare_page),
            web.get("/api/v1/status", api_status),
            web.get("/api/v1/endpoints/{name}", api_endpoint),
            web.get("/metrics", metrics),
            web.get("/probe", probe),
            web.get("/-/healthy", healthy),
            web.get("/-/ready", ready),
            web.post("/-/reload", reload),
        ]
    )
    return web_app


async def start_site(
    app: App, host: str, port: int, web_config: tuple[WebConfig, Path] | None = None
) -> tuple[web.AppRunner, int]:
    """Serve on host:port (0 = any free port), over TLS when the web config says so; returns the runner and
    the bound port."""
    cfg, base = web_config if web_config is not None else (None, None)
    runner = web.AppRunner(
        build_web_app(app, cfg), access_log=None, handle_signals=False, shutdown_timeout=2.0
    )
    await runner.setup()
    ctx = webconfig.ssl_context(cfg, base) if cfg is not None and base is not None else None
    site = web.TCPSite(runner, host, port, ssl_context=ctx)
    await site.start()
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    return runner, bound
