"""Seed 001's reasoning workload against the simulator's truth: the think budget each kind asks for in its
own field, how each think phase ended, and the time of each phase."""

import json
import random

import pytest
from rich.console import Console

from tokwatch.bench.config import build_options
from tokwatch.bench.math_prompts import math_problems
from tokwatch.bench.request_metrics import BUDGET_TOLERANCE
from tokwatch.bench.session import run_bench
from tokwatch.bench.workload import LengthRange, SyntheticWorkload
from tokwatch.probes import probe_class
from tokwatch.probes.http import ChatRequest
from tokwatch.sim.config import ModelProfile
from tokwatch.sim.profile import Limits, plan_tokens

# Natural think lengths of 20-60 tokens against budgets of 10-80: some requests stop thinking on their own,
# the others are cut by their budget; kinds without a budget field are cut by max_tokens instead.
SIM = """
servers:
  - name: vllm-a
    dialect: vllm
    models:
      - {name: r1, decode_tps: 1000, natural_think: [20, 60], natural_stop_tokens: 6}
  - name: vllm-chunky
    dialect: vllm
    models:
      - {name: r1, decode_tps: 40000, tokens_per_chunk: 8, natural_think: [600, 1200], natural_stop_tokens: 9}
  - name: sgl
    dialect: sglang
    models:
      - {name: r1, decode_tps: 4000, natural_think: [20, 60], natural_stop_tokens: 6}
  - name: llama
    dialect: llamacpp
    models:
      - {name: r1, decode_tps: 4000, natural_think: [20, 60], natural_stop_tokens: 6}
  - name: olla
    dialect: ollama
    models:
      - {name: r1, decode_tps: 4000, natural_think: [20, 60], natural_stop_tokens: 6}
  - name: plain
    dialect: openai
    models:
      - {name: r1, decode_tps: 4000, natural_think: [20, 60], natural_stop_tokens: 6}
  - name: claude
    dialect: anthropic
    models:
      - name: r1
        decode_tps: 20000
        tokens_per_chunk: 16
        natural_think: [900, 1300]
        natural_stop_tokens: 6
"""
TOL = 0.02  # correctness, not performance


async def _bench(tmp_path, url, kind, **kw):
    opts = build_options(
        {
            "url": url, "kind": kind, "model": "r1", "live_interval": 60, "plots": False, "concurrency": 4,
            "output_tokens": "8:12", "input_tokens": "16", **kw,
        }
    )  # fmt: skip
    return await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")


def test_prompts_are_the_shipped_math_problems():
    problems = math_problems()
    assert len(problems) == 40 and problems[0].id == "gsm8k-test-0" and problems[0].answer == "18"
    w = SyntheticWorkload(
        LengthRange(16, 16), LengthRange(8, 12), seed=3, reasoning_ratio=1.0,
        reasoning_tokens=LengthRange(10, 80),
    )  # fmt: skip
    specs = [w.request_at(i) for i in range(50)]
    questions = {p.question for p in problems}
    for s in specs:
        fresh, question, instruction = s.messages[0]["content"].split("\n")
        assert question in questions and len(fresh.split()) == 3 and "step by step" in instruction
        assert 10 <= s.think_budget <= 80 and s.think_budget + 8 <= s.max_tokens <= s.think_budget + 12
    assert len({s.messages[0]["content"] for s in specs}) == 50  # fresh words: no shared prompt


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("vllm", {"thinking_token_budget": 700}),
        ("sglang", {"custom_params": {"thinking_budget": 700}}),
        ("llamacpp", {"reasoning_budget_tokens": 700}),
        ("ollama", {"think": True}),
        ("openai", {}),
        ("anthropic", {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1025}),
    ],
)
def test_each_kind_asks_for_thinking_in_its_own_field(kind, body):
    dialect = probe_class(kind)
    sent = dialect.with_thinking(dialect.body(_chat(dialect)), dialect.think_budget(700))
    for key, value in body.items():
        assert sent[key] == value
    if kind == "anthropic":
        assert "temperature" not in sent  # the Messages API refuses one with thinking
    assert (dialect.think_budget_field is None) == (kind in ("ollama", "openai"))


def _agrees(record, truth):
    """The client's think_end is the truth's, or `budget` for a natural stop within the tolerance under it."""
    if record.think_end == truth.think_end:
        return True
    band = record.think_budget - int(record.think_budget * BUDGET_TOLERANCE)
    return (truth.think_end, record.think_end) == ("natural", "budget") and truth.think_tokens >= band


