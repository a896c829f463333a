"""Seed 001's reasoning requests: the think budget each asks the server for, and the run's reasoning
figures (budget force rate by reason, time per phase). The prompts: `tokwatch.bench.math_prompts`.

Docs: docs/bench.md ("Reasoning workload (seed 001)"), docs/methodology.md ("Budget force rate").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tokwatch.bench.aggregate import summarize
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.probes.http import HttpProbe

THINK_ENDS = ("natural", "budget", "length")


def apply_think_budget(record: RequestRecord, dialect: type[HttpProbe], budget: int) -> None:
    """Set the request's think budget as the kind asks for it (raised to the API's minimum, the answer's
    allowance kept on top of it in max_tokens) and the field that carries it (None: the API has none)."""
    asked = dialect.think_budget(budget)
    record.think_budget_field = dialect.think_budget_field
    record.think_budget = budget if asked is None else asked
    if asked is not None and asked > budget and record.max_tokens is not None:
        record.max_tokens += asked - budget


def reasoning_summary(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """summary.json `reasoning`: over the measured ok reasoning requests, how each think phase ended, the
    budget force rate (budget + length over all), and the think budget, think tokens and phase times;
    None when the run sent no reasoning request."""
    measured = [r for r in records if not r.warmup and r.category == "reasoning"]
    if not measured:
        return None
    ok = [r for r in measured if r.ok]
    ends = Counter(r.think_end for r in ok)
    n = len(ok)
    forced = ends["budget"] + ends["length"]
    fields = sorted({r.think_budget_field for r in measured if r.think_budget_field})
    return {
        "requests": len(measured),
        "ok_requests": n,
        "budget_field": (fields[0] if len(fields) == 1 else fields) if fields else None,
        "think_end": {k: ends[k] for k in THINK_ENDS},
        "think_end_share": {k: (ends[k] / n if n else None) for k in THINK_ENDS},
        "budget_force_rate": forced / n if n else None,
        "think_budget": summarize([float(r.think_budget) for r in ok if r.think_budget is not None]),
        "think_tokens": summarize([float(r.think_tokens) for r in ok if r.think_tokens is not None]),
        "output_tokens": summarize([float(r.output_tokens) for r in ok if r.output_tokens is not None]),
        "ttft_s": summarize([r.ttft_s for r in ok if r.ttft_s is not None]),
        "think_s": summarize([r.think_s for r in ok if r.think_s is not None]),
        "ttot_s": summarize([r.ttot_s for r in ok if r.ttot_s is not None]),
        "answer_s": summarize([r.answer_s for r in ok if r.answer_s is not None]),
        "think_tokens_per_s": summarize(
            [rate for r in ok if (rate := _phase_rate(r.think_tokens, r.think_s)) is not None]
        ),
        "answer_tokens_per_s": summarize(
            [rate for r in ok if (rate := _phase_rate(r.output_tokens, r.answer_s)) is not None]
        ),
    }


def _phase_rate(tokens: int | None, seconds: float | None) -> float | None:
    """Tokens after the phase's first over its first-to-last time (None under two tokens or no time)."""
    if tokens is None or tokens < 2 or not seconds or not math.isfinite(seconds):
        return None
    return (tokens - 1) / seconds
