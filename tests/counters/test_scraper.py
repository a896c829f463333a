"""ServerCounters against a real aiohttp /metrics server on 127.0.0.1 that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from tokwatch.counters import ServerCollector, ServerCounters
from tokwatch.settings.config import EndpointSettings
from tokwatch.transport.http import HttpClient


@dataclass
class FakeServer:
    url: str
    texts: list[str] = field(default_factory=list)  # served in order by /metrics, last one repeated
    hits: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)  # lets /slow finish at teardown


def _routes(server: FakeServer) -> web.Application:
    async def metrics(_req: web.Request) -> web.Response:
        server.hits += 1
        text = server.texts[min(server.hits, len(server.texts)) - 1]
        return web.Response(text=text, content_type="text/plain")

    async def malformed(_req: web.Request) -> web.Response:
        return web.Response(text='vllm:generation_tokens_total{engine="0" 12\n')

    async def truncated(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": "5000"})
        await resp.prepare(req)
        await resp.write(b'vllm:generation_tokens_total{engine="0"} 12\n')
        assert req.transport is not None
        req.transport.close()  # the body ends long before Content-Length
        return resp

    async def cut_mid_line(_req: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:generation_tokens_total{engi")

    async def huge(_req: web.Request) -> web.Response:
        return web.Response(text="x 1\n" * 400_000)

    async def slow(_req: web.Request) -> web.Response:
        await asyncio.wait_for(server.release.wait(), timeout=10)
        return web.Response(text="x 1\n")

    async def error(_req: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    for path, handler in (
        ("/malformed", malformed),
        ("/truncated", truncated),
        ("/cut", cut_mid_line),
        ("/huge", huge),
        ("/slow", slow),
        ("/error", error),
    ):
        app.router.add_get(path, handler)
    return app


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    fake = FakeServer(url="")
    runner = web.AppRunner(_routes(fake))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        fake.url = f"http://127.0.0.1:{port}"
        yield fake
    finally:
        fake.release.set()
        await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[HttpClient]:
    async with HttpClient() as client:
        yield client


def endpoint(metrics_url: str, **kw: object) -> EndpointSettings:
    return EndpointSettings.model_validate(
        {
            "name": "ep1",
            "kind": "vllm",
            "base_url": "http://127.0.0.1:1/v1",
            "model": "m",
            "metrics_url": metrics_url,
            **kw,
        }
    )


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/malformed", "MetricsParseError"),
        ("/cut", "MetricsParseError"),
        ("/truncated", "TransportError"),
        ("/huge", "TransportError"),
        ("/slow", "TransportError"),
        ("/error", "HttpStatusError"),
    ],
)
async def test_bad_metrics_are_counted_logged_and_never_raise(
    server: FakeServer, http: HttpClient, caplog: pytest.LogCaptureFixture, path: str, why: str
) -> None:
    counters = ServerCounters(endpoint(server.url + path), http, timeout=0.5, max_bytes=1024 * 1024)
    registry = CollectorRegistry()
    registry.register(ServerCollector([counters.state]))
    with caplog.at_level(logging.WARNING, logger="tokwatch.counters"):
        assert await counters.scrape_once() is None
        assert await counters.window.snapshot() is None
    assert registry.get_sample_value("tokwatch_server_scrape_errors_total", {"endpoint": "ep1"}) == 2
    assert registry.get_sample_value("tokwatch_server_up", {"endpoint": "ep1"}) == 0
    assert any("endpoint ep1" in r.getMessage() and why in r.getMessage() for r in caplog.records)


async def test_unreachable_server_is_down_and_credentials_are_masked(
    http: HttpClient, caplog: pytest.LogCaptureFixture, free_port: Callable[[], int]
) -> None:
    port = free_port()
    counters = ServerCounters(endpoint(f"http://admin:s3cretpw@127.0.0.1:{port}/metrics"), http, timeout=1)
    with caplog.at_level(logging.WARNING, logger="tokwatch.counters"):
        assert await counters.scrape_once() is None
    assert not counters.state.view.up
    assert "s3cretpw" not in caplog.text and "endpoint ep1" in caplog.text


async def test_scrape_window_and_loop(
    server: FakeServer, http: HttpClient, vllm_text: Callable[..., str]
) -> None:
    server.texts = [
        vllm_text(gen_sum=0, gen_count=0, decode_s=0, generation=0, success=0),
        vllm_text(gen_sum=129, gen_count=1, decode_s=1.28, generation=129, success=1, running=1),
        vllm_text(gen_sum=258, gen_count=2, decode_s=2.56, generation=258, success=2),
    ]
    counters = ServerCounters(endpoint(server.url + "/metrics", scrape_interval="50ms"), http)
    before = await counters.window.snapshot()
    after = await counters.window.snapshot()
    m = counters.window.measure(before, after)
    assert m.tokens_per_second == pytest.approx(100.0) and not m.shared
    assert not counters.state.scraped  # window snapshots leave the exported rates alone
    await counters.start()
    try:
        for _ in range(100):
            if counters.state.view.up and server.hits >= 5:
                break
            await asyncio.sleep(0.02)
    finally:
        await counters.close()
    assert counters.state.view.up and server.hits >= 5
    assert counters.state.scrape_errors == 0
    hits = server.hits
    await asyncio.sleep(0.15)
    assert server.hits == hits  # the loop really stopped


def test_endpoint_without_metrics_url_is_rejected() -> None:
    ep = EndpointSettings(name="o", kind="openai", base_url="http://127.0.0.1:1/v1", model="m")
    with pytest.raises(ValueError, match="endpoint o: kind openai has no metrics_url"):
        ServerCounters(ep, HttpClient())
