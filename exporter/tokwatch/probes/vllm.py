"""The vLLM kind: the OpenAI route, per-chunk usage, fixed-length output, counters from vLLM's /metrics."""

from __future__ import annotations

from typing import Any

from tokwatch.probes.http import ChatRequest
from tokwatch.probes.openai import OpenAIProbe


class VllmProbe(OpenAIProbe):
    """Asks for per-chunk usage so multi-token chunks are counted by the server, not estimated."""

    kind = "vllm"
    counter_adapter = "vllm"
    fixed_length = True
    think_budget_field = "thinking_token_budget"

    @classmethod
    def body(cls, request: ChatRequest) -> dict[str, Any]:
        """OpenAI body with vLLM's `continuous_usage_stats` when streaming."""
        body = super().body(request)
        if request.stream:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body

    @classmethod
    def with_thinking(cls, body: dict[str, Any], budget: int | None) -> dict[str, Any]:
        """`thinking_token_budget` (vLLM's per-request budget; the server needs `--reasoning-config` with
        the model's think start/end strings to enforce it)."""
        return body if budget is None else {**body, "thinking_token_budget": budget}
