"""Ollama emulation: NDJSON streams by default, durations in nanoseconds, thinking, /api/ps."""

from __future__ import annotations

import aiohttp
from simhelpers import read_ndjson, sim_config

from tokwatch.sim.testing import run_sim

CFG = """
seed: 3
servers:
  - name: ol
    dialect: ollama
    models:
      - {name: "llama3.2:latest", decode_tps: 2000, vram_fraction: 0.5, size_bytes: 1000}
      - {name: thinker, decode_tps: 2000, think_tokens: 2}
      - {name: cloud, decode_tps: 2000, strip_eval_duration: true}
      - {name: cold, decode_tps: 2000, cold_load_probability: 1.0, cold_load_duration: 20ms}
"""
FINAL_KEYS = {
    "model",
    "created_at",
    "message",
    "done_reason",
    "done",
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
}


def _chat(model: str, n: int = 5, **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi there"}],
        "options": {"num_predict": n},
        **extra,
    }


async def test_chat_streams_by_default(http: aiohttp.ClientSession) -> None:
    async with (
        run_sim(sim_config(CFG)) as sim,
        http.post(f"{sim.url}/ol/api/chat", json=_chat("llama3.2")) as resp,
    ):
        assert resp.headers["Content-Type"] == "application/x-ndjson"
        lines = await read_ndjson(resp)
        truth = sim.truth(resp.headers["x-sim-request-id"])
    assert [ln["done"] for ln in lines] == [False] * 5 + [True]
    assert "".join(ln["message"]["content"] for ln in lines) == "The speed of light is"
    final = lines[-1]
    assert set(final) == FINAL_KEYS
    assert final["done_reason"] == "length" and final["eval_count"] == 5 and final["load_duration"] == 0
    assert truth is not None and truth.prefill_end is not None
    # eval_duration spans the decode steps of all eval_count tokens: prefill end to the last token.
    expected_ns = (truth.generated_at[-1] - truth.prefill_end) * 1e9
    assert abs(final["eval_duration"] - expected_ns) < 1000
    assert final["total_duration"] >= final["eval_duration"] + final["prompt_eval_duration"]


async def test_generate_non_stream_with_thinking(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        body = {"model": "thinker", "prompt": "why", "stream": False, "options": {"num_predict": 5}}
        async with http.post(f"{sim.url}/ol/api/generate", json=body) as resp:
            data = await resp.json()
        async with http.post(f"{sim.url}/ol/api/chat", json=_chat("thinker", stream=False)) as resp:
            chat = await resp.json()
    assert data["response"] == "The speed of" and data["thinking"] == "Let me"
    assert data["done"] is True and isinstance(data["context"], list)
    assert chat["message"] == {"role": "assistant", "content": "The speed of", "thinking": "Let me"}


async def test_strip_eval_duration_and_cold_load(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        async with http.post(f"{sim.url}/ol/api/chat", json=_chat("cloud", stream=False)) as resp:
            cloud = await resp.json()
        async with http.post(f"{sim.url}/ol/api/chat", json=_chat("cold", stream=False)) as resp:
            cold = await resp.json()
    assert "eval_duration" not in cloud and cloud["eval_count"] == 5
    assert cold["load_duration"] == 20_000_000
    assert cold["total_duration"] > 20_000_000


async def test_ps_tags_and_errors(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        async with http.get(f"{sim.url}/ol/api/ps") as resp:
            ps = await resp.json()
        async with http.get(f"{sim.url}/ol/api/tags") as resp:
            tags = await resp.json()
        async with http.post(f"{sim.url}/ol/api/chat", json=_chat("missing")) as resp:
            missing = (resp.status, await resp.json())
    first = ps["models"][0]
    assert first["name"] == "llama3.2:latest" and first["size"] == 1000 and first["size_vram"] == 500
    assert len(tags["models"]) == 4
    assert missing == (404, {"error": 'model "missing" not found, try pulling it first'})
