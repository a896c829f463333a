"""vLLM and SGLang /metrics: real names, valid exposition, moving counters, preemption, legacy, DP."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from simhelpers import chat_body, sim_config

from tokwatch.sim.testing import run_sim

CFG = """
servers:
  - name: v
    dialect: vllm
    kv_capacity_tokens: 40
    models: [{name: m, decode_tps: 1000}]
  - name: kv
    dialect: vllm
    kv_capacity_tokens: 40
    models: [{name: m, decode_tps: 200}]
  - name: old
    dialect: vllm
    legacy_names: true
    models: [{name: m, decode_tps: 2000}]
  - name: dp
    dialect: vllm
    data_parallel: 2
    models: [{name: m, decode_tps: 2000}]
  - name: sg
    dialect: sglang
    models: [{name: m, decode_tps: 2000}]
"""
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _scrape(http: aiohttp.ClientSession, url: str) -> tuple[Samples, dict[str, str]]:
    async with http.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    samples: Samples = {}
    types: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def _sum(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v
        for (n, lab), v in samples.items()
        if n == name and all(dict(lab).get(k) == x for k, x in labels.items())
    )


async def _chat(http: aiohttp.ClientSession, url: str, n: int) -> dict[str, object]:
    async with http.post(url, json=chat_body(max_tokens=n, stream=False)) as resp:
        assert resp.status == 200
        data: dict[str, object] = await resp.json()
        data["_rid"] = resp.headers["x-sim-request-id"]
        return data


async def test_vllm_metrics_parse_and_move(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        before, types = await _scrape(http, f"{sim.url}/v/metrics")
        await _chat(http, f"{sim.url}/v/v1/chat/completions", 7)
        after, _ = await _scrape(http, f"{sim.url}/v/metrics")
        truth = sim.last_truth("v")
    lab = (("engine", "0"), ("model_name", "m"))
    assert types["vllm:generation_tokens"] == "counter"
    assert types["vllm:request_decode_time_seconds"] == "histogram"
    assert ("vllm:generation_tokens_created", lab) in before
    assert before[("vllm:generation_tokens_total", lab)] == 0
    assert after[("vllm:generation_tokens_total", lab)] == 7
    assert _sum(after, "vllm:request_success_total", finished_reason="length") == 1
    assert _sum(after, "vllm:request_success_total", finished_reason="stop") == 0
    assert ("vllm:request_success_total", (lab[0], ("finished_reason", "abort"), lab[1])) in after
    assert after[("vllm:request_generation_tokens_count", lab)] == 1
    assert after[("vllm:inter_token_latency_seconds_count", lab)] == 6
    assert after[("vllm:time_per_output_token_seconds_count", lab)] == 6
    assert after[("vllm:prompt_tokens_total", lab)] == 5
    assert after[("vllm:num_requests_running", lab)] == 0
    assert truth is not None and truth.decode_seconds is not None
    # request_decode_time covers first to last token (n - 1 gaps).
    assert abs(after[("vllm:request_decode_time_seconds_sum", lab)] - truth.decode_seconds) < 1e-9
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_prefill_time_seconds_count",
        "vllm:time_to_first_token_seconds_count",
    ):
        assert (name, lab) in after, name


async def test_prefix_cache_counters(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        body = chat_body(max_tokens=2, stream=False)
        body["messages"][0]["content"] = " ".join(["word"] * 40)  # 40 prompt tokens
        for _ in range(2):
            async with http.post(f"{sim.url}/dp/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        after, _ = await _scrape(http, f"{sim.url}/dp/metrics")
    assert _sum(after, "vllm:prefix_cache_queries_total") == 80
    assert _sum(after, "vllm:prefix_cache_hits_total") == 32  # two full 16-token blocks on the repeat


async def test_a_conversations_next_turn_reuses_the_previous_prompt(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        url = f"{sim.url}/dp/v1/chat/completions"
        turn1 = [{"role": "user", "content": " ".join(["word"] * 40)}]  # 52 prompt tokens
        turn2 = [*turn1, {"role": "assistant", "content": "reply " * 10}, {"role": "user", "content": "more"}]
        other = [{"role": "user", "content": " ".join(["word"] * 39)}]  # not a message prefix of turn1
        hits = []
        for messages in (turn1, turn2, other):
            body = chat_body(max_tokens=2, stream=False)
            body["messages"] = messages
            async with http.post(url, json=body) as resp:
                assert resp.status == 200
            after, _ = await _scrape(http, f"{sim.url}/dp/metrics")
            hits.append(_sum(after, "vllm:prefix_cache_hits_total"))
    # turn 2 starts with turn 1's message: its 40 tokens are reused in full 16-token blocks (32)
    assert hits == [0, 32, 32]


async def test_preemption_under_kv_pressure(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        # 150 ms per request at 200 tok/s, so the three overlap even on a loaded machine.
        url = f"{sim.url}/kv/v1/chat/completions"
        results = await asyncio.gather(*(_chat(http, url, 30) for _ in range(3)))
        after, _ = await _scrape(http, f"{sim.url}/kv/metrics")
        truths = [sim.truth(str(r["_rid"])) for r in results]
    assert _sum(after, "vllm:num_preemptions_total") >= 1
    assert _sum(after, "vllm:generation_tokens_total") == 90
    assert all(t is not None and t.tokens == 30 and t.completed for t in truths)
    assert any(t is not None and t.preemptions > 0 for t in truths)


async def test_legacy_names(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        await _chat(http, f"{sim.url}/old/v1/chat/completions", 3)
        after, types = await _scrape(http, f"{sim.url}/old/metrics")
    assert "vllm:gpu_cache_usage_perc" in types and "vllm:kv_cache_usage_perc" not in types
    assert "vllm:inter_token_latency_seconds" not in types
    assert after[("vllm:generation_tokens_total", (("model_name", "m"),))] == 3
    assert all("engine" not in dict(lab) for (_, lab) in after if _.startswith("vllm:"))


async def test_data_parallel_engines_sum_to_totals(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        for n in (3, 4, 5):
            await _chat(http, f"{sim.url}/dp/v1/chat/completions", n)
        after, _ = await _scrape(http, f"{sim.url}/dp/metrics")
    e0 = _sum(after, "vllm:generation_tokens_total", engine="0")
    e1 = _sum(after, "vllm:generation_tokens_total", engine="1")
    assert (e0, e1) == (8, 4)  # round-robin: requests 0 and 2 on engine 0
    assert _sum(after, "vllm:request_success_total") == 3


async def test_restart_resets_counters(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        await _chat(http, f"{sim.url}/dp/v1/chat/completions", 4)
        before, _ = await _scrape(http, f"{sim.url}/dp/metrics")
        async with http.post(f"{sim.url}/_sim/servers/dp/restart") as resp:
            assert resp.status == 200
        after, _ = await _scrape(http, f"{sim.url}/dp/metrics")
        await _chat(http, f"{sim.url}/dp/v1/chat/completions", 2)
        sim.restart_counters("v")
        later, _ = await _scrape(http, f"{sim.url}/dp/metrics")
    assert _sum(before, "vllm:generation_tokens_total") == 4
    assert _sum(after, "vllm:generation_tokens_total") == 0
    assert _sum(later, "vllm:generation_tokens_total") == 2
    created_before = _sum(before, "vllm:generation_tokens_created", engine="0")
    assert _sum(after, "vllm:generation_tokens_created", engine="0") > created_before


async def test_sglang_and_openai_metrics(http: aiohttp.ClientSession) -> None:
    cfg = CFG + "  - {name: plain, dialect: openai, models: [{name: m}]}\n"
    async with run_sim(sim_config(cfg)) as sim:
        await _chat(http, f"{sim.url}/sg/v1/chat/completions", 3)
        after, types = await _scrape(http, f"{sim.url}/sg/metrics")
        async with http.get(f"{sim.url}/plain/metrics") as resp:
            plain = resp.status
    assert after[("sglang:generation_tokens_total", (("model_name", "m"),))] == 3
    assert types["sglang:time_to_first_token_seconds"] == "histogram"
    assert plain == 404
