"""OpenAI-compatible wire formats (vLLM, OpenAI, SGLang) over real loopback HTTP."""

from __future__ import annotations

import aiohttp
import pytest
from simhelpers import chat_body, read_sse, sim_config

from tokwatch.sim.testing import run_sim

CFG = """
seed: 7
servers:
  - name: vllm
    dialect: vllm
    models:
      - {name: m, decode_tps: 2000}
      - {name: think, decode_tps: 2000, think_tokens: 3, reasoning_format: reasoning_content}
      - {name: think-r, decode_tps: 2000, think_tokens: 3, reasoning_format: reasoning}
      - {name: think-tags, decode_tps: 2000, think_tokens: 4, reasoning_format: think_tags}
      - {name: chunky, decode_tps: 2000, tokens_per_chunk: 3}
      - {name: pinger, decode_tps: 100, ping_interval: 3ms}
      - {name: stopper, decode_tps: 2000, natural_stop_tokens: 3}
  - name: oai
    dialect: openai
    models: [{name: m, decode_tps: 2000}]
  - name: locked
    dialect: vllm
    api_key: sk-sim-secret
    models: [{name: m, decode_tps: 2000}]
"""


async def test_vllm_stream_wire_format(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        body = chat_body(max_tokens=5, stream_options={"include_usage": True})
        async with http.post(f"{sim.url}/vllm/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            rid = resp.headers["x-sim-request-id"]
            read = await read_sse(resp)
    assert read.done and read.pings == 0
    first = read.events[0]
    assert set(first) == {"id", "object", "created", "model", "choices"}
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = read.events[1:-1]
    assert [c["choices"][0]["delta"]["content"] for c in content] == ["The", " speed", " of", " light", " is"]
    # vLLM puts finish_reason on the last content chunk; there is no separate empty finish chunk.
    assert [c["choices"][0]["finish_reason"] for c in content] == [None, None, None, None, "length"]
    usage = read.events[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 5
    truth = sim.truth(rid)
    assert truth is not None and truth.tokens == 5 and truth.completed


async def test_openai_stream_separate_finish_chunk_and_no_usage_by_default(
    http: aiohttp.ClientSession,
) -> None:
    async with (
        run_sim(sim_config(CFG)) as sim,
        http.post(f"{sim.url}/oai/v1/chat/completions", json=chat_body(max_tokens=3)) as resp,
    ):
        read = await read_sse(resp)
    finish = read.events[-1]
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e for e in read.events)
    assert len(read.events) == 1 + 3 + 1


async def test_non_stream_body_fields(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        async with http.post(f"{sim.url}/vllm/v1/chat/completions", json=chat_body(stream=False)) as resp:
            assert resp.status == 200
            data = await resp.json()
        async with http.post(f"{sim.url}/oai/v1/chat/completions", json=chat_body(stream=False)) as resp:
            oai = await resp.json()
    assert data["object"] == "chat.completion"
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].startswith("The speed of")
    assert data["usage"]["completion_tokens"] == 8
    # "Explain theory of relativity simply": 5 words, one token each.
    assert data["usage"]["prompt_tokens"] == 5
    assert oai["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


async def test_max_completion_tokens_and_natural_stop(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        url = f"{sim.url}/vllm/v1/chat/completions"
        body = chat_body(stream=False, max_completion_tokens=4)
        del body["max_tokens"]
        async with http.post(url, json=body) as resp:
            assert (await resp.json())["usage"]["completion_tokens"] == 4
        async with http.post(url, json=chat_body("stopper", max_tokens=10, stream=False)) as resp:
            stopped = await resp.json()
        async with http.post(
            url, json=chat_body("stopper", max_tokens=10, stream=False, ignore_eos=True)
        ) as resp:
            forced = await resp.json()
        body = chat_body("stopper", max_tokens=10, stream=False, min_tokens=6)
        async with http.post(url, json=body) as resp:
            min_tok = await resp.json()
    assert stopped["usage"]["completion_tokens"] == 3 and stopped["choices"][0]["finish_reason"] == "stop"
    assert forced["usage"]["completion_tokens"] == 10 and forced["choices"][0]["finish_reason"] == "length"
    assert min_tok["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize(
    ("model", "field", "expected_think"),
    [("think", "reasoning_content", "Let me think"), ("think-r", "reasoning", "Let me think")],
)
async def test_reasoning_fields(
    http: aiohttp.ClientSession, model: str, field: str, expected_think: str
) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        url = f"{sim.url}/vllm/v1/chat/completions"
        async with http.post(url, json=chat_body(model, max_tokens=6)) as resp:
            read = await read_sse(resp)
        async with http.post(url, json=chat_body(model, max_tokens=6, stream=False)) as resp:
            data = await resp.json()
    deltas = [e["choices"][0]["delta"] for e in read.events[1:]]
    assert "".join(d.get(field, "") for d in deltas) == expected_think
    assert "".join(d.get("content") or "" for d in deltas) == "The speed of"
    assert data["choices"][0]["message"][field] == expected_think
    assert data["choices"][0]["message"]["content"] == "The speed of"
    assert data["usage"]["completion_tokens"] == 6


async def test_reasoning_think_tags_in_content(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        url = f"{sim.url}/vllm/v1/chat/completions"
        async with http.post(url, json=chat_body("think-tags", max_tokens=6)) as resp:
            read = await read_sse(resp)
            rid = resp.headers["x-sim-request-id"]
        truth = sim.truth(rid)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in read.events[1:])
    assert text == "<think> me think</think>\n\nThe speed"
    assert truth is not None and truth.phases == ["think"] * 4 + ["output"] * 2


async def test_multi_token_chunks(http: aiohttp.ClientSession) -> None:
    async with (
        run_sim(sim_config(CFG)) as sim,
        http.post(f"{sim.url}/vllm/v1/chat/completions", json=chat_body("chunky", 7)) as resp,
    ):
        read = await read_sse(resp)
        truth = sim.truth(resp.headers["x-sim-request-id"])
    texts = [e["choices"][0]["delta"]["content"] for e in read.events[1:]]
    assert texts == ["The speed of", " light is constant", " for"]
    assert truth is not None and [n for _, n, _ in truth.chunks] == [3, 3, 1]


async def test_ping_comment_lines(http: aiohttp.ClientSession) -> None:
    async with (
        run_sim(sim_config(CFG)) as sim,
        http.post(f"{sim.url}/vllm/v1/chat/completions", json=chat_body("pinger", 4)) as resp,
    ):
        read = await read_sse(resp)
    assert read.pings >= 2
    assert b"\n: ping\n\n" in read.raw or read.raw.startswith(b": ping")
    assert len(read.events) == 5


async def test_completions_route(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        url = f"{sim.url}/vllm/v1/completions"
        async with http.post(url, json={"model": "m", "prompt": "a b c", "max_tokens": 3}) as resp:
            data = await resp.json()
        body = {"model": "m", "prompt": "a b c", "max_tokens": 3, "stream": True}
        async with http.post(url, json=body) as resp:
            read = await read_sse(resp)
    assert data["object"] == "text_completion" and data["choices"][0]["text"] == "The speed of"
    assert [e["choices"][0]["text"] for e in read.events] == ["The", " speed", " of"]
    assert read.done


async def test_models_unknown_model_and_bad_requests(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        async with http.get(f"{sim.url}/vllm/v1/models") as resp:
            models = await resp.json()
        async with http.post(f"{sim.url}/vllm/v1/chat/completions", json=chat_body("nope")) as resp:
            vllm_404 = (resp.status, await resp.json())
        async with http.post(f"{sim.url}/oai/v1/chat/completions", json=chat_body("nope")) as resp:
            oai_404 = (resp.status, await resp.json())
        async with http.post(f"{sim.url}/vllm/v1/chat/completions", data=b"{not json") as resp:
            bad = (resp.status, await resp.json())
        async with http.post(f"{sim.url}/nosuch/v1/chat/completions", json=chat_body()) as resp:
            no_server = resp.status
    assert [m["id"] for m in models["data"]][:2] == ["m", "think"] and models["object"] == "list"
    assert vllm_404[0] == 404 and vllm_404[1]["error"]["type"] == "NotFoundError"
    assert "`nope` does not exist" in vllm_404[1]["error"]["message"]
    assert oai_404[0] == 404 and oai_404[1]["error"]["code"] == "model_not_found"
    assert bad[0] == 400 and "not valid JSON" in bad[1]["error"]["message"]
    assert no_server == 404


async def test_api_key_required_when_configured(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        url = f"{sim.url}/locked/v1/chat/completions"
        async with http.post(url, json=chat_body(stream=False)) as resp:
            denied = (resp.status, await resp.json())
        headers = {"Authorization": "Bearer sk-sim-secret"}
        async with http.post(url, json=chat_body(stream=False), headers=headers) as resp:
            allowed = resp.status
        async with http.get(f"{sim.url}/locked/metrics") as resp:
            metrics = resp.status
    assert denied[0] == 401 and "sk-sim-secret" not in str(denied[1])
    assert allowed == 200
    assert metrics == 200  # /metrics stays public, as on vLLM
