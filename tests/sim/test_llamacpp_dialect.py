"""llama-server emulation: timings, native /completion, /health, /metrics format, close_after_stream."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from simhelpers import chat_body, read_sse, sim_config

from tokwatch.sim.testing import run_sim

CFG = """
servers:
  - name: llama
    dialect: llamacpp
    close_after_stream: true
    models: [{name: smol, decode_tps: 2000, prefill_tps: 5000}]
"""
TIMING_KEYS = [
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
]


def _metrics(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def test_timings_on_finish_chunk_without_include_usage(http: aiohttp.ClientSession) -> None:
    async with (
        run_sim(sim_config(CFG)) as sim,
        http.post(f"{sim.url}/llama/v1/chat/completions", json=chat_body("anything", 6)) as resp,
    ):
        read = await read_sse(resp)
        truth = sim.truth(resp.headers["x-sim-request-id"])
    assert read.events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert read.events[0]["system_fingerprint"] == "b0-unknown"
    finish = read.events[-1]
    assert finish["choices"][0] == {"finish_reason": "length", "index": 0, "delta": {}}
    timings = finish["timings"]
    assert list(timings) == TIMING_KEYS
    assert timings["predicted_n"] == 6
    assert truth is not None and truth.decode_seconds is not None
    # predicted_ms is the true first-to-last decode time; per-token figures use n - 1 gaps, as llama-server.
    assert abs(timings["predicted_ms"] - truth.decode_seconds * 1000) < 0.01
    assert abs(timings["predicted_per_second"] - 5 * 1000 / timings["predicted_ms"]) < 1e-6


async def test_timings_on_usage_chunk_with_include_usage(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        body = chat_body(max_tokens=4, stream_options={"include_usage": True})
        async with http.post(f"{sim.url}/llama/v1/chat/completions", json=body) as resp:
            read = await read_sse(resp)
        async with http.post(f"{sim.url}/llama/v1/chat/completions", json=chat_body(stream=False)) as resp:
            data = await resp.json()
    finish, usage = read.events[-2], read.events[-1]
    assert "timings" not in finish and finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert list(usage["timings"]) == TIMING_KEYS
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    # The second request repeats the prompt: llama.cpp's cache serves all but the last prompt token.
    assert data["timings"]["cache_n"] == data["usage"]["prompt_tokens"] - 1
    assert data["timings"]["prompt_n"] == 1


async def test_native_completion_and_health(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        async with http.get(f"{sim.url}/llama/health") as resp:
            health = await resp.json()
        body = {"prompt": "The capital of France is", "n_predict": 4}
        async with http.post(f"{sim.url}/llama/completion", json=body) as resp:
            data = await resp.json()
        async with http.post(f"{sim.url}/llama/completion", json={**body, "stream": True}) as resp:
            read = await read_sse(resp)
    assert health == {"status": "ok"}
    assert data["content"] == "The speed of light" and data["stop"] is True
    assert data["tokens_predicted"] == 4 and data["stop_type"] == "limit"
    assert list(data["timings"]) == TIMING_KEYS
    assert not read.done  # the native stream has no [DONE]
    assert [e["stop"] for e in read.events] == [False] * 4 + [True]
    assert read.events[-1]["timings"]["predicted_n"] == 4


async def test_metrics_format_and_counters(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        async with http.get(f"{sim.url}/llama/metrics") as resp:
            before = _metrics(await resp.text())
        async with http.post(f"{sim.url}/llama/v1/chat/completions", json=chat_body(stream=False)) as resp:
            data = await resp.json()
        async with http.get(f"{sim.url}/llama/metrics") as resp:
            text = await resp.text()
        after = _metrics(text)
        async with http.get(f"{sim.url}/llama/metrics") as resp:
            again = _metrics(await resp.text())
    assert before["llamacpp:tokens_predicted_total"] == 0
    assert "# TYPE llamacpp:n_decode_total counter" in text
    assert "llamacpp:predicted_tokens_seconds " in text
    assert after["llamacpp:tokens_predicted_total"] == 8
    assert after["llamacpp:prompt_tokens_total"] == data["usage"]["prompt_tokens"]
    assert (
        abs(after["llamacpp:tokens_predicted_seconds_total"] - data["timings"]["predicted_ms"] / 1000) < 1e-4
    )
    assert after["llamacpp:predicted_tokens_seconds"] > 0
    assert again["llamacpp:predicted_tokens_seconds"] == 0  # the gauge resets on every read
    assert again["llamacpp:tokens_predicted_total"] == 8
    assert after["llamacpp:n_busy_slots_per_decode"] == 1


async def test_close_after_stream_with_keep_alive_header() -> None:
    async with run_sim(sim_config(CFG)) as sim:
        port = int(sim.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            payload = b'{"max_tokens": 3, "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
            writer.write(
                b"POST /llama/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + b"Content-Length: %d\r\n\r\n" % len(payload)
                + payload
            )
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), timeout=10)  # returns only at EOF
        finally:
            writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"Keep-Alive: timeout=5, max=100" in head
    assert b"Connection: close" not in head
    assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # complete chunked body, then the server closed
