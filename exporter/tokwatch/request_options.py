"""Request options shared by probe and benchmark: fixed-length output, `extra_body` merging, the timed
run's unique prefix."""

from __future__ import annotations

import uuid
from typing import Any

# Kinds whose OpenAI-compatible API accepts ignore_eos (and, but for llama.cpp, min_tokens): the server then
# generates exactly max_tokens, so a short answer means the server stopped short, not that the model ended.
FIXED_LENGTH_KINDS = frozenset({"vllm", "sglang", "llamacpp"})


def fixed_output_fields(kind: str, max_tokens: int) -> dict[str, Any]:
    """Body fields that ask this kind of server for exactly `max_tokens` tokens ({} where unsupported)."""
    if kind not in FIXED_LENGTH_KINDS and kind != "openai":
        return {}
    fields: dict[str, Any] = {"ignore_eos": True}
    if kind != "llamacpp":  # llama-server has no min_tokens; ignore_eos alone runs to n_predict
        fields["min_tokens"] = max_tokens
    return fields


def wants_fixed_output(kind: str, setting: bool | None) -> bool:
    """`probe.fixed_output`: None (default) means yes where the kind supports it, never for others."""
    return kind in FIXED_LENGTH_KINDS if setting is None else setting and kind != "ollama"


def merge_body(body: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`body` updated with `extra`; nested objects (e.g. `options`, `stream_options`) merge key by key."""
    out = dict(body)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_body(out[key], value)
        else:
            out[key] = value
    return out


def unique_prefix() -> str:
    """A short prefix no earlier request had, so no prompt cache can serve the timed run's prefill."""
    return f"[run {uuid.uuid4().hex[:12]}] "
