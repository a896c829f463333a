"""Cost figures (docs/methodology.md, "Cost and energy"): each formula against a hand computation, and the
methodology's worked example to the cent."""

from __future__ import annotations

import pytest

from tokwatch.figures.cost import (
    TokenCounts,
    TokenPrice,
    blended_price,
    compute_time_split,
    effective_blended_price,
    effective_input_price,
    energy_cost,
    parse_blend,
    per_mtok_at_rate,
    run_cost,
)

PRICE = TokenPrice(input_per_mtok=3.0, output_per_mtok=15.0, cached_input_per_mtok=0.3)


def test_a_run_pays_uncached_cached_and_output_tokens_at_their_own_prices() -> None:
    # 1,000 prompt tokens of which 400 cached, 500 output (reasoning included): 600 x 3 + 400 x 0.3 + 500 x 15
    assert run_cost(PRICE, TokenCounts(prompt=1000, cached=400, output=500)) == pytest.approx(9420 / 1e6)


def test_cached_tokens_fall_back_to_the_input_price_and_never_exceed_the_prompt() -> None:
    no_cache_price = TokenPrice(3.0, 15.0)
    assert run_cost(no_cache_price, TokenCounts(1000, 400, 0)) == pytest.approx(3000 / 1e6)
    # A server that reports more cached than prompt tokens is not allowed to make tokens free twice.
    assert run_cost(PRICE, TokenCounts(100, 500, 0)) == pytest.approx(100 * 0.3 / 1e6)


def test_the_blend_is_three_input_parts_to_one_output_part_by_default_and_configurable() -> None:
    assert blended_price(PRICE) == pytest.approx((3 * 3 + 15) / 4)
    assert blended_price(PRICE, parse_blend("1:1")) == pytest.approx(9.0)
    assert parse_blend("10:1") == (10.0, 1.0)
    for bad in ("3", "3:0", "a:b", "3:1:1", "inf:1"):
        with pytest.raises(ValueError, match=r"'3:1'|positive"):
            parse_blend(bad)


def test_the_effective_price_follows_the_cache_hit_share() -> None:
    assert effective_input_price(PRICE, 0.0) == 3.0
    assert effective_input_price(PRICE, 1.0) == pytest.approx(0.3)
    assert effective_input_price(PRICE, 0.25) == pytest.approx(0.75 * 3 + 0.25 * 0.3)
    assert effective_blended_price(PRICE, 0.5) == pytest.approx((3 * 1.65 + 15) / 4)
    assert effective_input_price(PRICE, 7.0) == pytest.approx(0.3)  # shares are clamped to 0..1


def test_a_self_hosted_token_costs_the_hour_over_the_tokens_made_in_it() -> None:
    # 2 GPUs at $2.50/h = $5/h; 50 tok/s is 180,000 tok/h: $27.78 per Mtok.
    assert per_mtok_at_rate(5.0, 50.0) == pytest.approx(5.0 / 180_000 * 1e6)
    assert per_mtok_at_rate(5.0, 0.0) is None


def test_compute_time_splits_the_hardware_time_between_prompt_and_generation() -> None:
    split = compute_time_split(hourly=3.6, prefill_s=0.5, decode_s=2.0, prompt_tokens=1000, output_tokens=200)
    # $3.60/h is $0.001/s: prefill costs $0.0005 over 1,000 tokens, decode $0.002 over 200.
    assert split.run_cost == pytest.approx(0.0025)
    assert split.prompt_per_mtok == pytest.approx(0.5)
    assert split.generation_per_mtok == pytest.approx(10.0)
    assert compute_time_split(3.6, 0.0, 2.0, 0, 200).prompt_per_mtok is None


def test_energy_costs_its_kilowatt_hours() -> None:
    assert energy_cost(3_600_000.0, 0.12) == pytest.approx(0.12)


def test_the_methodology_worked_example() -> None:
    """docs/methodology.md, "Cost and energy", worked example: the figures printed there."""
    hosted = TokenPrice(input_per_mtok=2.50, output_per_mtok=10.00, cached_input_per_mtok=1.25)
    assert run_cost(hosted, TokenCounts(prompt=1200, cached=800, output=300)) == pytest.approx(0.005)
    assert blended_price(hosted) == pytest.approx(4.375)
    assert effective_blended_price(hosted, 800 / 1200) == pytest.approx(3.75)
    assert per_mtok_at_rate(2 * 2.00, 80.0) == pytest.approx(13.888889, rel=1e-6)
    split = compute_time_split(4.0, prefill_s=0.2, decode_s=3.75, prompt_tokens=1200, output_tokens=300)
    assert split.prompt_per_mtok == pytest.approx(0.185185, rel=1e-5)
    assert split.generation_per_mtok == pytest.approx(13.888889, rel=1e-6)
    assert energy_cost(1500.0, 0.15) == pytest.approx(0.0000625)


def test_the_per_run_worked_example() -> None:
    """docs/methodology.md, "Cost and energy", "Per probe run": the self-hosted worked example."""
    from tokwatch.figures.cost_window import joules_per_output_token
    from tokwatch.figures.energy import run_energy
    from tokwatch.figures.result import RunResult, Status
    from tokwatch.figures.run_cost import self_hosted_run_cost

    cost = self_hosted_run_cost(
        3.6, TokenCounts(prompt=1000, cached=0, output=200), 0.5, 2.0, energy_j=900.0, per_kwh=0.15
    )
    assert cost is not None and cost.method == "compute_time" and cost.includes_energy
    assert cost.cost == pytest.approx(0.0025375)
    assert cost.prompt_per_mtok == pytest.approx(0.5075)
    assert cost.generation_per_mtok == pytest.approx(10.15)
    assert cost.blended_per_mtok == pytest.approx(2.918125)
    energy = run_energy(900.0, 120.0, 2.5)
    assert energy.net_j == pytest.approx(600.0)
    run = RunResult(endpoint="a", started_at=0.0, status=Status.OK, output_tokens=200, think_tokens=0)
    run.energy_net_j = energy.net_j
    assert joules_per_output_token(run) == pytest.approx(3.0)


def test_a_run_is_priced_from_the_servers_counts_with_reasoning_as_output() -> None:
    from tokwatch.figures.result import RunResult, Status
    from tokwatch.figures.run_cost import counted_tokens, hosted_run_cost, phase_times

    run = RunResult(endpoint="a", started_at=0.0, status=Status.OK, prompt_tokens=1200, cached_tokens=800,
                    output_tokens=200, think_tokens=100, tokens_source="usage", ttft_s=0.2,
                    e2e_s=3.95)  # fmt: skip
    tokens = counted_tokens(run)
    assert tokens == TokenCounts(prompt=1200, cached=800, output=300)
    assert phase_times(run) == (0.2, pytest.approx(3.75))
    hosted = hosted_run_cost(TokenPrice(2.5, 10.0, 1.25), tokens)
    assert hosted.cost == pytest.approx(0.005) and hosted.blended_per_mtok == pytest.approx(4.375)
    assert (hosted.prompt_per_mtok, hosted.generation_per_mtok, hosted.method) == (2.5, 10.0, "list_price")
    run.tokens_source = "client_estimate"  # counted by the client only: not priced
    assert counted_tokens(run) is None
