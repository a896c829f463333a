"""The Anthropic kind: the Messages API (POST /v1/messages), streamed as SSE events or one JSON message.

The key goes in `x-api-key` (the kind's default `auth`), the API version in `anthropic-version` (an
endpoint's `headers` may set another, and `anthropic-beta`). The system prompt is the top-level `system`
field, not a message. Anthropic publishes no server timings and no /metrics: tok/s comes from the stream.
"""

from __future__ import annotations

from typing import Any

from tokwatch.probes.http import ChatRequest, HttpProbe
from tokwatch.settings.config import server_root
from tokwatch.streams.anthropic import AnthropicStreamParser, parse_message
from tokwatch.streams.events import StreamEvent, StreamParser

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicProbe(HttpProbe):
    """Messages API requests; thinking blocks (asked for with `extra_body: {thinking: ...}`) are the
    reasoning phase. Anthropic has no fixed-output fields."""

    kind = "anthropic"
    auth_header = "x-api-key"
    think_budget_field = "thinking.budget_tokens"
    min_think_budget = 1024  # the Messages API refuses a smaller budget_tokens

    @classmethod
    def url(cls, base_url: str) -> str:
        """The Messages route (base_url with or without its `/v1`)."""
        return f"{server_root(base_url)}/v1/messages"

    @classmethod
    def protocol_headers(cls) -> dict[str, str]:
        """The API version every request must name."""
        return {"anthropic-version": ANTHROPIC_VERSION}

    @classmethod
    def body(cls, request: ChatRequest) -> dict[str, Any]:
        """A Messages request: system messages joined into `system`, the others as they are."""
        system = [m["content"] for m in request.messages if m.get("role") == "system"]
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": [dict(m) for m in request.messages if m.get("role") != "system"],
            "temperature": request.temperature,
            "stream": request.stream,
        }
        if system:
            body["system"] = "\n\n".join(system)
        return body

    @classmethod
    def with_thinking(cls, body: dict[str, Any], budget: int | None) -> dict[str, Any]:
        """Extended thinking: `thinking: {type: enabled, budget_tokens}`, which the API takes only below
        max_tokens and without a temperature other than 1 (so the temperature is left out)."""
        if budget is None:
            return body
        out = {k: v for k, v in body.items() if k != "temperature"}
        out["thinking"] = {"type": "enabled", "budget_tokens": budget}
        out["max_tokens"] = max(int(body["max_tokens"]), budget + 1)
        return out

    @classmethod
    def parser(cls) -> StreamParser:
        """SSE Messages events."""
        return AnthropicStreamParser()

    @classmethod
    def parse_whole(cls, obj: Any, t: float) -> list[StreamEvent]:
        """A non-streamed message."""
        return parse_message(obj, t)
