"""Cost figures as pure functions: what a run cost at a hosted price, blended and effective prices, and what
a self-hosted token costs at a measured speed (docs/methodology.md, "Cost and energy").

Prices are per million tokens (Mtok) in the price's currency; self-hosted prices are per hour. Reasoning
tokens are output tokens: every provider bills them at the output rate.
"""

from __future__ import annotations

from dataclasses import dataclass

MTOK = 1_000_000.0
SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3_600_000.0
# Artificial Analysis' blend: three input tokens for each output token.
DEFAULT_BLEND = (3.0, 1.0)


@dataclass(frozen=True, slots=True)
class TokenPrice:
    """A hosted price per million tokens; cached input falls back to the input price when not published."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None

    @property
    def cached(self) -> float:
        """The price of a cached prompt token."""
        return self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """The tokens a server counted for one request: `cached` is part of `prompt`; `output` includes
    reasoning."""

    prompt: int
    cached: int
    output: int


def run_cost(price: TokenPrice, tokens: TokenCounts) -> float:
    """What one request cost: uncached prompt at the input price, cached prompt at the cached price, output at
    the output price."""
    cached = min(max(tokens.cached, 0), max(tokens.prompt, 0))
    uncached = max(tokens.prompt, 0) - cached
    return (
        uncached * price.input_per_mtok
        + cached * price.cached
        + max(tokens.output, 0) * price.output_per_mtok
    ) / MTOK


def blended_price(price: TokenPrice, blend: tuple[float, float] = DEFAULT_BLEND) -> float:
    """The price per Mtok of a token mix of `blend` = (input, output) parts, at list price (no cache hits)."""
    return _blend(price.input_per_mtok, price.output_per_mtok, blend)


def effective_input_price(price: TokenPrice, cache_share: float) -> float:
    """The input price per Mtok when `cache_share` of prompt tokens are cache hits (0..1)."""
    share = min(max(cache_share, 0.0), 1.0)
    return (1.0 - share) * price.input_per_mtok + share * price.cached


def effective_blended_price(
    price: TokenPrice, cache_share: float, blend: tuple[float, float] = DEFAULT_BLEND
) -> float:
    """The blended price per Mtok at the observed cache-hit share (OpenRouter's effective price)."""
    return _blend(effective_input_price(price, cache_share), price.output_per_mtok, blend)


def per_mtok_at_rate(hourly: float, tokens_per_second: float) -> float | None:
    """What a million tokens cost on hardware billed `hourly` that produces `tokens_per_second`; None without
    a rate."""
    if tokens_per_second <= 0:
        return None
    return hourly / (tokens_per_second * SECONDS_PER_HOUR) * MTOK


@dataclass(frozen=True, slots=True)
class PhaseCost:
    """Self-hosted $/Mtok split by phase with OpenCost's `compute_time` method: the hardware's time is
    charged to prefill and decode in proportion to the time each took, then divided by that phase's tokens."""

    prompt_per_mtok: float | None
    generation_per_mtok: float | None
    run_cost: float


def compute_time_split(
    hourly: float, prefill_s: float, decode_s: float, prompt_tokens: int, output_tokens: int
) -> PhaseCost:
    """Split one request's hardware time (`prefill_s` + `decode_s` at `hourly`) into prompt and generation
    $/Mtok. A phase without tokens or time has no price."""
    per_s = hourly / SECONDS_PER_HOUR
    prefill_cost = per_s * max(prefill_s, 0.0)
    decode_cost = per_s * max(decode_s, 0.0)
    return PhaseCost(
        prompt_per_mtok=prefill_cost / prompt_tokens * MTOK if prompt_tokens > 0 and prefill_s > 0 else None,
        generation_per_mtok=decode_cost / output_tokens * MTOK
        if output_tokens > 0 and decode_s > 0
        else None,
        run_cost=prefill_cost + decode_cost,
    )


def energy_cost(joules: float, per_kwh: float) -> float:
    """What `joules` of electricity cost at `per_kwh`."""
    return joules / JOULES_PER_KWH * per_kwh


def parse_blend(text: str) -> tuple[float, float]:
    """`"3:1"` -> (3.0, 1.0); both parts positive and finite, else ValueError naming the form."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        blend = (float(parts[0]), float(parts[1]))
    except ValueError:
        raise ValueError(f"must be INPUT:OUTPUT parts such as '3:1', not {text!r}") from None
    if not all(0 < p < float("inf") for p in blend):
        raise ValueError(f"both parts must be positive and finite, not {text!r}")
    return blend


def _blend(input_price: float, output_price: float, blend: tuple[float, float]) -> float:
    parts_in, parts_out = blend
    return (parts_in * input_price + parts_out * output_price) / (parts_in + parts_out)
