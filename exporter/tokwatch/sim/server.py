"""The simulator's aiohttp app: simulated servers under /<name>/, admin routes under /_sim/."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
from collections.abc import AsyncGenerator
from contextlib import aclosing, suppress

from aiohttp import web
from pydantic import ValidationError

from tokwatch.settings.setting_values import parse_listen
from tokwatch.sim.config import FaultSettings, SimConfig
from tokwatch.sim.context import open_request
from tokwatch.sim.dialects.anthropic import handle_anthropic_route
from tokwatch.sim.dialects.llamacpp import handle_llamacpp_route
from tokwatch.sim.dialects.ollama import handle_ollama_route
from tokwatch.sim.dialects.openai import handle_openai_route
from tokwatch.sim.faults import error_payload, error_response
from tokwatch.sim.generation import Chunk, Ping
from tokwatch.sim.power import CONTENT_TYPE as POWER_CONTENT_TYPE
from tokwatch.sim.profile import Limits
from tokwatch.sim.runtime import ServerState, SimState
from tokwatch.sim.spans import server_span
from tokwatch.sim.text import PROMPT_TOKENS_PER_WORD
from tokwatch.tracing.context import TRACEPARENT, parse_traceparent
from tokwatch.tracing.otlp import SpanSink

log = logging.getLogger("tokwatch.sim")
SIM_STATE = web.AppKey("sim_state", SimState)
_BACKGROUND = web.AppKey("sim_background", list[asyncio.Task[None]])
_SPANS = web.AppKey("sim_spans", SpanSink)
_PUBLIC_PATHS = frozenset({"health", "metrics", "", "api/version", "dcgm/metrics"})
SHUTDOWN_TIMEOUT_S = 1.0


def build_app(config: SimConfig) -> web.Application:
    """The simulator app for `config` (state in app[SIM_STATE])."""
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app[SIM_STATE] = SimState.build(config)
    app.router.add_get("/_sim/requests", _list_truth)
    app.router.add_get("/_sim/requests/{request_id}", _get_truth)
    app.router.add_get("/_sim/servers", _list_servers)
    app.router.add_post("/_sim/servers/{server}/models/{model}/faults", _set_faults)
    app.router.add_post("/_sim/servers/{server}/restart", _restart)
    app.router.add_route("*", "/{server}/{tail:.*}", _dispatch)
    app.router.add_route("*", "/{server}", _dispatch)
    app.on_startup.append(_start_background)
    app.on_cleanup.append(_stop_background)
    if config.otlp_endpoint is not None:
        app[_SPANS] = SpanSink(config.otlp_endpoint, "tokwatch-sim")
        app.on_cleanup.append(_close_spans)
    return app


async def _close_spans(app: web.Application) -> None:
    await asyncio.to_thread(app[_SPANS].close)  # flushes: its HTTP posts block


async def _dispatch(request: web.Request) -> web.StreamResponse:
    resp = await _answer(request)
    sink = request.app.get(_SPANS)
    parent = parse_traceparent(request.headers.get(TRACEPARENT)) if sink is not None else None
    if sink is not None and parent is not None:  # the answer is written: nothing here delays a token
        rec = request.app[SIM_STATE].truth.get(resp.headers.get("x-sim-request-id", ""))
        if rec is not None:
            sink.emit(server_span(parent, rec, sink.clock))
    return resp


async def _answer(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    name = request.match_info["server"]
    server = state.servers.get(name)
    if server is None:
        return web.json_response({"error": f"no simulated server named {name!r}"}, status=404)
    path = request.match_info.get("tail", "").strip("/")
    dialect = server.settings.dialect
    key = server.settings.api_key
    if key is None:
        authorized = True
    elif dialect == "anthropic":
        authorized = request.headers.get("x-api-key", "") == key.get_secret_value()
    else:
        authorized = request.headers.get("Authorization", "") == f"Bearer {key.get_secret_value()}"
    if not authorized and path not in _PUBLIC_PATHS:
        return error_response(dialect, 401, None)
    if path == "dcgm/metrics" and request.method == "GET" and server.power is not None:
        return web.Response(body=server.power.render(), headers={"Content-Type": POWER_CONTENT_TYPE})
    if path == "metrics" and request.method == "GET":
        rendered = server.metrics.render()
        if rendered is not None:
            body, content_type = rendered
            return web.Response(body=body, headers={"Content-Type": content_type})
    resp: web.StreamResponse | None = None
    if dialect == "ollama":
        resp = await handle_ollama_route(server, request, path)
    elif dialect == "anthropic":
        resp = await handle_anthropic_route(server, request, path)
    else:
        if dialect == "llamacpp":
            resp = await handle_llamacpp_route(server, request, path)
        elif path == "health" and request.method == "GET":
            resp = web.Response(status=200)
        if resp is None:
            resp = await handle_openai_route(server, request, path)
    if resp is None:
        if dialect == "ollama":
            return web.Response(status=404, text="404 page not found")
        return web.json_response(error_payload(dialect, 404, f"Not Found: /{path}"), status=404)
    return resp


async def _get_truth(request: web.Request) -> web.Response:
    rec = request.app[SIM_STATE].truth.get(request.match_info["request_id"])
    if rec is None:
        return web.json_response({"error": "unknown or evicted request id"}, status=404)
    return web.json_response(rec.to_json())


async def _list_truth(request: web.Request) -> web.Response:
    query = request.query
    try:
        limit = min(max(int(query.get("last", "100")), 1), 10_000)
    except ValueError:
        return web.json_response({"error": "last must be an integer"}, status=400)
    records = request.app[SIM_STATE].truth.recent(query.get("model"), limit)
    return web.json_response({"requests": [rec.to_json() for rec in records]})


async def _list_servers(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    return web.json_response(
        {
            "servers": [
                {"name": s.settings.name, "dialect": s.settings.dialect, "models": list(s.models)}
                for s in state.servers.values()
            ]
        }
    )


def set_faults(state: SimState, server: str, model: str, probs: dict[str, object]) -> FaultSettings:
    """Replace a model's fault probabilities (unnamed faults become 0); raises KeyError/ValueError."""
    srv = state.servers.get(server)
    if srv is None:
        raise KeyError(f"no simulated server named {server!r}")
    target = srv.models.get(model)
    if target is None:
        raise KeyError(f"server {server!r} has no model {model!r}")
    try:
        faults = FaultSettings.model_validate(probs)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: "
            + ("unknown fault" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, "))
            for e in exc.errors()
        )
        raise ValueError(problems) from None
    target.faults = faults
    return faults


