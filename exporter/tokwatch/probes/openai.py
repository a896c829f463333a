"""The OpenAI kind: POST /v1/chat/completions, answered with SSE chunks or one JSON chat completion."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from tokwatch.probes.http import ChatRequest, HttpProbe
from tokwatch.settings.config import server_root
from tokwatch.streams.events import StreamEvent, StreamParser
from tokwatch.streams.openai import OpenAIStreamParser, parse_chat_completion

_AZURE_DEPLOYMENT = re.compile(r"/openai/deployments/[^/]+/?$")


class OpenAIProbe(HttpProbe):
    """Chat completions with `stream_options.include_usage` when streaming.

    The fixed-output fields are vLLM's extension, which OpenAI-compatible servers such as vLLM and SGLang
    accept; cloud APIs reject unknown parameters, so this kind sends them only when `probe.fixed_output`
    is set to true.
    """

    kind = "openai"

    @classmethod
    def url(cls, base_url: str) -> str:
        """The chat completions route; under an Azure OpenAI deployment URL (`/openai/deployments/NAME`),
        the deployment's own `/chat/completions` (Azure's v1 API form, `/openai/v1`, takes the usual one)."""
        if _AZURE_DEPLOYMENT.search(urlsplit(base_url).path):
            return f"{base_url.rstrip('/')}/chat/completions"
        return f"{server_root(base_url)}/v1/chat/completions"

    @classmethod
    def body(cls, request: ChatRequest) -> dict[str, Any]:
        """Chat request; usage on the last chunk when streaming."""
        body: dict[str, Any] = {
            "model": request.model,
            "messages": list(request.messages),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": request.stream,
        }
        if request.stream:
            body["stream_options"] = {"include_usage": True}
        if request.fixed_output:
            body.update(cls.fixed_output_fields(request.max_tokens))
        return body

    @classmethod
    def fixed_output_fields(cls, max_tokens: int) -> dict[str, Any]:
        """`ignore_eos` with `min_tokens`: the server then generates exactly max_tokens."""
        return {"ignore_eos": True, "min_tokens": max_tokens}

    @classmethod
    def parser(cls) -> StreamParser:
        """SSE chat-completion chunks."""
        return OpenAIStreamParser()

    @classmethod
    def parse_whole(cls, obj: Any, t: float) -> list[StreamEvent]:
        """A non-streamed chat completion."""
        return parse_chat_completion(obj, t)