def _chat(dialect):
    return ChatRequest("r1", [{"role": "user", "content": "hi"}], 10, stream=True, temperature=0)


async def test_budget_force_rate_and_phase_times_match_the_truth(tmp_path, sim):
    outcome, out_dir = await _bench(
        tmp_path, f"{sim.url}/vllm-a/v1", "vllm", number=40, reasoning_ratio=0.6, reasoning_tokens="10:80"
    )
    assert outcome.complete and all(r.ok for r in outcome.records)
    ends = {"natural": 0, "budget": 0, "length": 0}
    for r in outcome.records:
        truth = sim.truth(r.server_request_id)
        if r.category == "chat":
            assert truth.think_tokens == 0 and r.think_end is None and r.think_budget is None
            continue
        # the budget drawn is the one the server was asked for, in vLLM's field
        assert r.think_budget_field == "thinking_token_budget" and truth.think_budget == r.think_budget
        assert 10 <= r.think_budget <= 80 and r.max_tokens - r.think_budget in range(8, 13)
        assert (r.think_tokens, r.output_tokens) == (truth.think_tokens, truth.output_tokens)
        ends[r.think_end] += 1
        # the budget ended thinking when the model would have thought as long or longer; a natural stop
        # within BUDGET_TOLERANCE under the budget counts as the budget hit
        near = truth.natural_think_tokens >= r.think_budget - int(r.think_budget * BUDGET_TOLERANCE)
        assert (r.think_end == "budget") == near
        assert r.think_end == truth.think_end or (truth.think_end, r.think_end) == ("natural", "budget")
        emitted, k = truth.emitted_at, truth.think_tokens
        assert r.think_s == pytest.approx(emitted[k - 1] - emitted[0], abs=TOL)
        assert r.answer_s == pytest.approx(emitted[-1] - emitted[k], abs=TOL)
        assert r.ttft_s + r.think_s + r.ttot_s + r.answer_s == pytest.approx(r.e2e_s, abs=TOL)
    assert ends["natural"] and ends["budget"] and not ends["length"]
    summary = json.loads((out_dir / "summary.json").read_text())["reasoning"]
    n = sum(ends.values())
    assert summary["ok_requests"] == n and summary["think_end"] == ends
    assert summary["budget_force_rate"] == pytest.approx(ends["budget"] / n)
    assert summary["budget_field"] == "thinking_token_budget"
    assert summary["think_s"]["count"] == n
    report = (out_dir / "report.md").read_text()
    assert "## Reasoning" in report and "budget force rate" in report
    lines = [json.loads(x) for x in (out_dir / "request_level_metrics.jsonl").read_text().splitlines()]
    assert {x["think_end"] for x in lines if x["category"] == "reasoning"} == {"natural", "budget"}


def test_the_simulator_draws_think_lengths_from_the_known_distribution():
    """Natural think U[20, 60] against budgets U[10, 80]: the budget ends P(natural >= budget) of them."""
    rate = sum(n >= b for n in range(20, 61) for b in range(10, 81)) / (41 * 71)
    profile = ModelProfile(name="r1", natural_think=(20, 60), natural_stop_tokens=6)
    rng = random.Random(7)
    plans = []
    for i in range(4000):
        budget = rng.randint(10, 80)
        limits = Limits(200, think=True, think_budget=budget)
        plans.append((budget, plan_tokens(profile, limits, "g", think_seed=f"t{i}")))
    assert {p.natural_think_tokens for _, p in plans} == set(range(20, 61))
    assert all(p.think_tokens == min(p.natural_think_tokens, b) and p.output_tokens == 6 for b, p in plans)
    forced = sum(p.think_end == "budget" for _, p in plans) / len(plans)
    assert forced == pytest.approx(rate, abs=0.025)
    unasked = plan_tokens(profile, Limits(200), "g", think_seed="t")
    assert (unasked.think_tokens, unasked.think_end) == (0, None)  # a request that does not ask: no thinking
    fixed = ModelProfile(name="f", think_tokens=50)  # a model that always thinks 50 tokens
    assert plan_tokens(fixed, Limits(200, think=True, think_budget=30), "g").think_tokens == 30
    assert plan_tokens(fixed, Limits(200), "g").think_tokens == 50


