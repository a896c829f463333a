"""The SGLang kind: the OpenAI route, fixed-length output, counters from SGLang's /metrics."""

from __future__ import annotations

from typing import Any

from tokwatch.probes.openai import OpenAIProbe


class SGLangProbe(OpenAIProbe):
    """OpenAI-compatible answers; tok/s from /metrics counters when a counter window is configured."""

    kind = "sglang"
    counter_adapter = "sglang"
    fixed_length = True
    think_budget_field = "custom_params.thinking_budget"

    @classmethod
    def with_thinking(cls, body: dict[str, Any], budget: int | None) -> dict[str, Any]:
        """`custom_params: {thinking_budget}`: enforced by a server started with `--enable-strict-thinking`
        (or the thinking-budget custom logit processor)."""
        if budget is None:
            return body
        params = body.get("custom_params")
        merged = {**(params if isinstance(params, dict) else {}), "thinking_budget": budget}
        return {**body, "custom_params": merged}