async def _set_faults(request: web.Request) -> web.Response:
    try:
        body = json.loads(await request.read() or b"{}")
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object of fault probabilities")
        faults = set_faults(
            request.app[SIM_STATE], request.match_info["server"], request.match_info["model"], body
        )
    except KeyError as exc:
        return web.json_response({"error": exc.args[0]}, status=404)
    except (ValueError, UnicodeDecodeError) as exc:
        return web.json_response({"error": str(exc)}, status=400)
    return web.json_response({"faults": faults.as_dict()})


async def _restart(request: web.Request) -> web.Response:
    server = request.app[SIM_STATE].servers.get(request.match_info["server"])
    if server is None:
        return web.json_response({"error": "no such server"}, status=404)
    server.restart()
    return web.json_response({"restarted": server.settings.name})


# --- background traffic ---------------------------------------------------------------------------------


async def _start_background(app: web.Application) -> None:
    state = app[SIM_STATE]
    tasks = [
        asyncio.create_task(_background_loop(state, s), name=f"sim-background-{s.settings.name}")
        for s in state.servers.values()
        if s.settings.background_rps > 0
    ]
    app[_BACKGROUND] = tasks


async def _stop_background(app: web.Application) -> None:
    tasks = app.get(_BACKGROUND, [])
    for t in tasks:
        t.cancel()
    for t in tasks:
        with suppress(asyncio.CancelledError):
            await t


async def _background_loop(state: SimState, server: ServerState) -> None:
    """Poisson arrivals of anonymous requests that share the engine (and its counters) with probes."""
    settings = server.settings
    rng = random.Random(f"{state.config.seed}:{settings.name}:background")
    words = max(1, round(settings.background_prompt_tokens / PROMPT_TOKENS_PER_WORD))
    prompt = " ".join(["background"] * words)
    inflight: set[asyncio.Task[None]] = set()
    try:
        while True:
            await asyncio.sleep(rng.expovariate(settings.background_rps))
            if len(inflight) >= settings.max_running * 2:
                continue  # keep a saturated server from piling up unbounded work
            opened = open_request(
                server,
                "background",
                model_name=None,
                prompt_texts=[prompt],
                limits=Limits(settings.background_max_tokens, ignore_eos=True),
                stream=False,
                background=True,
            )
            if isinstance(opened, web.Response):
                continue
            task = asyncio.create_task(_drain(opened.generation(pings=False).run()))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
    finally:
        for t in list(inflight):
            t.cancel()
        for t in list(inflight):
            with suppress(asyncio.CancelledError):
                await t


async def _drain(events: AsyncGenerator[Chunk | Ping, None]) -> None:
    async with aclosing(events) as it:
        async for _ in it:
            pass


# --- serving --------------------------------------------------------------------------------------------


async def start_runner(
    config: SimConfig, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, web.Application, int]:
    """Start the app on host:port (over TLS with `ssl_context`); returns the runner, the app and the bound
    port."""
    app = build_app(config)
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = port
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            bound = int(addr[1])
            break
    return runner, app, bound


async def serve_sim(config: SimConfig, listen: str | None, stop: asyncio.Event) -> None:
    """Serve the simulator on `listen` (default: config.listen) until `stop` is set."""
    host, port = parse_listen(listen or config.listen)
    runner, _, bound = await start_runner(config, host, port)
    try:
        names = ", ".join(s.name for s in config.servers)
        log.info("tokwatch sim listening on http://%s:%d (servers: %s)", host, bound, names)
        await stop.wait()
    finally:
        await runner.cleanup()
