"""Request parsing helpers shared by the dialects."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tokwatch.sim.context import SimRequest
from tokwatch.sim.profile import Limits


class BadRequest(ValueError):
    """The client sent something the real server would reject with 400."""


def int_field(body: dict[str, Any], *names: str, minimum: int = 0) -> int | None:
    """The first present integer field among `names` (None when absent or null)."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"{name} must be an integer")
        if value < minimum:
            raise BadRequest(f"{name} must be at least {minimum}")
        return value
    return None


def openai_limits(body: dict[str, Any]) -> Limits:
    """max_tokens / max_completion_tokens, ignore_eos and min_tokens (vLLM extensions)."""
    max_tokens = int_field(body, "max_completion_tokens", "max_tokens", minimum=1)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("ignore_eos must be a boolean")
    return Limits(max_tokens, ignore_eos, int_field(body, "min_tokens") or 0)


def think_request(dialect: str, body: dict[str, Any]) -> tuple[bool, int | None]:
    """Whether an OpenAI-style request asks to think, and its think budget, in the dialect's own field:
    vLLM `thinking_token_budget` (or `chat_template_kwargs.enable_thinking`), SGLang
    `custom_params.thinking_budget`, llama-server `reasoning_budget_tokens` (-1: unrestricted), OpenAI
    `reasoning_effort` (a level, no budget)."""
    if dialect == "vllm":
        budget = int_field(body, "thinking_token_budget")
        kwargs = body.get("chat_template_kwargs")
        enabled = isinstance(kwargs, dict) and kwargs.get("enable_thinking") is True
        return budget is not None or enabled, budget
    if dialect == "sglang":
        params = body.get("custom_params")
        budget = int_field(params, "thinking_budget") if isinstance(params, dict) else None
        return budget is not None, budget
    if dialect == "llamacpp":
        budget = int_field(body, "reasoning_budget_tokens", minimum=-1)
        return budget is not None, None if budget is None or budget < 0 else budget
    return body.get("reasoning_effort") is not None, None


def phase_texts(req: SimRequest) -> tuple[str, str]:
    """(reasoning text, output text) of the tokens generated so far."""
    n = req.rec.tokens
    think = min(n, req.plan.think_tokens)
    return (
        "".join(req.plan.text(i) for i in range(think)),
        "".join(req.plan.text(i) for i in range(think, n)),
    )


def llamacpp_timings(req: SimRequest) -> dict[str, Any]:
    """llama-server's `timings`: predicted_ms spans first to last token, per-token figures use n - 1 gaps."""
    rec = req.rec
    prompt_n = rec.prompt_tokens - rec.cached_tokens
    # llama-server measures in microseconds, so its milliseconds carry 3 decimals; rates derive from those.
    prompt_ms = round(rec.prefill_seconds * 1000.0, 3)
    predicted_n = rec.tokens
    predicted_ms = round((rec.decode_seconds or 0.0) * 1000.0, 3)
    gaps = predicted_n - 1
    return {
        "cache_n": rec.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n * 1000.0 / prompt_ms if prompt_ms else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / gaps if gaps > 0 else 0.0,
        "predicted_per_second": gaps * 1000.0 / predicted_ms if gaps > 0 and predicted_ms else 0.0,
    }


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; raises BadRequest naming the problem."""
    try:
        body = json.loads(await request.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body
