"""Ground truth: consistent with what a client sees, deterministic for a seed, bounded in memory."""

from __future__ import annotations

import asyncio

import aiohttp
from simhelpers import chat_body, read_sse, sim_config

from tokwatch.sim.testing import run_sim
from tokwatch.sim.text import count_prompt_tokens
from tokwatch.sim.truth import RequestTruth, TruthStore

CFG = """
seed: 42
truth_capacity: 3
servers:
  - name: v
    dialect: vllm
    models: [{name: m, decode_tps: 400, jitter: 0.3, prefill_tps: 10000}]
"""


async def test_client_gaps_match_true_emission(http: aiohttp.ClientSession) -> None:
    async with (
        run_sim(sim_config(CFG)) as sim,
        http.post(f"{sim.url}/v/v1/chat/completions", json=chat_body(max_tokens=12)) as resp,
    ):
        read = await read_sse(resp)
        truth = sim.truth(resp.headers["x-sim-request-id"])
    assert truth is not None and truth.tokens == 12
    client = read.arrival[1:]  # content chunks (vLLM sends no separate finish chunk)
    emitted = truth.emitted_at
    assert len(client) == len(emitted) == 12
    # The client reads each chunk after the sim wrote it, on the same clock (a loose correctness bound).
    assert all(0 <= c - e < 0.5 for c, e in zip(client, emitted, strict=True))
    client_span = client[-1] - client[0]
    true_span = emitted[-1] - emitted[0]
    assert abs(client_span - true_span) < 0.25
    assert truth.planned_at == sorted(truth.planned_at)
    assert all(g >= p - 1e-6 for g, p in zip(truth.generated_at, truth.planned_at, strict=True))


async def _planned_offsets() -> list[list[float]]:
    """Planned token times relative to the end of prefill, for three sequential requests."""
    out: list[list[float]] = []
    async with run_sim(sim_config(CFG)) as sim, aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(f"{sim.url}/v/v1/chat/completions", json=chat_body(max_tokens=6)) as resp:
                await resp.read()
                truth = sim.truth(resp.headers["x-sim-request-id"])
            assert truth is not None and truth.prefill_end is not None
            out.append([round(t - truth.prefill_end, 9) for t in truth.planned_at])
    return out


async def test_same_seed_same_plan() -> None:
    first = await _planned_offsets()
    second = await _planned_offsets()
    assert first == second
    assert first[0] != first[1]  # each request draws its own jittered gaps


async def test_other_seed_other_plan() -> None:
    first = await _planned_offsets()
    global CFG
    saved = CFG
    CFG = CFG.replace("seed: 42", "seed: 43")
    try:
        other = await _planned_offsets()
    finally:
        CFG = saved
    assert first != other


async def test_truth_ring_is_bounded(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        ids = []
        for _ in range(4):
            async with http.post(f"{sim.url}/v/v1/chat/completions", json=chat_body(max_tokens=1)) as resp:
                ids.append(resp.headers["x-sim-request-id"])
        assert sim.truth(ids[0]) is None
        assert all(sim.truth(i) is not None for i in ids[1:])
        assert len(sim.state.truth) == 3


def test_prompt_token_count() -> None:
    assert count_prompt_tokens(["Explain theory of relativity simply"]) == 5
    assert count_prompt_tokens(["one two", "three  four\nfive six"]) == 6  # 6 words, one token each
    assert count_prompt_tokens([""]) == 1


def test_truth_store_last_skips_background() -> None:
    store = TruthStore(10)
    fg = RequestTruth("a", "s", "m", "vllm", "/", 0, 0, True, 1.0, 3, 5, 1)
    bg = RequestTruth("b", "s", "m", "vllm", "/", 1, 0, False, 2.0, 3, 5, 1, background=True)
    store.add(fg)
    store.add(bg)
    assert store.last("s") is fg
    assert store.last("other") is None


async def test_contention_stretches_planned_gaps(http: aiohttp.ClientSession) -> None:
    cfg = sim_config(
        "servers:\n  - name: c\n    dialect: vllm\n"
        "    models: [{name: m, decode_tps: 200, contention: 1.0}]\n"
    )
    async with run_sim(cfg) as sim:

        async def one() -> str:
            url = f"{sim.url}/c/v1/chat/completions"
            async with http.post(url, json=chat_body(max_tokens=30, stream=False)) as resp:
                await resp.read()
                return resp.headers["x-sim-request-id"]

        ids = await asyncio.gather(one(), one())
        truths = [sim.truth(i) for i in ids]
    gaps: list[float] = []
    for truth in truths:
        assert truth is not None and truth.tokens == 30
        gaps += [b - a for a, b in zip(truth.planned_at, truth.planned_at[1:], strict=False)]
    # Each planned gap is 5 ms x (1 + 1.0 x (running - 1)): 5 ms alone, 10 ms while both decode.
    assert all(abs(g - 0.005) < 1e-9 or abs(g - 0.010) < 1e-9 for g in gaps)
    assert any(abs(g - 0.010) < 1e-9 for g in gaps)  # the two 150 ms requests overlapped


async def test_recent_truth_listing_by_model(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        ids = []
        for _ in range(2):
            async with http.post(f"{sim.url}/v/v1/chat/completions", json=chat_body(max_tokens=1)) as resp:
                ids.append(resp.headers["x-sim-request-id"])
        async with http.get(f"{sim.url}/_sim/requests", params={"model": "m", "last": "5"}) as resp:
            listed = (await resp.json())["requests"]
        async with http.get(f"{sim.url}/_sim/requests", params={"model": "other"}) as resp:
            assert (await resp.json())["requests"] == []
        async with http.get(f"{sim.url}/_sim/requests", params={"last": "x"}) as resp:
            assert resp.status == 400
    assert [r["request_id"] for r in listed] == ids  # oldest first
