"""etalon's fluidity-index: the share of token deadlines a request met, slack carried forward.

Two ways of counting a late token (docs/methodology.md, "Benchmark metrics"):

- `etalon` (default): as etalon's reference code (`get_request_level_deadline_miss_rate` in
  `etalon/metrics/metric_utils.py`): a late first token misses 1 + floor((TTFT - slack - D_p) / D_d)
  deadlines, a late later token floor((s - slack) / D_d), and the index is 1 - missed / (met + missed);
- `seed`: as seed 004's text: every token has one deadline, a late token is one miss of n tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

FluidityMode = Literal["etalon", "seed"]
FLUIDITY_MODES: tuple[FluidityMode, ...] = ("etalon", "seed")


def fluidity_index(
    ttft_s: float,
    tbt_s: Sequence[float],
    prefill_deadline_s: float,
    decode_deadline_s: float,
    mode: FluidityMode = "etalon",
) -> float:
    """The request's fluidity-index in `mode`; `tbt_s` are the per-token gaps after the first token (a
    k-token chunk is its gap then k-1 zeros, on time and banking D_d of slack each)."""
    if prefill_deadline_s <= 0 or decode_deadline_s <= 0:
        raise ValueError("fluidity deadlines must be positive")
    if mode == "seed":
        return _seed_text(ttft_s, tbt_s, prefill_deadline_s, decode_deadline_s)
    met, missed = deadline_counts(ttft_s, tbt_s, prefill_deadline_s, decode_deadline_s)
    total = met + missed
    return 1.0 - missed / total if total else 1.0


def deadline_counts(
    ttft_s: float, tbt_s: Sequence[float], prefill_deadline_s: float, decode_deadline_s: float
) -> tuple[int, int]:
    """(deadlines met, deadlines missed) as etalon counts them; the floor divisions are Python's `//` on
    floats, as in the reference, so a quotient such as 1.0 // 0.05 gives 19, not 20."""
    met = missed = 0
    slack = 0.0
    for i, s in enumerate((ttft_s, *tbt_s)):
        deadline = prefill_deadline_s if i == 0 else decode_deadline_s
        if s <= deadline + slack:
            slack += deadline - s
            met += 1
            continue
        if i == 0:
            late = 1 + (s - slack - prefill_deadline_s) // decode_deadline_s
        else:
            late = (s - slack) // decode_deadline_s
        missed += int(late)
        slack = 0.0  # the next token starts on fresh deadlines
    return met, missed


def _seed_text(ttft_s: float, tbt_s: Sequence[float], d_p: float, d_d: float) -> float:
    """Seed 004's text: token i is on time when s_i <= D + slack_{i-1} (then slack_i = slack_{i-1} + D -
    s_i, else 0); the index is on-time tokens / all n tokens, the first included."""
    met = 0
    slack = 0.0
    for i, s in enumerate((ttft_s, *tbt_s)):
        deadline = d_p if i == 0 else d_d
        if s <= deadline + slack:
            met += 1
            slack += deadline - s
        else:
            slack = 0.0
    return met / (1 + len(tbt_s))
