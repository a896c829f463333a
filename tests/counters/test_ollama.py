"""Ollama signals: reloads from cold timed runs, VRAM share from a real /api/ps server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from tokwatch.counters import OllamaSignals, ServerCollector
from tokwatch.counters.ollama import OllamaPsError, vram_ratio_from_ps
from tokwatch.figures.result import RunResult, Status
from tokwatch.settings.config import EndpointSettings
from tokwatch.transport.http import HttpClient


def ps_body(*models: tuple[str, int, int]) -> str:
    return json.dumps(
        {"models": [{"name": n, "model": n, "size": size, "size_vram": vram} for n, size, vram in models]}
    )


@pytest.fixture
async def ps_server() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    state: dict[str, Any] = {"body": ps_body(), "status": 200}

    async def ps(_req: web.Request) -> web.Response:
        return web.Response(text=state["body"], status=state["status"], content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/ps", ps)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", state
    finally:
        await runner.cleanup()


def test_vram_ratio_parsing() -> None:
    body = ps_body(("llama3:latest", 1000, 600), ("other:7b", 10, 10))
    assert vram_ratio_from_ps(body, "llama3") == pytest.approx(0.6)
    assert vram_ratio_from_ps(body, "other:7b") == 1.0
    assert vram_ratio_from_ps(body, "absent") is None
    with pytest.raises(OllamaPsError, match="not JSON"):
        vram_ratio_from_ps("<html>", "llama3")
    with pytest.raises(OllamaPsError, match="no 'models' list"):
        vram_ratio_from_ps("{}", "llama3")
    with pytest.raises(OllamaPsError, match="lacks numeric size"):
        vram_ratio_from_ps(json.dumps({"models": [{"name": "llama3"}]}), "llama3")


async def test_signals_against_a_real_api_ps(ps_server: tuple[str, dict[str, Any]]) -> None:
    url, served = ps_server
    ep = EndpointSettings(
        name="ol", kind="ollama", base_url=f"{url}/v1", model="llama3", scrape_interval=0.05
    )
    registry = CollectorRegistry()
    collector = ServerCollector()
    registry.register(collector)
    labels = {"endpoint": "ol"}
    async with HttpClient() as http:
        signals = OllamaSignals(ep, http, timeout=2)
        collector.add(signals.state)
        signals.observe(RunResult("ol", 0.0, Status.OK, cold=False))
        signals.observe(RunResult("ol", 0.0, Status.OK, cold=True))  # load_duration > 0 on the hot run
        assert registry.get_sample_value("tokwatch_server_model_reloads_total", labels) == 1
        served["body"] = ps_body(("llama3:latest", 1000, 250))  # partly offloaded to the CPU
        assert await signals.poll() == pytest.approx(0.25)
        assert registry.get_sample_value("tokwatch_server_model_vram_ratio", labels) == pytest.approx(0.25)
        assert registry.get_sample_value("tokwatch_server_up", labels) == 1
        served["body"] = ps_body()  # evicted: no ratio rather than a stale one
        await signals.start()
        try:
            for _ in range(100):
                if registry.get_sample_value("tokwatch_server_model_vram_ratio", labels) is None:
                    break
                await asyncio.sleep(0.02)
        finally:
            await signals.close()
        assert registry.get_sample_value("tokwatch_server_model_vram_ratio", labels) is None
        served["status"] = 500
        assert await signals.poll() is None
        assert registry.get_sample_value("tokwatch_server_scrape_errors_total", labels) == 1
        assert registry.get_sample_value("tokwatch_server_up", labels) == 0
        assert registry.get_sample_value("tokwatch_server_model_reloads_total", labels) == 1
