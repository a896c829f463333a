"""Multi-turn figures (seed 003): turns per request, cache-hit rates, first- vs later-turn TTFT, and the
per-conversation (trace) figures of trace_summary.json. Definitions: docs/methodology.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tokwatch.bench.aggregate import summarize
from tokwatch.bench.request_metrics import RequestRecord

TRACE_FIGURES = (
    "latency_s",
    "first_turn_ttft_s",
    "ttfat_s",
    "decode_tokens_per_s",
    "cache_hit_rate",
    "eligible_cache_hit_rate",
)
TRACE_STATS = ("mean", "p50", "p90", "p99", "max")
TTFT_STATS = ("mean", "p50", "p99")


def is_multi_turn(records: Sequence[RequestRecord]) -> bool:
    """True when the run sent conversations."""
    return any(r.conversation_id is not None and not r.warmup for r in records)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _stats(values: list[float], keys: Sequence[str]) -> dict[str, float | int | None]:
    """`count` and the named figures of `aggregate.summarize` (None when there is no value)."""
    full = summarize(values)
    return {"count": full["count"], **{k: full[k] for k in keys}}


def cache_rates(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Seed 003's cache figures over `records` (measured, ok); token counts are the server's where it
    reported usage (then in the units of cached_tokens), else the client's:

    - history hit estimate: sum(history tokens) / sum(prompt tokens), every turn;
    - cache hit rate: sum(cached) / sum(prompt tokens), turn 1 in the denominator;
    - eligible cache hit rate: sum(cached of turns > 1) / sum(history tokens of those turns).
    The last two only over requests whose server reported cached_tokens (None when none did)."""
    hist = [r for r in records if r.history_tokens is not None and r.prompt_tokens]
    reported = [r for r in records if r.cached_tokens is not None and r.prompt_tokens]
    later = [r for r in reported if (r.turn or 0) > 0 and r.history_tokens]
    return {
        "history_hit_estimate": _ratio(
            sum(r.history_tokens or 0 for r in hist), sum(r.prompt_tokens or 0 for r in hist)
        ),
        "cache_hit_rate": _ratio(
            sum(r.cached_tokens or 0 for r in reported), sum(r.prompt_tokens or 0 for r in reported)
        ),
        "eligible_cache_hit_rate": _ratio(
            sum(r.cached_tokens or 0 for r in later), sum(r.history_tokens or 0 for r in later)
        ),
    }


def turn_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """summary.json `multi_turn`: request-level figures of a conversation run."""
    ok = [r for r in records if r.ok and not r.warmup and r.conversation_id is not None]
    first = [r.ttft_s for r in ok if r.turn == 0 and r.ttft_s is not None]
    later = [r.ttft_s for r in ok if (r.turn or 0) > 0 and r.ttft_s is not None]
    return {
        "requests": len(ok),
        "requests_reporting_cached_tokens": sum(1 for r in ok if r.cached_tokens is not None),
        "turns_per_request_mean": _ratio(sum(r.turns or 0 for r in ok), len(ok)),
        **cache_rates(ok),
        "ttft_first_turn": _stats(first, TTFT_STATS),
        "ttft_later_turns": _stats(later, TTFT_STATS),
    }


def _trace(turns: list[RequestRecord]) -> dict[str, Any]:
    first, last = turns[0], turns[-1]
    end = last.completed_at_s if last.completed_at_s is not None else last.sent_at_s
    tps = [
        (r.generated_tokens - 1) / (r.e2e_s - r.ttft_s)
        for r in turns
        if r.e2e_s is not None and r.ttft_s is not None and r.generated_tokens > 1 and r.e2e_s > r.ttft_s
    ]
    rates = cache_rates(turns)
    all_reported = all(r.cached_tokens is not None for r in turns)
    return {
        "conversation_id": first.conversation_id,
        "turns": len(turns),
        "latency_s": end - first.sent_at_s,
        "first_turn_ttft_s": first.ttft_s,
        "ttfat_s": last.sent_at_s + last.ttft_s - first.sent_at_s if last.ttft_s is not None else None,
        "decode_tokens_per_s": math.fsum(tps) / len(tps) if tps else None,
        "cache_hit_rate": rates["cache_hit_rate"] if all_reported else None,
        "eligible_cache_hit_rate": rates["eligible_cache_hit_rate"] if all_reported else None,
        "history_hit_estimate": rates["history_hit_estimate"],
        "wait_s": math.fsum(r.wait_before_s or 0.0 for r in turns),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in turns),
        "cached_tokens": sum(r.cached_tokens or 0 for r in turns) if all_reported else None,
        "output_tokens": sum(r.generated_tokens for r in turns),
    }


def traces(records: Sequence[RequestRecord]) -> tuple[list[dict[str, Any]], int]:
    """(figures of every completed conversation, conversations started). Completed: every turn ok."""
    by_id: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.conversation_id is not None and not r.warmup:
            by_id.setdefault(r.conversation_id, []).append(r)
    done = []
    for turns in by_id.values():
        turns.sort(key=lambda r: r.turn or 0)
        planned = turns[0].conversation_turns or len(turns)
        if len(turns) == planned and all(r.ok for r in turns):
            done.append(_trace(turns))
    done.sort(key=lambda t: t["conversation_id"])
    return done, len(by_id)


def trace_summary(records: Sequence[RequestRecord], schema_version: int) -> dict[str, Any]:
    """trace_summary.json: per-conversation figures and their mean/p50/p90/p99/max over completed ones."""
    done, started = traces(records)
    return {
        "schema_version": schema_version,
        "conversations": {"started": started, "completed": len(done), "abandoned": started - len(done)},
        "figures": {
            name: _stats([t[name] for t in done if t[name] is not None], TRACE_STATS)
            for name in TRACE_FIGURES
        },
        "traces": done,
    }
