"""What a benchmark run cost (docs/bench.md, "Cost and energy"; docs/methodology.md, "Cost and energy"):
the prices from the flags or bench file over the `--endpoint`'s `pricing:`, and the run's cost and $/Mtok
from the tokens the server counted (hosted) or the hardware's time at the measured throughput (self-hosted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tokwatch.bench.config import BenchOptions
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures.cost import (
    DEFAULT_BLEND,
    MTOK,
    SECONDS_PER_HOUR,
    TokenCounts,
    blended_price,
    effective_blended_price,
    energy_cost,
    parse_blend,
    per_mtok_at_rate,
    run_cost,
)
from tokwatch.settings.config import load_config
from tokwatch.settings.pricing import Pricing, PricingSettings, read_price_files, resolve_priced
from tokwatch.settings.strict_yaml import ConfigError

# BenchOptions field -> Pricing field.
_FLAG_FIELDS = {
    "price_input": "input_per_mtok",
    "price_output": "output_per_mtok",
    "price_cached_input": "cached_input_per_mtok",
    "gpu_hour": "gpu_hour",
    "gpus": "gpus",
    "node_hour": "node_hour",
    "price_kwh": "kwh",
}


@dataclass(frozen=True, slots=True)
class BenchPricing:
    """The prices a run is costed at, how they blend, and where they came from."""

    pricing: Pricing
    blend: tuple[float, float]
    source: str  # "options", "config", or "options over config"


def flag_pricing(opts: BenchOptions) -> Pricing | None:
    """The prices given as flags or bench-file keys; None when none is."""
    values = {field: getattr(opts, name) for name, field in _FLAG_FIELDS.items()}
    values = {k: v for k, v in values.items() if v is not None}
    if not values:
        return None
    try:
        return Pricing(currency=opts.currency or "USD", **values)
    except ValidationError as exc:  # BenchOptions checks each field; what is left is how they combine
        raise ConfigError(f"prices: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def endpoint_pricing(opts: BenchOptions, model: str) -> tuple[Pricing | None, PricingSettings | None]:
    """The `--endpoint`'s prices from its config (its own `pricing:`, then the config's `pricing.models`,
    price table and OpenRouter file, by model), and the config's pricing settings; (None, None) without
    one."""
    if opts.endpoint is None or opts.config is None:
        return None, None
    config = load_config(opts.config)
    ep = config.endpoint(opts.endpoint)
    own = ep.pricing if ep is not None else None
    settings = config.pricing
    # The files and the layering the exporter uses; an OpenRouter list by URL is not fetched here.
    files = read_price_files(settings)
    priced = resolve_priced(own, model, settings, files.get("table", {}), files.get("openrouter", {}))
    return (priced[0] if priced is not None else None), settings


def bench_pricing(opts: BenchOptions, model: str) -> BenchPricing | None:
    """The run's prices: the options' over the endpoint's, field by field; None when nothing prices it.
    Raises ConfigError naming a bad price file or combination before anything is sent."""
    flags = flag_pricing(opts)
    configured, settings = endpoint_pricing(opts, model)
    if flags is not None and configured is not None:
        pricing, source = flags.over(configured), "options over config"
    elif flags is not None:
        pricing, source = flags, "options"
    elif configured is not None:
        pricing, source = configured, "config"
    else:
        return None
    if opts.price_blend is not None:
        blend = parse_blend(opts.price_blend)
    else:
        blend = settings.blend_parts if settings is not None else DEFAULT_BLEND
    return BenchPricing(pricing, blend, source)


def counted_tokens(records: Sequence[RequestRecord]) -> TokenCounts:
    """The tokens the server counted over `records`: prompt, the cached part of it, and output (reasoning
    included)."""
    prompt = sum(max(r.prompt_tokens or 0, 0) for r in records)
    cached = sum(min(max(r.cached_tokens or 0, 0), max(r.prompt_tokens or 0, 0)) for r in records)
    return TokenCounts(prompt=prompt, cached=cached, output=sum(r.generated_tokens for r in records))


def cost_figures(
    bench: BenchPricing,
    records: Sequence[RequestRecord],
    wall_s: float,
    output_tokens_per_s: float | None,
    energy_j: float | None = None,
    capacity_tokens_per_s: float | None = None,
) -> dict[str, Any]:
    """summary.json `cost`: the run's tokens and, for hosted prices, what they cost and the blended,
    effective and counted $/Mtok; for self-hosted prices, the hardware's time over the run and $/Mtok of
    output at the measured throughput (and at a capacity search's, when given); electricity at `kwh`."""
    p = bench.pricing
    tokens = counted_tokens(records)
    cache_share = tokens.cached / tokens.prompt if tokens.prompt else None
    out: dict[str, Any] = {
        "currency": p.currency,
        "source": bench.source,
        "blend": f"{bench.blend[0]:g}:{bench.blend[1]:g}",
        "tokens": {
            "requests": len(records),
            "counted_by_server": sum(1 for r in records if r.prompt_tokens is not None),
            "prompt": tokens.prompt,
            "cached": tokens.cached,
            "output": tokens.output,
        },
        "cache_hit_share": cache_share,
        "hosted": None,
        "self_hosted": None,
        "energy_cost": None,
    }
    price = p.token_price()
    if price is not None:
        cost = sum(
            run_cost(price, TokenCounts(r.prompt_tokens or 0, r.cached_tokens or 0, r.generated_tokens))
            for r in records
        )
        total = tokens.prompt + tokens.output
        out["hosted"] = {
            "input_per_mtok": price.input_per_mtok,
            "output_per_mtok": price.output_per_mtok,
            "cached_input_per_mtok": price.cached,
            "run_cost": cost,
            "blended_per_mtok": blended_price(price, bench.blend),
            "effective_per_mtok": effective_blended_price(price, cache_share or 0.0, bench.blend),
            # what this run's own token mix cost per million tokens, and per million output tokens
            "counted_per_mtok": cost / total * MTOK if total else None,
            "per_output_mtok": cost / tokens.output * MTOK if tokens.output else None,
        }
    hourly = p.hourly
    if hourly is not None:
        out["self_hosted"] = {
            "hourly": hourly,
            "basis": "gpu_hour x gpus" if p.gpu_hour is not None else "node_hour",
            "run_cost": hourly * wall_s / SECONDS_PER_HOUR,
            "output_tokens_per_s": output_tokens_per_s,
            "per_output_mtok_at_measured": per_mtok_at_rate(hourly, output_tokens_per_s or 0.0),
            "capacity_output_tokens_per_s": capacity_tokens_per_s,
            "per_output_mtok_at_capacity": per_mtok_at_rate(hourly, capacity_tokens_per_s)
            if capacity_tokens_per_s
            else None,
        }
    if p.kwh is not None and energy_j is not None:
        out["energy_cost"] = energy_cost(energy_j, p.kwh)
    return out


def cost_lines(cost: Mapping[str, Any]) -> list[str]:
    """The cost figures as short lines for the end-of-run summary and report.md."""
    cur = cost["currency"]
    tokens = cost["tokens"]
    lines = [
        f"tokens counted by the server: {tokens['prompt']} prompt ({tokens['cached']} cached), "
        f"{tokens['output']} output, over {tokens['counted_by_server']}/{tokens['requests']} requests"
    ]
    hosted = cost.get("hosted")
    if hosted:
        share = cost["cache_hit_share"]
        lines.append(
            f"hosted: run cost {_money(hosted['run_cost'])} {cur}; blended ({cost['blend']}) "
            f"{_money(hosted['blended_per_mtok'])} {cur}/Mtok, effective at "
            f"{'-' if share is None else f'{share:.0%}'} cache hits {_money(hosted['effective_per_mtok'])} "
            f"{cur}/Mtok; this run's tokens {_money(hosted['counted_per_mtok'])} {cur}/Mtok"
        )
    own = cost.get("self_hosted")
    if own:
        rate = own["output_tokens_per_s"]
        line = (
            f"self-hosted ({_money(own['hourly'])} {cur}/h, {own['basis']}): run cost "
            f"{_money(own['run_cost'])} {cur}; {_money(own['per_output_mtok_at_measured'])} {cur} per output "
            f"Mtok at the measured {'-' if rate is None else f'{rate:.1f}'} tok/s"
        )
        if own.get("per_output_mtok_at_capacity") is not None:
            line += (
                f", {_money(own['per_output_mtok_at_capacity'])} {cur} at capacity "
                f"({own['capacity_output_tokens_per_s']:.1f} tok/s)"
            )
        lines.append(line)
    if cost.get("energy_cost") is not None:
        lines.append(f"electricity: {_money(cost['energy_cost'])} {cur} for the run's measured energy")
    return lines


def _money(value: float | None) -> str:
    """4 significant digits: prices span from fractions of a cent to hundreds per Mtok."""
    return "-" if value is None else f"{value:.4g}"


def energy_lines(energy: Mapping[str, Any]) -> list[str]:
    """The energy figures as short lines for the end-of-run summary and report.md."""
    if energy.get("joules") is None:
        return [
            f"energy: not measured: the power readings of {energy['source']} did not cover the run "
            f"({energy['readings']} readings, {energy['failures']} failed)"
        ]
    idle = energy["idle_watts"]
    baseline = (
        "no idle baseline"
        if idle is None
        else f"idle baseline {idle:.1f} W measured over {energy['idle_baseline_s']:g} s before the load"
    )
    per_token = energy["joules_per_output_token"]
    return [
        f"energy: {energy['joules']:.1f} J over {energy['duration_s']:.1f} s "
        f"(mean {energy['mean_watts']:.1f} W, {energy['method']}); {baseline}, "
        f"{energy['net_joules']:.1f} J above it; "
        f"{'-' if per_token is None else f'{per_token:.4g}'} J per output token "
        f"({energy['output_tokens']} tokens)"
    ]


def cost_and_energy_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary's energy and cost lines (none when neither was asked for)."""
    lines = energy_lines(summary["energy"]) if summary.get("energy") else []
    return lines + (cost_lines(summary["cost"]) if summary.get("cost") else [])


def capacity_cost(
    bench: BenchPricing, rate: float | None, tokens_per_s: float | None
) -> dict[str, Any] | None:
    """capacity.json `cost`: what an output token costs on the self-hosted hardware at the capacity search's
    result (`rate` req/s achieving `tokens_per_s`); None without an hourly price or a result."""
    hourly = bench.pricing.hourly
    if hourly is None or rate is None or not tokens_per_s:
        return None
    return {
        "currency": bench.pricing.currency,
        "hourly": hourly,
        "rate_per_s": rate,
        "output_tokens_per_s": tokens_per_s,
        "per_output_mtok": per_mtok_at_rate(hourly, tokens_per_s),
    }


def capacity_cost_line(cost: Mapping[str, Any]) -> str:
    """The capacity cost as one line under the capacity table."""
    cur = cost["currency"]
    return (
        f"self-hosted at capacity: {_money(cost['per_output_mtok'])} {cur} per output Mtok "
        f"({_money(cost['hourly'])} {cur}/h at {cost['output_tokens_per_s']:.1f} tok/s, "
        f"{cost['rate_per_s']:.4g} req/s)"
    )


# The figures `tokwatch bench compare` sets side by side (lower is better for each): name -> summary path.
HEADLINES: dict[str, tuple[str, ...]] = {
    "J per output token (net)": ("energy", "joules_per_output_token"),
    "hosted cost per Mtok of the run's tokens": ("cost", "hosted", "counted_per_mtok"),
    "self-hosted cost per output Mtok at the measured rate": (
        "cost",
        "self_hosted",
        "per_output_mtok_at_measured",
    ),
}


def headline_figures(summary: Mapping[str, Any]) -> dict[str, float]:
    """The run's HEADLINES figures that its summary holds (none for a run without prices or power)."""
    out: dict[str, float] = {}
    for name, path in HEADLINES.items():
        value: Any = summary
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    cost = summary.get("cost")
    currency = cost.get("currency") if isinstance(cost, Mapping) else None
    if isinstance(currency, str):
        out = {k if k.startswith("J ") else f"{k} ({currency})": v for k, v in out.items()}
    return out


def compare_lines(a: Mapping[str, float], b: Mapping[str, float]) -> list[str]:
    """A and B's cost and energy figures side by side with B's change (not gated: they follow the prices
    and the power source as much as the server)."""
    lines = []
    for name in sorted(set(a) | set(b)):
        va, vb = a.get(name), b.get(name)
        change = f" ({(vb - va) / va:+.1%})" if va and vb is not None else ""
        lines.append(f"  {name}: A {_money(va)}, B {_money(vb)}{change}")
    return ["cost and energy (not gated):", *lines] if lines else []
