"""etalon's fluidity-index: the fraction of tokens that meet their deadline, with slack carried forward."""

from __future__ import annotations

from collections.abc import Sequence


def fluidity_index(
    ttft_s: float, tbt_s: Sequence[float], prefill_deadline_s: float, decode_deadline_s: float
) -> float:
    """Fraction of the n tokens (first one against the prefill deadline) that met their deadline.

    `tbt_s` are the per-token gaps after the first token (a k-token chunk is its gap then k-1 zeros).
    Token i is on time when s_i <= D + slack_{i-1}; then slack_i = slack_{i-1} + D - s_i, else slack_i = 0.
    """
    if prefill_deadline_s <= 0 or decode_deadline_s <= 0:
        raise ValueError("fluidity deadlines must be positive")
    met = 0
    slack = 0.0
    for i, s in enumerate([ttft_s, *tbt_s]):
        deadline = prefill_deadline_s if i == 0 else decode_deadline_s
        if s <= deadline + slack:
            met += 1
            slack += deadline - s
        else:
            slack = 0.0
    return met / (1 + len(tbt_s))
