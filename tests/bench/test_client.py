"""The request layer against a scripted real HTTP server on 127.0.0.1 (exact chunk timing and content)."""

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tokwatch.bench.client import Deadlines, Target, execute
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures.result import Status
from tokwatch.settings.redact import Redactor
from tokwatch.transport.http import HttpClient

DELAY = 0.15
BODIES = web.AppKey("bodies", list)


def _chunk(delta: dict, usage: dict | None = None) -> bytes:
    obj = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    if usage is not None:
        obj["usage"] = usage
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _scripted(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[BODIES].append(body)
    if request.headers.get("Authorization") != "Bearer sekrit-key":
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
        return web.json_response({"error": {"message": f"invalid key {sent}"}}, status=401)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    # Role-only chunk, a ping comment and an empty-content chunk: none of them is a token.
    await resp.write(_chunk({"role": "assistant", "content": ""}))
    await resp.write(b": ping\n\n")
    await resp.write(_chunk({"content": ""}))
    await asyncio.sleep(DELAY)
    await resp.write(_chunk({"reasoning_content": "let me"}, {"prompt_tokens": 9, "completion_tokens": 2}))
    await asyncio.sleep(DELAY)
    # One chunk carrying 3 tokens (per-chunk usage says so).
    await resp.write(_chunk({"content": "Hello big world"}, {"prompt_tokens": 9, "completion_tokens": 5}))
    await asyncio.sleep(DELAY)
    await resp.write(_chunk({"content": "!"}, {"prompt_tokens": 9, "completion_tokens": 6}))
    await resp.write(b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":6}}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _runaway(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(200):  # ignores max_tokens entirely
        await resp.write(_chunk({"content": " word"}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app[BODIES] = []
    app.router.add_post("/v1/chat/completions", _scripted)
    app.router.add_post("/runaway/v1/chat/completions", _runaway)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


async def _run(base: str, kind: str = "vllm", key: str | None = "sekrit-key", max_tokens: int = 6):
    target = Target(kind, f"{base}/v1", "m", key, timeout_s=10)
    record = RequestRecord(request_id=0, category="chat", max_tokens=max_tokens, fixed_output=True)
    t0 = time.perf_counter()
    async with HttpClient(limit=0) as http:
        await execute(
            http,
            target,
            [{"role": "user", "content": "hi"}],
            record,
            run_t0=t0,
            deadlines=Deadlines(1.0, 0.05),
            redactor=Redactor([key]),
        )
    return record


async def test_pings_and_role_only_chunks_are_never_the_first_token(server):
    base, _ = server
    r = await _run(base)
    assert r.status is Status.OK
    assert r.ttft_s == pytest.approx(DELAY, abs=0.05)  # the reasoning chunk, not the role-only chunk at ~0
    assert r.ttft_s >= DELAY


async def test_multi_token_chunk_counts_as_k_tokens(server):
    base, _ = server
    r = await _run(base)
    assert r.tokens_source == "chunk_usage"
    assert (r.think_tokens, r.output_tokens, r.prompt_tokens) == (2, 4, 9)
    # Chunks: 2 think tokens, then 3 output tokens, then 1: per-token gaps are [0] [gap, 0, 0] [gap].
    assert len(r.tbt_s) == 5
    assert r.tbt_s[0] == 0.0 and r.tbt_s[2:4] == [0.0, 0.0]
    assert r.tbt_s[1] == pytest.approx(DELAY, abs=0.05) and r.tbt_s[4] == pytest.approx(DELAY, abs=0.05)
    assert len(r.inter_chunk_s) == 2
    assert r.ttot_s == pytest.approx(DELAY, abs=0.05)
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 5)
    assert r.chunks == 3
    assert 0.0 <= r.fluidity_index <= 1.0


async def test_vllm_body_asks_for_exact_length_and_chunk_usage(server):
    base, app = server
    await _run(base, kind="vllm", max_tokens=6)
    await _run(base, kind="openai", max_tokens=6)
    vllm, openai = app[BODIES]
    assert vllm["ignore_eos"] is True and vllm["min_tokens"] == 6
    assert vllm["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "ignore_eos" not in openai and openai["stream_options"] == {"include_usage": True}


async def test_auth_failure_is_classified_and_redacted(server):
    base, _ = server
    r = await _run(base, key="wrong-key-1234")
    assert r.status is Status.AUTH_FAILURE and r.error_class == "http_401"
    assert "wrong-key-1234" not in (r.error_message or "")
    assert "invalid key ***" in (r.error_message or "")
    r = await _run(base, key=None)
    assert r.status is Status.AUTH_FAILURE


async def test_server_ignoring_max_tokens_is_cut_and_flagged(server):
    base, _ = server
    r = await _run(f"{base}/runaway", kind="openai", max_tokens=10)
    assert r.status is Status.DEGRADED
    assert r.error_class == "max_tokens_ignored"
    assert "stream cut" in (r.error_message or "")


async def test_unreachable_url():
    r = await _run("http://127.0.0.1:9", kind="openai")
    assert r.status is Status.UNREACHABLE
    assert r.sent_at_s >= 0 and r.completed_at_s is not None
