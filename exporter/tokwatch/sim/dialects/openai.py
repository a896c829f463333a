"""OpenAI-compatible wire format as OpenAI, vLLM, SGLang and llama-server speak it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web

from tokwatch.sim.context import open_request
from tokwatch.sim.dialects.base import Formatter
from tokwatch.sim.dialects.common import (
    BadRequest,
    llamacpp_timings,
    openai_limits,
    phase_texts,
    read_json_object,
    think_request,
)
from tokwatch.sim.faults import error_response
from tokwatch.sim.generation import Chunk, Generation
from tokwatch.sim.responder import respond
from tokwatch.sim.runtime import ServerState
from tokwatch.sim.text import message_texts

# vLLM marks the last content chunk with finish_reason; OpenAI, SGLang and llama.cpp send a separate chunk.
_FINISH_ON_LAST_CHUNK = frozenset({"vllm"})


class _OpenAIBase(Formatter):
    object_chunk = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    @property
    def _finish_on_last(self) -> bool:
        return self.dialect in _FINISH_ON_LAST_CHUNK

    def envelope(self, choices: list[Any], obj: str | None = None) -> dict[str, Any]:
        """The fields around `choices`, in the server's own key order."""
        req = self.req
        if self.dialect == "llamacpp":
            return {
                "choices": choices,
                "created": req.created,
                "id": self.id_prefix + req.body_id,
                "model": req.model_name,
                "system_fingerprint": "b0-unknown",
                "object": obj or self.object_chunk,
            }
        return {
            "id": self.id_prefix + req.body_id,
            "object": obj or self.object_chunk,
            "created": req.created,
            "model": req.model_name,
            "choices": choices,
        }

    def usage(self) -> dict[str, Any]:
        """Token usage; completion_tokens includes reasoning tokens."""
        rec = self.req.rec
        if self.dialect == "llamacpp":
            return {
                "completion_tokens": rec.tokens,
                "prompt_tokens": rec.prompt_tokens,
                "total_tokens": rec.prompt_tokens + rec.tokens,
                "prompt_tokens_details": {"cached_tokens": rec.cached_tokens},
            }
        out: dict[str, Any] = {
            "prompt_tokens": rec.prompt_tokens,
            "total_tokens": rec.prompt_tokens + rec.tokens,
            "completion_tokens": rec.tokens,
            "prompt_tokens_details": None,
        }
        if self.dialect == "openai":
            out["prompt_tokens_details"] = {"cached_tokens": rec.cached_tokens}
            out["completion_tokens_details"] = {"reasoning_tokens": rec.think_tokens}
        return out

    def usage_record(self) -> dict[str, Any]:
        """The include_usage chunk: empty choices plus usage (and llama.cpp's timings)."""
        rec = self.envelope([])
        rec["usage"] = self.usage()
        if self.dialect == "llamacpp":
            rec["timings"] = llamacpp_timings(self.req)
        return rec

    def choice(self, payload: dict[str, Any], finish: str | None) -> dict[str, Any]:
        """One streamed choice."""
        if self.dialect == "llamacpp":
            return {"finish_reason": finish, "index": 0, **payload}
        out: dict[str, Any] = {"index": 0, **payload, "logprobs": None, "finish_reason": finish}
        if self.dialect == "vllm":
            out["stop_reason"] = None
        return out

    def finish_records(self, payload: dict[str, Any]) -> list[Any]:
        """The separate finish chunk (unless vLLM) and the usage chunk."""
        out: list[Any] = []
        if not self._finish_on_last:
            rec = self.envelope([self.choice(payload, self.req.rec.finish_reason)])
            if self.dialect == "llamacpp" and not self.req.include_usage:
                rec["timings"] = llamacpp_timings(self.req)
            out.append(rec)
        if self.req.include_usage:
            out.append(self.usage_record())
        return out