@pytest.mark.parametrize(("server", "kind"), [("sgl/v1", "sglang"), ("llama", "llamacpp")])
async def test_budget_fields_of_sglang_and_llamacpp_reach_the_server(tmp_path, sim, server, kind):
    outcome, _ = await _bench(
        tmp_path, f"{sim.url}/{server}", kind, number=12, reasoning_ratio=1.0, reasoning_tokens="10:80"
    )
    assert outcome.complete and all(r.ok for r in outcome.records)
    for r in outcome.records:
        truth = sim.truth(r.server_request_id)
        assert truth.think_budget == r.think_budget and _agrees(r, truth)
        assert r.think_tokens == truth.think_tokens


@pytest.mark.parametrize(("server", "kind"), [("olla", "ollama"), ("plain/v1", "openai")])
async def test_kinds_without_a_budget_are_bounded_by_max_tokens(tmp_path, sim, server, kind):
    extra = {"extra_body": {"reasoning_effort": "high"}} if kind == "openai" else {}
    outcome, out_dir = await _bench(
        tmp_path, f"{sim.url}/{server}", kind, number=24, reasoning_ratio=1.0, reasoning_tokens="10:80",
        **extra,
    )  # fmt: skip
    assert outcome.complete and all(r.ok for r in outcome.records)
    seen = set()
    for r in outcome.records:
        truth = sim.truth(r.server_request_id)
        assert truth.think_budget is None and r.think_budget_field is None
        assert r.think_end == truth.think_end and r.think_end != "budget"
        assert (r.think_end == "length") == (truth.natural_think_tokens >= r.max_tokens)
        seen.add(r.think_end)
    assert seen == {"natural", "length"}
    summary = json.loads((out_dir / "summary.json").read_text())["reasoning"]
    assert summary["budget_field"] is None and summary["think_end"]["budget"] == 0
    assert "not requestable with this kind" in (out_dir / "report.md").read_text()


async def test_anthropic_budget_is_raised_to_its_minimum(tmp_path, sim):
    outcome, _ = await _bench(
        tmp_path, f"{sim.url}/claude", "anthropic", number=12, reasoning_ratio=1.0,
        reasoning_tokens="600:1400",
    )  # fmt: skip
    assert outcome.complete and all(r.ok for r in outcome.records)
    ends = set()
    for r in outcome.records:
        truth = sim.truth(r.server_request_id)
        assert r.think_budget >= 1024 and truth.think_budget == r.think_budget
        assert r.max_tokens > r.think_budget  # the API takes a budget below max_tokens only
        assert _agrees(r, truth) and r.think_tokens == truth.think_tokens
        ends.add(r.think_end)
    assert ends == {"natural", "budget"}


async def test_an_apportioned_phase_split_still_finds_the_budget(tmp_path, sim):
    """8-token chunks and only a total count: the think/answer split is apportioned by text length, a few
    tokens off the truth's, inside the tolerance."""
    outcome, _ = await _bench(
        tmp_path, f"{sim.url}/vllm-chunky/v1", "vllm", number=30, reasoning_ratio=1.0,
        reasoning_tokens="600:1200", output_tokens="60",
    )  # fmt: skip
    assert outcome.complete and all(r.ok for r in outcome.records)
    ends, off = set(), 0
    for r in outcome.records:
        truth = sim.truth(r.server_request_id)
        assert r.tokens_source != "chunk_usage" and r.generated_tokens == truth.tokens
        off += r.think_tokens != truth.think_tokens
        assert abs(r.think_tokens - truth.think_tokens) <= r.think_budget * BUDGET_TOLERANCE
        assert _agrees(r, truth)
        ends.add(r.think_end)
    assert ends == {"natural", "budget"} and off  # some splits were off, and the ends still right


def test_the_mix_is_seed_001s_0_4_once_think_budgets_are_named() -> None:
    """--reasoning-tokens alone asks for seed 001's reasoning workload (ratio 0.4); without it, chat only."""
    base = {"url": "http://127.0.0.1:9/v1", "model": "m"}
    assert build_options(base).reasoning_ratio == 0.0
    assert build_options({**base, "reasoning_tokens": "600:6000"}).reasoning_ratio == 0.4
    given = {**base, "reasoning_tokens": "600:6000", "reasoning_ratio": 0.1}
    assert build_options(given).reasoning_ratio == 0.1
    assert build_options({**base, "reasoning_ratio": 0.0}).reasoning_ratio == 0.0
