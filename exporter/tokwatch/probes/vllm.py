"""vLLM probe: the OpenAI route plus the server-counter window around the timed run."""

from __future__ import annotations

from typing import Any

from tokwatch.probes.base import ProbeContext
from tokwatch.probes.http import RequestPlan
from tokwatch.probes.openai import OpenAIProbe


class VllmProbe(OpenAIProbe):
    """Asks for per-chunk usage so multi-token chunks are counted by the server, not estimated."""

    kind = "vllm"
    uses_counters = True

    def body(self, ctx: ProbeContext, plan: RequestPlan) -> dict[str, Any]:
        """OpenAI body with vLLM's `continuous_usage_stats` when streaming."""
        body = super().body(ctx, plan)
        if plan.stream:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body