class ChatFormatter(_OpenAIBase):
    """POST /v1/chat/completions."""

    def start(self) -> list[Any]:
        """The role-only first chunk."""
        content = None if self.dialect == "llamacpp" else ""
        return [self.envelope([self.choice({"delta": {"role": "assistant", "content": content}}, None)])]

    def _delta(self, chunk: Chunk) -> dict[str, Any]:
        if chunk.phase == "think":
            fmt = self.req.profile.reasoning_format
            if fmt != "think_tags":
                return {fmt: chunk.text}
        return {"content": chunk.text}

    def chunk(self, chunk: Chunk) -> Any:
        """A content (or reasoning) delta."""
        finish = self.req.plan.finish_reason if chunk.last and self._finish_on_last else None
        return self.envelope([self.choice({"delta": self._delta(chunk)}, finish)])

    def finish(self, gen: Generation) -> list[Any]:
        """Finish chunk and usage chunk."""
        return self.finish_records({"delta": {}})

    def body(self, gen: Generation) -> Any:
        """chat.completion."""
        req = self.req
        think, output = phase_texts(req)
        fmt = req.profile.reasoning_format
        message: dict[str, Any] = {"role": "assistant", "content": output}
        if fmt == "think_tags":
            message["content"] = think + output
        elif think:
            message[fmt] = think
        elif self.dialect == "vllm":
            message["reasoning_content"] = None
        if self.dialect == "llamacpp":
            return {
                "choices": [{"finish_reason": req.rec.finish_reason, "index": 0, "message": message}],
                "created": req.created,
                "model": req.model_name,
                "system_fingerprint": "b0-unknown",
                "object": "chat.completion",
                "usage": self.usage(),
                "id": self.id_prefix + req.body_id,
                "timings": llamacpp_timings(req),
            }
        if self.dialect == "vllm":
            message.update(
                {"refusal": None, "annotations": None, "audio": None, "function_call": None, "tool_calls": []}
            )
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": req.rec.finish_reason,
        }
        if self.dialect == "vllm":
            choice["stop_reason"] = None
        out = self.envelope([choice], "chat.completion")
        out["usage"] = self.usage()
        if self.dialect == "vllm":
            out.update({"prompt_logprobs": None, "kv_transfer_params": None})
        elif self.dialect == "openai":
            out.update({"service_tier": "default", "system_fingerprint": "fp_sim"})
        return out


class CompletionFormatter(_OpenAIBase):
    """POST /v1/completions: plain text, the reasoning phase (if any) is part of the text."""

    object_chunk = "text_completion"
    id_prefix = "cmpl-"

    def chunk(self, chunk: Chunk) -> Any:
        """A text delta."""
        finish = self.req.plan.finish_reason if chunk.last and self._finish_on_last else None
        return self.envelope([self.choice({"text": chunk.text}, finish)])

    def finish(self, gen: Generation) -> list[Any]:
        """Finish chunk and usage chunk."""
        return self.finish_records({"text": ""})

    def body(self, gen: Generation) -> Any:
        """text_completion."""
        think, output = phase_texts(self.req)
        choice = self.choice({"text": think + output}, self.req.rec.finish_reason)
        out = self.envelope([choice])
        out["usage"] = self.usage()
        if self.dialect == "llamacpp":
            out["timings"] = llamacpp_timings(self.req)
        return out


def models_list(server: ServerState) -> dict[str, Any]:
    """GET /v1/models."""
    owner = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp"}.get(
        server.settings.dialect, "system"
    )
    data = [
        {
            "id": m,
            "object": "model",
            "created": 1700000000,
            "owned_by": owner,
            "root": m,
            "parent": None,
            "max_model_len": 32768,
        }
        for m in server.models
    ]
    return {"object": "list", "data": data}


async def handle_openai_route(
    server: ServerState, request: web.Request, path: str
) -> web.StreamResponse | None:
    """Serve the OpenAI routes under a server; None when `path` is not one of them."""
    dialect = server.settings.dialect
    if path == "v1/models" and request.method == "GET":
        return web.json_response(models_list(server))
    if request.method != "POST" or path not in ("v1/chat/completions", "v1/completions"):
        return None
    chat = path == "v1/chat/completions"
    try:
        body = await read_json_object(request)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages must be a non-empty list")
            texts = message_texts(messages)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                texts = [str(p) for p in prompt]
            elif isinstance(prompt, str):
                texts = [prompt]
            else:
                raise BadRequest("prompt must be a string or a list of strings")
        think, budget = think_request(dialect, body)
        limits = replace(openai_limits(body), think=think, think_budget=budget)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("stream must be a boolean")
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequest("model must be a string")
    except BadRequest as exc:
        return error_response(dialect, 400, None, str(exc))
    opened = open_request(
        server,
        request.path,
        model_name=model,
        prompt_texts=texts,
        limits=limits,
        stream=stream,
        include_usage=include_usage,
    )
    if isinstance(opened, web.Response):
        return opened
    fmt: Formatter = ChatFormatter(opened) if chat else CompletionFormatter(opened)
    return await respond(opened, request, fmt)
