"""How much of the prompts the server answered from its prefix cache, in every run (single-turn too).

A request's cached tokens are expected up to what it legitimately shares with earlier requests: its
conversation history (seed 003) and the chat template's own tokens (role markers, a default system prompt),
which every request starts with. Cached tokens beyond both mean the prompt itself was seen before — the
run measured the cache, not prefill. Definitions: docs/methodology.md ("Prompt cache").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokwatch.bench.request_metrics import RequestRecord

# Above this share of prompt tokens cached beyond history and template, the health check warns.
OUTSIDE_HISTORY_WARN = 0.05


def template_tokens(r: RequestRecord) -> int:
    """Server-counted prompt tokens beyond the client's count of the message contents: the template's."""
    if r.prompt_tokens is None or r.prompt_tokens_target is None:
        return 0
    return max(0, r.prompt_tokens - r.prompt_tokens_target)


def outside_history(r: RequestRecord) -> int:
    """Cached tokens beyond the request's conversation history and chat template (0 when none cached)."""
    return max(0, (r.cached_tokens or 0) - (r.history_tokens or 0) - template_tokens(r))


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole > 0 else None


def cache_figures(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """summary.json `prompt_cache`: token sums over the measured `ok` requests whose server reported a
    cached count (as the kind's reader gives it, `tokwatch.probes.exchange`), and their shares."""
    ok = [r for r in records if r.ok and not r.warmup]
    reported = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    prompt = sum(r.prompt_tokens or 0 for r in reported)
    cached = sum(r.cached_tokens or 0 for r in reported)
    outside = sum(outside_history(r) for r in reported)
    return {
        "requests": len(ok),
        "requests_reporting_cached_tokens": len(reported),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": _share(cached, prompt),
        "history_tokens": sum(r.history_tokens or 0 for r in reported),
        "template_tokens": sum(template_tokens(r) for r in reported),
        "cached_outside_history_tokens": outside,
        "cached_outside_history_share": _share(outside, prompt),
    }
