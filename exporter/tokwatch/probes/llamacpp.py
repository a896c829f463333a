"""The llama.cpp (llama-server) kind: the OpenAI route, `timings` as the engine source, /metrics counters."""

from __future__ import annotations

from typing import Any

from tokwatch.probes.openai import OpenAIProbe


class LlamaCppProbe(OpenAIProbe):
    """`engine` = predicted_n / (predicted_ms / 1000) from the answer's `timings`."""

    kind = "llamacpp"
    counter_adapter = "llamacpp"
    fixed_length = True
    think_budget_field = "reasoning_budget_tokens"

    @classmethod
    def fixed_output_fields(cls, max_tokens: int) -> dict[str, Any]:
        """`ignore_eos` alone: llama-server has no min_tokens, and with ignore_eos it runs to n_predict."""
        return {"ignore_eos": True}

    @classmethod
    def with_thinking(cls, body: dict[str, Any], budget: int | None) -> dict[str, Any]:
        """`reasoning_budget_tokens`, llama-server's per-request form of `--reasoning-budget`."""
        return body if budget is None else {**body, "reasoning_budget_tokens": budget}
