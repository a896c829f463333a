"""OpenAI-compatible chat completions probe: POST /v1/chat/completions, SSE chunks or one JSON answer."""

from __future__ import annotations

from typing import Any

from tokwatch.config import server_root
from tokwatch.probes.base import ProbeContext
from tokwatch.probes.http import HttpProbe, RequestPlan, chat_messages
from tokwatch.streams.events import StreamEvent, StreamParser
from tokwatch.streams.openai import OpenAIStreamParser, parse_chat_completion


class OpenAIProbe(HttpProbe):
    """POST {server_root}/v1/chat/completions with stream_options.include_usage when streaming."""

    kind = "openai"

    def url(self, ctx: ProbeContext) -> str:
        """The chat completions route."""
        return f"{server_root(ctx.endpoint.base_url)}/v1/chat/completions"

    def body(self, ctx: ProbeContext, plan: RequestPlan) -> dict[str, Any]:
        """Chat request with optional system prompt."""
        body: dict[str, Any] = {
            "model": ctx.endpoint.model,
            "messages": chat_messages(plan),
            "max_tokens": plan.max_tokens,
            "temperature": ctx.settings.temperature,
            "stream": plan.stream,
        }
        if plan.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def parser(self) -> StreamParser:
        """SSE chat-completion chunks."""
        return OpenAIStreamParser()

    def parse_whole(self, obj: Any, t: float) -> list[StreamEvent]:
        """A non-streamed chat completion."""
        return parse_chat_completion(obj, t)
