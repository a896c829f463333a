"""An OpenAI-compatible endpoint that records every request it gets (request line, headers) and refuses one
without the headers and query parameters it requires, quoting what it was sent (as some gateways do, so a
test sees whether tokwatch masks it). Start it with the `serve` fixture: `await serve(echo.routes())`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TOKEN_GAP_S = 0.002  # 500 tok/s: a plausible rate however the reads merge


@dataclass(frozen=True)
class Seen:
    """One request as it arrived: `line` is the request line's method and target (path and query, as sent)."""

    method: str
    target: str
    headers: dict[str, str]  # lower-cased names

    @property
    def line(self) -> str:
        """`METHOD /path?query`."""
        return f"{self.method} {self.target}"


@dataclass
class EchoEndpoint:
    """Answers POSTs with a streamed chat completion of `max_tokens` tokens and GET /metrics with a vLLM
    counter; 401 (quoting the headers it got) when a required header or query parameter is missing or
    wrong."""

    require_headers: dict[str, str] = field(default_factory=dict)
    require_query: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def routes(self) -> dict[str, Handler]:
        """Every path goes to the one handler."""
        return {"/{tail:.*}": self.handle}

    def _refusal(self, request: web.Request) -> str | None:
        for name, want in self.require_headers.items():
            if request.headers.get(name) != want:
                got = "; ".join(f"{k}: {v}" for k, v in request.headers.items())
                return f"missing or wrong {name} (received {got})"
        for name, want in self.require_query.items():
            if request.query.get(name) != want:
                return f"missing or wrong query parameter {name} (received {request.query_string})"
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Record, check, answer."""
        self.seen.append(
            Seen(request.method, request.raw_path, {k.lower(): v for k, v in request.headers.items()})
        )
        refusal = self._refusal(request)
        if refusal is not None:
            return web.json_response({"error": {"message": refusal, "code": "unauthorized"}}, status=401)
        if request.method == "GET":
            text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 0\n'
            return web.Response(text=text, content_type="text/plain")
        body = json.loads(await request.read())
        n = int(body.get("max_tokens") or 8)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        model = body.get("model", "m")
        for i in range(n):
            await asyncio.sleep(TOKEN_GAP_S)
            chunk = {
                "model": model,
                "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last = {
            "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": n},
        }
        await resp.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    def posts(self) -> list[Seen]:
        """The generation requests seen (GETs such as /metrics scrapes left out)."""
        return [s for s in self.seen if s.method == "POST"]
