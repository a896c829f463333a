"""Hostile behaviours, background traffic and serve_sim's lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import aiohttp
import pytest
from simhelpers import chat_body, read_sse, sim_config

from tokwatch.sim.server import serve_sim
from tokwatch.sim.testing import run_sim

CFG = """
servers:
  - name: h
    dialect: openai
    models:
      - {name: endless, decode_tps: 2000, endless_stream: true}
      - {name: huge, decode_tps: 2000, huge_body_bytes: 300000}
      - {name: badutf, decode_tps: 2000, invalid_utf8: true}
  - name: busy
    dialect: vllm
    background_rps: 200
    background_max_tokens: 5
    models: [{name: m, decode_tps: 2000}]
"""


async def test_endless_stream_keeps_going_until_the_client_leaves(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        chunks = 0
        async with http.post(f"{sim.url}/h/v1/chat/completions", json=chat_body("endless", 5)) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    chunks += 1
                if chunks >= 50:
                    break
        engine = sim.server("h").engines[0]
        for _ in range(100):
            if not engine.running:
                break
            await asyncio.sleep(0.02)
        assert not engine.running  # released once the client disconnected
    assert chunks == 50  # far beyond max_tokens=5


async def test_huge_body_and_invalid_utf8(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        url = f"{sim.url}/h/v1/chat/completions"
        async with http.post(url, json=chat_body("huge", 3, stream=False)) as resp:
            huge = await resp.read()
        async with http.post(url, json=chat_body("badutf", 3, stream=False)) as resp:
            bad = await resp.read()
        async with http.post(url, json=chat_body("badutf", 3)) as resp:
            bad_stream = await resp.read()
    assert len(huge) > 300000 and json.loads(huge)["usage"]["completion_tokens"] == 3
    for body in (bad, bad_stream):
        assert b"\xff\xfe" in body
        with pytest.raises(UnicodeDecodeError):
            body.decode("utf-8")


async def test_background_traffic_moves_counters(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        metrics = ""
        for _ in range(100):
            await asyncio.sleep(0.02)
            async with http.get(f"{sim.url}/busy/metrics") as resp:
                metrics = await resp.text()
            line = next(x for x in metrics.splitlines() if x.startswith("vllm:generation_tokens_total{"))
            if float(line.rsplit(" ", 1)[1]) > 0:
                break
        async with http.post(f"{sim.url}/busy/v1/chat/completions", json=chat_body(stream=False)) as resp:
            assert resp.status == 200
            rid = resp.headers["x-sim-request-id"]
    assert float(line.rsplit(" ", 1)[1]) > 0
    assert rid == "sim-busy-0"  # background requests use their own sequence
    assert sim.last_truth("busy") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_serve_sim_until_stopped() -> None:
    port = _free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(serve_sim(sim_config(CFG), f"127.0.0.1:{port}", stop))
    try:
        status = None
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/_sim/servers") as resp:
                        status = resp.status
                        servers = await resp.json()
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)
            async with http.post(
                f"http://127.0.0.1:{port}/h/v1/chat/completions", json=chat_body("huge", 2)
            ) as resp:
                read = await read_sse(resp)
        assert status == 200 and [s["name"] for s in servers["servers"]] == ["h", "busy"]
        assert read.done
        stop.set()
        await asyncio.wait_for(task, 10)
    finally:
        stop.set()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    with pytest.raises(OSError):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
