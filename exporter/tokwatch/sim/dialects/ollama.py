"""Ollama's native API: /api/chat and /api/generate (NDJSON stream by default), /api/ps, /api/tags."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from tokwatch.sim.context import open_request
from tokwatch.sim.dialects.base import Formatter, dumps
from tokwatch.sim.dialects.common import BadRequest, int_field, phase_texts, read_json_object
from tokwatch.sim.faults import error_payload, error_response
from tokwatch.sim.generation import Chunk, Generation
from tokwatch.sim.profile import Limits
from tokwatch.sim.responder import respond
from tokwatch.sim.runtime import ServerState
from tokwatch.sim.text import message_texts

OLLAMA_VERSION = "0.12.6"
_NS = 1_000_000_000


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class OllamaFormatter(Formatter):
    """One NDJSON object per line; `chat` puts text in message.content, generate in response."""

    stream_content_type = "application/x-ndjson"
    supports_pings = False

    def __init__(self, req: Any, *, chat: bool) -> None:
        super().__init__(req)
        self.chat = chat

    def frame(self, obj: Any) -> bytes:
        """One NDJSON line."""
        return (dumps(obj) + "\n").encode()

    def done(self) -> bytes | None:
        """NDJSON has no terminator; the last object has done=true."""
        return None

    def _thinking_inline(self) -> bool:
        return self.req.profile.reasoning_format == "think_tags"

    def _record(self, content: str, thinking: str | None, done: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.req.model_name, "created_at": _now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def chunk(self, chunk: Chunk) -> Any:
        """A content or thinking line."""
        if chunk.phase == "think" and not self._thinking_inline():
            return self._record("", chunk.text, False)
        return self._record(chunk.text, None, False)

    def _final(self, content: str, thinking: str | None) -> dict[str, Any]:
        req, rec = self.req, self.req.rec
        out = self._record(content, thinking, True)
        del out["done"]
        out["done_reason"] = rec.finish_reason if rec.finish_reason in ("stop", "length") else "stop"
        out["done"] = True
        if not self.chat:
            out["context"] = [
                (rec.seq * 7919 + i) % 32000 for i in range(min(16, rec.prompt_tokens + rec.tokens))
            ]
        first = rec.generated_at[0] if rec.generated_at else rec.arrival
        end = rec.finished_at if rec.finished_at is not None else first
        out["total_duration"] = round((end - rec.arrival) * _NS)
        out["load_duration"] = round(rec.load_seconds * _NS)
        out["prompt_eval_count"] = max(1, rec.prompt_tokens - rec.cached_tokens)
        out["prompt_eval_duration"] = round(rec.prefill_seconds * _NS)
        out["eval_count"] = rec.tokens
        if not req.profile.strip_eval_duration:
            out["eval_duration"] = round(eval_seconds(req) * _NS)
        return out

    def finish(self, gen: Generation) -> list[Any]:
        """The done=true line with durations."""
        return [self._final("", None)]

    def body(self, gen: Generation) -> Any:
        """The whole answer with durations."""
        think, output = phase_texts(self.req)
        if self._thinking_inline():
            return self._final(think + output, None)
        return self._final(output, think or None)

    def wrong_shape(self) -> Any:
        """Valid JSON without message/response/done."""
        return {"model": self.req.model_name, "output": {"text": None}, "status": "unknown"}

    def error_event(self, *, overloaded: bool = False) -> bytes:
        """Ollama reports a failure after 200 as an error line."""
        if overloaded:
            return self.frame(error_payload("ollama", 503))
        return self.frame(error_payload("ollama", 500, "an error was encountered while running the model"))

    def malformed(self) -> bytes:
        """A line whose JSON never closes."""
        return b'{"model":"' + self.req.model_name.encode() + b'","message":{"content":"\n'


def eval_seconds(req: Any) -> float:
    """eval_duration: end of prompt evaluation to the last token, i.e. the decode steps of all eval_count."""
    rec = req.rec
    if not rec.generated_at or rec.prefill_end is None:
        return 0.0
    return max(0.0, rec.generated_at[-1] - rec.prefill_end)


def _model_entry(server: ServerState, name: str, loaded: bool) -> dict[str, Any]:
    profile = server.models[name].profile
    entry: dict[str, Any] = {
        "name": name,
        "model": name,
        "size": profile.size_bytes,
        "digest": hashlib.sha256(name.encode()).hexdigest(),
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": "llama",
            "families": ["llama"],
            "parameter_size": "8.0B",
            "quantization_level": "Q4_K_M",
        },
    }
    if loaded:
        expires = datetime.now(UTC) + timedelta(minutes=5)
        entry["expires_at"] = expires.isoformat().replace("+00:00", "Z")
        entry["size_vram"] = int(profile.size_bytes * profile.vram_fraction)
        entry["context_length"] = 4096
    else:
        entry["modified_at"] = "2025-01-01T00:00:00Z"
    return entry


async def handle_ollama_route(
    server: ServerState, request: web.Request, path: str
) -> web.StreamResponse | None:
    """Serve Ollama's routes; None when `path` is not one of them."""
    if request.method == "GET":
        if path == "":
            return web.Response(text="Ollama is running")
        if path == "api/version":
            return web.json_response({"version": OLLAMA_VERSION})
        if path == "api/tags":
            return web.json_response({"models": [_model_entry(server, m, False) for m in server.models]})
        if path == "api/ps":
            return web.json_response({"models": [_model_entry(server, m, True) for m in server.models]})
        return None
    if request.method != "POST" or path not in ("api/chat", "api/generate"):
        return None
    chat = path == "api/chat"
    try:
        body = await read_json_object(request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model is required")
        if chat:
            messages = body.get("messages", [])
            if not isinstance(messages, list):
                raise BadRequest("messages must be a list")
            texts = message_texts(messages)
        else:
            prompt = body.get("prompt", "")
            system = body.get("system")
            if not isinstance(prompt, str):
                raise BadRequest("prompt must be a string")
            texts = [prompt] + ([system] if isinstance(system, str) else [])
        options = body.get("options") or {}
        if not isinstance(options, dict):
            raise BadRequest("options must be an object")
        num_predict = int_field(options, "num_predict", minimum=-2)
        stream = body.get("stream", True)  # Ollama streams unless told otherwise
        if not isinstance(stream, bool):
            raise BadRequest("stream must be a boolean")
    except BadRequest as exc:
        return error_response("ollama", 400, None, str(exc))
    # `think`: true or a level ("low", "medium", "high"); Ollama has no think budget.
    think = body.get("think") not in (None, False)
    limits = Limits(None if num_predict is None or num_predict < 0 else max(1, num_predict), think=think)
    opened = open_request(
        server, request.path, model_name=model, prompt_texts=texts, limits=limits, stream=stream
    )
    if isinstance(opened, web.Response):
        return opened
    return await respond(opened, request, OllamaFormatter(opened, chat=chat))
