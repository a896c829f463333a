"""The simulator's prefix cache, as `tokwatch bench` relies on it: a repeated prompt is answered faster (only
its uncached tokens are prefilled) and every dialect reports it the way its real server does."""

from __future__ import annotations

import aiohttp
import pytest
from simhelpers import read_ndjson, read_sse, sim_config

from tokwatch.sim.testing import run_sim

# 200 words = 260 prompt tokens; 2,000 tok/s of prefill: 130 ms uncached.
CFG = """
servers:
  - {name: oa, dialect: openai, models: [{name: m, decode_tps: 1000, prefill_tps: 2000}]}
  - {name: lc, dialect: llamacpp, models: [{name: m, decode_tps: 1000, prefill_tps: 2000}]}
  - {name: ol, dialect: ollama, models: [{name: m, decode_tps: 1000, prefill_tps: 2000}]}
"""
PROMPT = " ".join(["word"] * 199 + ["end"])


async def _ask(http: aiohttp.ClientSession, url: str, server: str, text: str) -> dict:
    messages = [{"role": "user", "content": text}]
    if server == "ol":
        async with http.post(f"{url}/ol/api/chat", json={"model": "m", "messages": messages}) as resp:
            lines = await read_ndjson(resp)
            return {"id": resp.headers["x-sim-request-id"], "final": lines[-1]}
    body = {"model": "m", "messages": messages, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with http.post(f"{url}/{server}/v1/chat/completions", json=body) as resp:
        read = await read_sse(resp)
        return {"id": resp.headers["x-sim-request-id"], "final": read.events[-1]}


@pytest.mark.parametrize("server", ["oa", "lc", "ol"])
async def test_a_repeated_prompt_is_prefilled_from_cache_and_reported(
    http: aiohttp.ClientSession, server: str
) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        first = await _ask(http, sim.url, server, PROMPT)
        again = await _ask(http, sim.url, server, PROMPT)
        other = await _ask(http, sim.url, server, "fresh " + PROMPT)  # differs from its first token on
        cold, warm, fresh = (sim.truth(x["id"]) for x in (first, again, other))
    assert cold is not None and warm is not None and fresh is not None
    assert cold.prompt_tokens == warm.prompt_tokens == 200 and cold.cached_tokens == 0 == fresh.cached_tokens
    # llama.cpp and Ollama reuse all but the last prompt token, vLLM-style servers whole 16-token blocks.
    assert warm.cached_tokens == (192 if server == "oa" else 199)
    assert cold.prefill_seconds == pytest.approx(200 / 2000)
    assert warm.prefill_seconds == pytest.approx((200 - warm.cached_tokens) / 2000)
    assert warm.emitted_at[0] - warm.arrival < cold.emitted_at[0] - cold.arrival - 0.05  # answered faster
    final = again["final"]
    if server == "oa":
        assert final["usage"]["prompt_tokens_details"] == {"cached_tokens": 192}
    elif server == "lc":
        assert final["usage"]["prompt_tokens_details"] == {"cached_tokens": 199}
        assert (final["timings"]["cache_n"], final["timings"]["prompt_n"]) == (199, 1)
    else:
        assert final["prompt_eval_count"] == 1  # Ollama counts only the tokens it evaluated
