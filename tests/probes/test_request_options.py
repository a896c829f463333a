"""What probes send: a fresh start of the timed run's prompt, and ignore_eos/min_tokens where supported."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from tokwatch.figures.result import Status
from tokwatch.probes import get_probe
from tokwatch.probes.base import run_probe
from tokwatch.probes.prompts import fresh_prefix

CHUNKS = [{"choices": [{"delta": {"content": w}}]} for w in ("one ", "two ", "three")]


@pytest.fixture
async def recording(serve) -> tuple[str, list[dict[str, Any]]]:  # type: ignore[no-untyped-def]
    """An OpenAI-style server that records every request body and streams three tokens, 2 ms apart (three
    chunks in one write can measure above the plausible tok/s and fail the run)."""
    bodies: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
        for chunk in (*CHUNKS, usage):
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.002)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    url = await serve({"/v1/chat/completions": chat})
    return url, bodies


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    return body["messages"]  # type: ignore[no-any-return]


async def test_the_timed_prompt_differs_from_the_warmups(recording, make_ctx) -> None:  # type: ignore[no-untyped-def]
    url, bodies = recording
    r = await run_probe(get_probe("openai"), make_ctx(url + "/v1", "openai", max_tokens=3))
    assert r.status is Status.OK, r.error_message
    warm, timed = (_messages(b)[-1]["content"] for b in bodies)
    # a fresh three-word sentence drawn from the run id leads the timed prompt: reproducible from the run
    assert r.prompt_seed is not None and r.prompt_seed.startswith(r.run_id)
    assert timed == fresh_prefix(r.prompt_seed) + warm and len(fresh_prefix(r.prompt_seed).split()) == 3
    # and a new prefix every run: no earlier request can have cached it
    await run_probe(get_probe("openai"), make_ctx(url + "/v1", "openai", max_tokens=3))
    assert _messages(bodies[3])[-1]["content"] != timed


async def test_with_a_system_prompt_the_prefix_leads_the_system_message(recording, make_ctx) -> None:  # type: ignore[no-untyped-def]
    url, bodies = recording
    r = await run_probe(get_probe("openai"), make_ctx(url + "/v1", "openai", system_prompt="Be brief."))
    (warm_sys, warm_user), (timed_sys, timed_user) = (_messages(b) for b in bodies)
    assert r.prompt_seed is not None and timed_sys["content"] == fresh_prefix(r.prompt_seed) + "Be brief."
    assert warm_sys["content"] == "Be brief." and timed_user == warm_user


async def test_same_prompt_keeps_the_old_behaviour(recording, make_ctx) -> None:  # type: ignore[no-untyped-def]
    url, bodies = recording
    await run_probe(get_probe("openai"), make_ctx(url + "/v1", "openai", timed_prompt="same"))
    assert _messages(bodies[0]) == _messages(bodies[1])


@pytest.mark.parametrize(
    ("kind", "settings", "extra_body", "expected"),
    [
        ("llamacpp", {}, {}, {"ignore_eos": True}),
        ("vllm", {}, {}, {"ignore_eos": True, "min_tokens": 3}),
        ("sglang", {}, {}, {"ignore_eos": True, "min_tokens": 3}),
        ("openai", {}, {}, {}),  # cloud APIs reject unknown parameters
        ("openai", {"fixed_output": True}, {}, {"ignore_eos": True, "min_tokens": 3}),
        ("vllm", {"fixed_output": False}, {}, {}),
        ("llamacpp", {}, {"ignore_eos": False}, {"ignore_eos": False}),  # the endpoint's extra_body wins
    ],
)
async def test_fixed_output_fields(  # type: ignore[no-untyped-def]
    recording,
    make_ctx,
    kind: str,
    settings: dict[str, Any],
    extra_body: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    url, bodies = recording
    ctx = make_ctx(
        url + "/v1", kind, max_tokens=3, warmup=False, endpoint={"extra_body": extra_body}, **settings
    )
    await run_probe(get_probe(kind), ctx)
    sent = {k: bodies[0][k] for k in ("ignore_eos", "min_tokens") if k in bodies[0]}
    assert sent == expected
