"""llama-server's native routes: POST /completion, GET /health (OpenAI routes come from the openai module)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tokwatch.sim.context import open_request
from tokwatch.sim.dialects.base import Formatter
from tokwatch.sim.dialects.common import (
    BadRequest,
    int_field,
    llamacpp_timings,
    phase_texts,
    read_json_object,
)
from tokwatch.sim.faults import error_response
from tokwatch.sim.generation import Chunk, Generation
from tokwatch.sim.profile import Limits
from tokwatch.sim.responder import respond
from tokwatch.sim.runtime import ServerState


class NativeCompletionFormatter(Formatter):
    """POST /completion: SSE without a [DONE] terminator; the last record has stop=true and timings."""

    supports_pings = False

    def done(self) -> bytes | None:
        """The native stream simply ends."""
        return None

    def _base(self, content: str, stop: bool) -> dict[str, Any]:
        return {
            "index": 0,
            "content": content,
            "tokens": [],
            "stop": stop,
            "id_slot": self.req.engine.index,
            "tokens_predicted": self.req.rec.tokens,
            "tokens_evaluated": self.req.rec.prompt_tokens,
        }

    def chunk(self, chunk: Chunk) -> Any:
        """A content record."""
        return self._base(chunk.text, False)

    def _final(self, content: str) -> dict[str, Any]:
        req = self.req
        out = self._base(content, True)
        out.update(
            {
                "model": req.model_name,
                "generation_settings": {
                    "n_predict": req.rec.max_tokens if req.rec.max_tokens is not None else -1,
                    "temperature": 0.8,
                    "stream": req.stream,
                },
                "prompt": "",
                "has_new_line": False,
                "truncated": False,
                "stop_type": "limit" if req.rec.finish_reason == "length" else "eos",
                "stopping_word": "",
                "tokens_cached": req.rec.prompt_tokens + req.rec.tokens,
                "timings": llamacpp_timings(req),
            }
        )
        return out

    def finish(self, gen: Generation) -> list[Any]:
        """The stop record."""
        return [self._final("")]

    def body(self, gen: Generation) -> Any:
        """The whole completion."""
        think, output = phase_texts(self.req)
        return self._final(think + output)

    def wrong_shape(self) -> Any:
        """Valid JSON no llama.cpp client expects."""
        return {"index": 0, "result": None, "stop": "maybe"}

    def malformed(self) -> bytes:
        """A record whose JSON never closes."""
        return b'data: {"index":0,"content":"\n\n'


async def handle_llamacpp_route(
    server: ServerState, request: web.Request, path: str
) -> web.StreamResponse | None:
    """Serve llama-server's own routes; None when `path` is not one of them."""
    if path == "health" and request.method == "GET":
        return web.json_response({"status": "ok"})
    if path not in ("completion", "completions") or request.method != "POST":
        return None
    try:
        body = await read_json_object(request)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            texts = [prompt]
        elif isinstance(prompt, list):
            texts = [str(p) for p in prompt]
        else:
            raise BadRequest('"prompt" must be provided')
        n_predict = int_field(body, "n_predict", minimum=-1)
        stream = body.get("stream", False)
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(stream, bool) or not isinstance(ignore_eos, bool):
            raise BadRequest("stream and ignore_eos must be booleans")
    except BadRequest as exc:
        return error_response("llamacpp", 400, None, str(exc))
    limits = Limits(None if n_predict in (None, -1) else n_predict, ignore_eos)
    opened = open_request(
        server, request.path, model_name=None, prompt_texts=texts, limits=limits, stream=stream
    )
    if isinstance(opened, web.Response):
        return opened
    return await respond(opened, request, NativeCompletionFormatter(opened))
