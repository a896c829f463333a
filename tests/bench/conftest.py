"""Shared helpers for the benchmark tests: hand-made request records."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures.result import Status


def _record(i: int, *, ttft: float = 0.1, gap: float = 0.01, tokens: int = 11, **kw: Any) -> RequestRecord:
    status = kw.pop("status", Status.OK)
    sent = kw.pop("sent", float(i))
    r = RequestRecord(i, "chat", sent_at_s=sent, started_at_s=sent, dispatched_at_s=sent, status=status, **kw)
    if status is Status.OK:
        r.ttft_s = ttft
        r.tbt_s = [gap] * (tokens - 1)
        r.inter_chunk_s = list(r.tbt_s)
        r.e2e_s = ttft + gap * (tokens - 1)
        r.tpot_s = gap
        r.output_tokens = tokens
        r.think_tokens = 0
        r.prompt_tokens = 100
        r.prompt_tokens_target = 100
        r.tokens_source = "usage"
        r.fluidity_index = 1.0
        r.max_tokens = tokens
        r.completed_at_s = sent + r.e2e_s
    else:
        r.error_class = "http_5xx"
        r.completed_at_s = sent + 0.01
    return r


@pytest.fixture
def make_record() -> Callable[..., RequestRecord]:
    """`make_record(i, ttft=..., gap=..., tokens=..., status=..., sent=...)`."""
    return _record


# --- a small real streaming server on 127.0.0.1 ------------------------------------------------------------


@dataclass
class StreamServer:
    """What the server saw; `gap` is the per-token delay it streams with."""

    url: str = ""
    gap: float = 0.005
    status: int = 200
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    on_first_request: Callable[[], None] | None = None  # called once, when the first request arrives


_STATE = web.AppKey("state", StreamServer)


async def _chat(request: web.Request) -> web.StreamResponse:
    st = request.app[_STATE]
    body = await request.json()
    st.bodies.append(body)
    if st.on_first_request is not None:
        hook, st.on_first_request = st.on_first_request, None
        hook()
    if st.status != 200:
        return web.json_response({"error": {"message": "nope"}}, status=st.status)
    st.in_flight += 1
    st.max_in_flight = max(st.max_in_flight, st.in_flight)
    try:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body.get("max_tokens", 8))
        turn = sum(1 for m in body["messages"] if m["role"] == "user")
        for i in range(n):
            await asyncio.sleep(st.gap)
            delta = {"content": f"r{turn}w{i} "}
            await resp.write(f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]})}\n\n".encode())
        prompt = sum(len(m["content"].split()) for m in body["messages"])  # one token a word
        usage = {"prompt_tokens": prompt, "completion_tokens": n}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        return resp
    finally:
        st.in_flight -= 1


@pytest.fixture
async def stream_server() -> AsyncIterator[StreamServer]:
    """An OpenAI-style streaming server: `max_tokens` one-token chunks, `gap` seconds apart."""
    app = web.Application()
    state = StreamServer()
    app[_STATE] = state
    app.router.add_post("/v1/chat/completions", _chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        yield state
    finally:
        await runner.cleanup()
