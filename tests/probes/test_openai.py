"""OpenAI probe against small real servers on 127.0.0.1: statuses, hostile answers, key hygiene, counters."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Callable

import pytest
from aiohttp import web

from tests.support.thread_server import ThreadServer, read_request
from tokwatch.figures.result import Status, TimingSource
from tokwatch.probes import PROBES, get_probe
from tokwatch.probes.base import CounterMeasurement, run_probe
from tokwatch.probes.openai import OpenAIProbe

KEY = "sk-test-very-secret-123"


def chunk(content: str | None = None, **extra: object) -> bytes:
    delta = {} if content is None else {"content": content}
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}], **extra}).encode() + b"\n\n"


def sse_handler(words: list[str], gap: float = 0.02, usage: int | None = None):
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stream"] is True and body["stream_options"]["include_usage"] is True
        assert body["max_tokens"] >= 1 and body["messages"][-1]["role"] == "user"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(
            b": ping\n\n"
            + b"data: "
            + json.dumps({"choices": [{"delta": {"role": "assistant"}}]}).encode()
            + b"\n\n"
        )
        for w in words:
            await asyncio.sleep(gap)
            await resp.write(chunk(w))
        await resp.write(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n')
        n = len(words) if usage is None else usage
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % n)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    return handler


async def test_registry() -> None:
    assert set(PROBES) == {"openai", "ollama", "llamacpp", "vllm", "sglang", "anthropic"}
    assert isinstance(get_probe("openai"), OpenAIProbe)
    with pytest.raises(ValueError, match="unknown endpoint kind 'nope'"):
        get_probe("nope")


async def test_streamed_ok_client_stream(serve, make_ctx) -> None:
    url = await serve({"/v1/chat/completions": sse_handler([f"w{i} " for i in range(8)])})
    ctx = make_ctx(url + "/v1", max_tokens=8, warmup=False)
    r = await run_probe(OpenAIProbe(), ctx)
    assert r.status is Status.OK, r.error_message
    assert r.source is TimingSource.CLIENT_STREAM
    assert r.output_tokens == 8 and r.think_tokens == 0 and r.tokens_source == "usage"
    assert r.ttft_s is not None and 0 < r.ttft_s < r.e2e_s  # type: ignore[operator]
    assert len(r.itl_s) == 7 and r.tpot_s is not None
    assert set(r.candidates) == {TimingSource.CLIENT_STREAM, TimingSource.CLIENT_WALL}
    assert r.finish_reason == "length" and r.http_status == 200 and r.streamed


async def test_short_output_is_degraded_unless_configured(serve, make_ctx) -> None:
    url = await serve({"/v1/chat/completions": sse_handler(["a", "b"])})
    r = await OpenAIProbe().run_once(make_ctx(url, max_tokens=16), timed=True)
    assert r.status is Status.DEGRADED and r.error_class == "short_output"
    r = await OpenAIProbe().run_once(make_ctx(url, max_tokens=16, short_output="ok"), timed=True)
    assert r.status is Status.OK


async def test_auth_failure_key_redacted_and_sent_as_bearer(serve, make_ctx) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        return web.Response(status=401, text=f"invalid api key: {auth.removeprefix('Bearer ')}")

    url = await serve({"/v1/chat/completions": handler})
    ctx = make_ctx(url, api_key=KEY)
    r = await run_probe(OpenAIProbe(), ctx)
    assert r.status is Status.AUTH_FAILURE and r.error_class == "http_401"
    assert r.error_message is not None and "invalid api key" in r.error_message
    assert KEY not in r.error_message and KEY not in "\n".join(ctx.log.lines)


async def test_a_redirect_is_not_followed_and_its_target_is_named(serve, make_ctx) -> None:
    """An endpoint that moved (http -> https, a new path): the run fails naming where to point base_url."""
    calls = 0

    async def moved(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        raise web.HTTPTemporaryRedirect("https://llm.example/v2/chat/completions")

    url = await serve({"/v1/chat/completions": moved})
    r = await run_probe(OpenAIProbe(), make_ctx(url))
    assert r.status is Status.PROVIDER_ERROR and r.error_class == "http_other"
    assert r.error_message is not None and "https://llm.example/v2/chat/completions" in r.error_message
    assert "base_url" in r.error_message
    assert calls == 2  # the warm-up and the timed run, each answered by the redirect and nothing else


async def test_server_ignoring_stream_answers_json(serve, make_ctx) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        # A real server takes a while: 4 tokens answered in well under a millisecond on an idle machine
        # are above the plausibility ceiling (20,000 tok/s) and rightly not ok.
        await asyncio.sleep(0.02)
        return web.json_response(
            {
                "choices": [{"message": {"content": "a b c d"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 4},
            }
        )

    url = await serve({"/v1/chat/completions": handler})
    r = await OpenAIProbe().run_once(make_ctx(url, max_tokens=4), timed=True)
    assert r.status is Status.OK and r.source is TimingSource.CLIENT_WALL and not r.streamed
    assert r.output_tokens == 4 and r.ttft_s is None
    assert r.tokens_per_second is not None and r.tokens_per_second < 4 / 0.02


async def test_error_object_with_200_json(serve, make_ctx) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "model overloaded", "code": 503}})

    url = await serve({"/v1/chat/completions": handler})
    r = await OpenAIProbe().run_once(make_ctx(url), timed=True)
    assert r.status is Status.PROVIDER_ERROR and r.error_class == "stream_error"


@pytest.mark.parametrize(
    ("mode", "status", "error_class"),
    [
        ("endless", Status.PROVIDER_ERROR, "too_large"),
        ("huge_line", Status.PROVIDER_ERROR, "too_large"),
        ("bogus_json", Status.PROVIDER_ERROR, "malformed_json"),
        ("stall", Status.TIMEOUT, "read_timeout"),
        ("reset", Status.PROVIDER_ERROR, "reset"),
        ("invalid_utf8", Status.PROVIDER_ERROR, "bad_encoding"),
        ("html_200", Status.PROVIDER_ERROR, "not_json"),
        ("no_events", Status.PROVIDER_ERROR, "not_json"),
        ("wrong_model", Status.DEGRADED, "model_mismatch"),
        ("snapshot_model", Status.OK, None),  # gpt-4o-mini-2024-07-18 answers for gpt-4o-mini
        ("too_many_tokens", Status.PROVIDER_ERROR, "implausible_tokens"),
        ("burst", Status.PROVIDER_ERROR, "implausible_rate"),
    ],
)
async def test_hostile_endpoints(serve, make_ctx, mode: str, status: Status, error_class: str | None) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        content_type = "text/html" if mode == "html_200" else "text/event-stream"
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        if mode == "html_200":
            await resp.write(b"<html><body><h1>Welcome to nginx</h1></body></html>")
            return resp
        if mode == "no_events":
            await resp.write(b"service temporarily unavailable, please retry\n")
            return resp
        if mode in ("wrong_model", "snapshot_model"):
            name = "other-model" if mode == "wrong_model" else "m-2024-07-18"
            for word in ("one ", "two"):
                payload = {"model": name, "choices": [{"delta": {"content": word}}]}
                await resp.write(f"data: {json.dumps(payload)}\n\n".encode())
                await asyncio.sleep(0.01)
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if mode == "too_many_tokens":
            await resp.write(chunk("hi"))
            await asyncio.sleep(0.01)
            await resp.write(chunk("yo"))
            await resp.write(b'data: {"choices":[],"usage":{"completion_tokens":500}}\n\ndata: [DONE]\n\n')
            return resp
        if mode == "burst":  # 20 tokens in one write: a rate no real decode reaches
            await resp.write(b"".join(chunk(f"w{i} ") for i in range(20)) + b"data: [DONE]\n\n")
            return resp
        await resp.write(chunk("hi"))
        if mode == "endless":
            for _ in range(1_000_000):
                await resp.write(chunk("more " * 800))
        elif mode == "huge_line":
            for _ in range(1_000):
                await resp.write(b"x" * 65536)  # no newline ever: the line buffer must not grow unbounded
        elif mode == "bogus_json":
            await resp.write(b'data: {"choices": [\n\n')
        elif mode == "stall":
            await asyncio.sleep(60)
        elif mode == "reset":
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(1)
        elif mode == "invalid_utf8":
            await resp.write(b'data: {"choices":[{"delta":{"content":"\xff\xfe ok"}}]}\n\n')
            await resp.write(b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n')
        return resp

    url = await serve({"/v1/chat/completions": handler})
    ctx = make_ctx(
        url,
        endpoint={"timeout": 3.0 if mode in ("endless", "huge_line") else 1.0},
        max_tokens=20 if mode == "burst" else 2,
        max_response_bytes=256 * 1024,
        max_plausible_tokens_per_second=5000,
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await OpenAIProbe().run_once(ctx, timed=True)
    assert loop.time() - t0 < 10  # ends at the endpoint's timeout at the latest
    assert (r.status, r.error_class) == (status, error_class), r.error_message
    if mode == "stall":
        assert r.ttft_s is not None  # the token before the stall still gives a TTFT


class FakeCounters:
    """A CounterWindow stand-in (the real one lives in tokwatch.counters and scrapes /metrics)."""

    def __init__(self, tps: float | None, shared: bool = False, fail: bool = False) -> None:
        self.snapshots = 0
        self.tps, self.shared, self.fail = tps, shared, fail

    async def snapshot(self) -> object | None:
        self.snapshots += 1
        if self.fail:
            raise OSError("metrics endpoint down")
        return self.snapshots

    def measure(self, before: object | None, after: object | None) -> CounterMeasurement | None:
        if before is None or after is None:
            return None
        return CounterMeasurement(self.tps, self.shared, "shared window" if self.shared else None)


async def test_counters_hook_timed_only_and_shared_policy(serve, make_ctx) -> None:
    url = await serve({"/v1/chat/completions": sse_handler(["a", "b", "c", "d"])})
    counters = FakeCounters(77.0)
    r = await run_probe(get_probe("vllm"), make_ctx(url, "vllm", counters=counters, max_tokens=4))
    assert counters.snapshots == 2  # warm-up skipped: before + after of the timed run only
    assert r.status is Status.OK and r.source is TimingSource.VLLM_METRICS and r.tokens_per_second == 77.0

    shared = FakeCounters(77.0, shared=True)
    r = await get_probe("sglang").run_once(make_ctx(url, "sglang", counters=shared, max_tokens=4), timed=True)
    assert r.source is TimingSource.CLIENT_STREAM and TimingSource.VLLM_METRICS in r.candidates
    ctx = make_ctx(url, "sglang", counters=shared, max_tokens=4, shared_server_window="flag")
    r = await get_probe("sglang").run_once(ctx, timed=True)
    assert r.source is TimingSource.VLLM_METRICS and r.server_shared

    broken = FakeCounters(77.0, fail=True)
    r = await get_probe("llamacpp").run_once(
        make_ctx(url, "llamacpp", counters=broken, max_tokens=4), timed=True
    )
    assert r.status is Status.OK and r.source is TimingSource.CLIENT_STREAM and broken.snapshots == 2

    plain = FakeCounters(77.0)
    await get_probe("openai").run_once(make_ctx(url, counters=plain, max_tokens=4), timed=True)
    assert plain.snapshots == 0  # the openai kind has no server counters


async def test_unreachable(make_ctx, free_port) -> None:
    port = free_port()
    r = await OpenAIProbe().run_once(make_ctx(f"http://127.0.0.1:{port}"), timed=True)
    assert r.status is Status.UNREACHABLE and r.error_class == "connect"


def _reset_after_the_request(requests: list[bytes]) -> Callable[[socket.socket], None]:
    """Reads each whole request, then resets the connection (SO_LINGER on with a zero timeout: close() sends
    RST) before sending a single byte."""

    def handle(conn: socket.socket) -> None:
        requests.append(read_request(conn))
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # RST, no response byte

    return handle


async def test_a_reset_before_any_response_byte_is_unreachable(make_ctx) -> None:
    requests: list[bytes] = []
    with ThreadServer(_reset_after_the_request(requests)) as server:
        ctx = make_ctx(f"{server.url}/v1", api_key=KEY, endpoint={"timeout": 5.0})
        r = await OpenAIProbe().run_once(ctx, timed=True)
    assert (r.status, r.error_class) == (Status.UNREACHABLE, "reset"), r.error_message
    assert r.http_status is None  # nothing answered
    # the request was sent whole (the reset is not a refused connection) and not resent
    assert len(requests) == 1 and requests[0].startswith(b"POST /v1/chat/completions ")
    assert b'"messages"' in requests[0]
    assert r.error_message is not None and KEY not in r.error_message


async def test_a_buffered_answer_is_not_a_decode_speed_sample(serve, make_ctx) -> None:
    """The first token, then the other 15 in one write (one read): the run is an answer (ok), but its
    client_stream tok/s times the delivery of a buffer, so it is set aside with reason `one_read`."""

    async def buffered(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk("w0 "))
        await asyncio.sleep(0.05)
        await resp.write(
            b"".join(chunk(f"w{i} ") for i in range(1, 16))
            + b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":16}}\n\ndata: [DONE]\n\n'
        )
        return resp

    url = await serve({"/v1/chat/completions": buffered})
    r = await run_probe(OpenAIProbe(), make_ctx(url + "/v1", max_tokens=16, warmup=False))
    assert r.status is Status.OK, r.error_message
    assert r.source is TimingSource.CLIENT_STREAM
    assert r.set_aside.get("tokens_per_second") == "one_read" and r.tps_set_aside
    assert not r.timing_disturbed  # not a client stall
    # The same tokens streamed one by one are a sample.
    url = await serve({"/v1/chat/completions": sse_handler([f"w{i} " for i in range(16)], gap=0.005)})
    r = await run_probe(OpenAIProbe(), make_ctx(url + "/v1", max_tokens=16, warmup=False))
    assert r.status is Status.OK and r.set_aside.get("tokens_per_second") != "one_read"
