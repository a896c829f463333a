"""Turns a SimRequest into an HTTP response through a Formatter, applying faults and hostile behaviours."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

from aiohttp import web

from tokwatch.sim.context import SimRequest
from tokwatch.sim.dialects.base import Formatter, dumps
from tokwatch.sim.faults import HTTP_FAULTS, error_response, fault_status, reset_connection
from tokwatch.sim.generation import Chunk, Generation, Ping
from tokwatch.sim.profile import INVALID_UTF8_BYTES, INVALID_UTF8_MARKER, request_rng

_MARKER = INVALID_UTF8_MARKER.encode()
_STREAM_FAULTS = frozenset(
    {"malformed_json", "wrong_shape", "error_mid_stream", "overloaded_mid_stream", "stall", "reset"}
)


async def respond(req: SimRequest, request: web.Request, fmt: Formatter) -> web.StreamResponse:
    """Answer `request`: an HTTP fault at once, else a streamed or buffered generation."""
    rec = req.rec
    if req.fault in HTTP_FAULTS:
        rng = request_rng(req.server.seed, req.server.settings.name, rec.seq, "status")
        rec.http_status = fault_status(req.fault, rng)
        rec.finish_reason = "abort"
        rec.finished_at = time.perf_counter()
        return error_response(req.server.settings.dialect, rec.http_status, req.request_id)
    if req.stream:
        return await _stream(req, request, fmt)
    return await _buffered(req, request, fmt)


def _fault_point(req: SimRequest) -> int:
    """Tokens sent before a mid-stream fault strikes: the profile's setting, else half the plan."""
    if req.profile.fault_after_tokens is not None:
        return req.profile.fault_after_tokens
    return (req.plan.n or 0) // 2


def _abort(req: SimRequest) -> None:
    if req.rec.finish_reason is None:
        req.rec.finish_reason = "abort"
        req.rec.finished_at = time.perf_counter()


def _bytes(req: SimRequest, data: bytes) -> bytes:
    return data.replace(_MARKER, INVALID_UTF8_BYTES) if req.profile.invalid_utf8 else data


async def _stream(req: SimRequest, request: web.Request, fmt: Formatter) -> web.StreamResponse:
    rec = req.rec
    headers = {
        "Content-Type": fmt.stream_content_type,
        "Cache-Control": "no-cache",
        "x-sim-request-id": rec.request_id,
    }
    if req.server.settings.close_after_stream:
        headers["Keep-Alive"] = "timeout=5, max=100"
    resp = web.StreamResponse(status=200, headers=headers)
    await resp.prepare(request)
    fault = req.fault if req.fault in _STREAM_FAULTS else None
    strike_at = _fault_point(req)
    sent = 0
    gen = req.generation(pings=fmt.supports_pings)
    try:
        for obj in fmt.start():
            await resp.write(fmt.frame(obj))
        if fault is not None and strike_at == 0:
            return await _strike(req, request, resp, fmt, fault)
        async with aclosing(gen.run()) as events:
            async for ev in events:
                if isinstance(ev, Ping):
                    await resp.write(fmt.ping())
                    continue
                await _write_chunk(req, resp, fmt, ev)
                sent += ev.tokens
                # Strike before the generator computes another token, so truth holds exactly what was sent.
                if fault is not None and sent >= strike_at:
                    return await _strike(req, request, resp, fmt, fault)
        if fault is not None:
            return await _strike(req, request, resp, fmt, fault)
        for obj in fmt.finish(gen):
            await resp.write(_bytes(req, fmt.frame(obj)))
        done = fmt.done()
        if done:
            await resp.write(done)
        await resp.write_eof()
        rec.completed = True
    except ConnectionError:
        return resp  # the client went away; the generation was released by aclosing
    if req.server.settings.close_after_stream and request.transport is not None:
        # llama-server closes after every streamed response although it sent Keep-Alive.
        request.transport.close()
    return resp


async def _write_chunk(req: SimRequest, resp: web.StreamResponse, fmt: Formatter, chunk: Chunk) -> None:
    await resp.write(_bytes(req, fmt.frame(fmt.chunk(chunk))))
    req.rec.add_chunk(time.perf_counter(), chunk.tokens, chunk.phase)


async def _strike(
    req: SimRequest, request: web.Request, resp: web.StreamResponse, fmt: Formatter, fault: str
) -> web.StreamResponse:
    """Apply a mid-stream fault to an already-started 200 response."""
    _abort(req)
    if fault == "stall":
        await asyncio.sleep(req.profile.stall_seconds)
        reset_connection(request)
        return resp
    if fault == "reset":
        reset_connection(request)
        return resp
    if fault == "malformed_json":
        await resp.write(fmt.malformed())
    elif fault == "wrong_shape":
        await resp.write(fmt.frame(fmt.wrong_shape()))
        done = fmt.done()
        if done:
            await resp.write(done)
    else:
        await resp.write(fmt.error_event(overloaded=fault == "overloaded_mid_stream"))
    await resp.write_eof()
    return resp


async def _buffered(req: SimRequest, request: web.Request, fmt: Formatter) -> web.StreamResponse:
    rec = req.rec
    headers = {"x-sim-request-id": rec.request_id}
    if req.fault == "stall":
        _abort(req)
        await asyncio.sleep(req.profile.stall_seconds)
        reset_connection(request)
        return web.Response(status=200, headers=headers)
    gen: Generation = req.generation(pings=False)
    async with aclosing(gen.run()) as events:
        async for _ in events:
            pass
    if req.fault == "reset":
        reset_connection(request)
        return web.Response(status=200, headers=headers)
    if req.fault in ("error_mid_stream", "overloaded_mid_stream"):
        rec.http_status = 529 if req.fault == "overloaded_mid_stream" else 500
        return error_response(req.server.settings.dialect, rec.http_status, rec.request_id)
    if req.fault == "wrong_shape":
        text = dumps(fmt.wrong_shape())
    else:
        text = dumps(fmt.body(gen))
        if req.fault == "malformed_json":
            text = text[: max(1, len(text) // 2)]
    data = _bytes(req, text.encode())
    rec.completed = True
    return web.Response(status=200, body=data, content_type="application/json", headers=headers)
