"""Client figures against the simulator's ground truth, over real loopback HTTP."""

import itertools
import json

import pytest
from rich.console import Console

from tokwatch.bench.config import build_options
from tokwatch.bench.session import run_bench
from tokwatch.figures.stats import median

SIM = """
servers:
  - name: vllm-a
    dialect: vllm
    models:
      - name: chunky
        decode_tps: 100
        prefill_tps: 1000
        tokens_per_chunk: 3
        think_tokens: 6
        ping_interval: 5ms
  - name: runaway
    dialect: openai
    models:
      - name: endless
        decode_tps: 2000
        endless_stream: true
  - name: olla
    dialect: ollama
    models:
      - name: thinker
        decode_tps: 500
        think_tokens: 4
        reasoning_format: think_tags
  - name: llama
    dialect: llamacpp
    api_key: test-key-123456
    models:
      - name: plain
        decode_tps: 200
"""
TOL = 0.02  # generous: correctness, not performance


async def _bench(tmp_path, url, kind, model, **kw):
    opts = build_options(
        {"url": url, "kind": kind, "model": model, "live_interval": 60, "plots": False, **kw}
    )
    return await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")


async def test_latency_figures_match_sim_truth(tmp_path, sim):
    outcome, _ = await _bench(
        tmp_path, f"{sim.url}/vllm-a/v1", "vllm", "chunky", concurrency=3, number=6,
        output_tokens="24", input_tokens="64",
    )  # fmt: skip
    assert outcome.complete and len(outcome.records) == 6
    for r in outcome.records:
        truth = sim.truth(r.server_request_id)
        assert truth is not None and r.ok
        emitted = truth.emitted_at
        # token counts: multi-token chunks are k tokens; the think phase is split out
        assert r.generated_tokens == truth.tokens == 24
        assert (r.think_tokens, r.output_tokens) == (truth.think_tokens, truth.output_tokens) == (6, 18)
        assert r.chunks == len(truth.chunks)
        # TTFT: the first content/reasoning token, never a ping sent during the ~80 ms prefill
        true_ttft = emitted[0] - truth.arrival
        assert true_ttft > 0.03
        assert r.ttft_s == pytest.approx(true_ttft, abs=TOL)
        # TBT: k-token chunks give their gap and k-1 zeros, one value per token after the first
        true_gaps = [b - a for a, b in itertools.pairwise(emitted)]
        assert len(r.tbt_s) == len(true_gaps) == 23
        assert [g == 0.0 for g in r.tbt_s] == [g == 0.0 for g in true_gaps]
        assert max(abs(c - t) for c, t in zip(r.tbt_s, true_gaps, strict=True)) < TOL
        # TTOT (timing.ttot): last think token to first output token
        k = truth.think_tokens
        assert r.ttot_s == pytest.approx(emitted[k] - emitted[k - 1], abs=TOL)
        assert r.tpot_s == pytest.approx((emitted[-1] - emitted[0]) / 23, abs=TOL)
        assert len(r.output_itl_s) == 17
    summary = outcome.summary()
    assert summary["metrics"]["tbt"]["count"] == 6 * 23
    assert outcome.client["receive_stamps"] in ("kernel", "watcher_thread")  # closed loop: not the loop's
    assert median([r.fluidity_index for r in outcome.records]) > 0


async def test_server_counters_over_the_run(tmp_path, sim):
    outcome, out_dir = await _bench(
        tmp_path, f"{sim.url}/vllm-a/v1", "vllm", "chunky", concurrency=2, number=4, output_tokens="12"
    )
    assert outcome.server.get("server") == "vllm"
    assert outcome.server["generation_tokens_delta"] >= 48
    assert (out_dir / "server_metrics_before.txt").is_file()
    assert (out_dir / "server_metrics_after.txt").is_file()


async def test_api_key_and_exact_length_on_llamacpp(tmp_path, sim, monkeypatch):
    monkeypatch.setenv("SIM_KEY", "test-key-123456")
    outcome, out_dir = await _bench(
        tmp_path, f"{sim.url}/llama", "llamacpp", "plain", concurrency=2, number=4, output_tokens="10",
        api_key_env="SIM_KEY",
    )  # fmt: skip
    assert all(r.ok and r.generated_tokens == 10 for r in outcome.records)
    for path in out_dir.iterdir():
        if path.suffix in (".json", ".jsonl", ".md", ".txt"):
            assert "test-key-123456" not in path.read_text()


async def test_wrong_api_key_is_an_auth_failure(tmp_path, sim, monkeypatch):
    monkeypatch.setenv("SIM_KEY", "wrong-key-999999")
    outcome, _ = await _bench(
        tmp_path, f"{sim.url}/llama", "llamacpp", "plain", concurrency=1, number=3, api_key_env="SIM_KEY"
    )
    assert outcome.stop_reason == "auth_failure" and not outcome.complete


async def test_ollama_with_think_tags_and_a_reasoning_mix(tmp_path, sim):
    outcome, _ = await _bench(
        tmp_path, f"{sim.url}/olla", "ollama", "thinker", concurrency=2, number=8, output_tokens="12",
        reasoning_ratio=0.5, reasoning_tokens="20:30",
    )  # fmt: skip
    assert outcome.complete and all(r.ok for r in outcome.records)
    cats = {r.category for r in outcome.records}
    assert cats == {"chat", "reasoning"}
    for r in outcome.records:
        truth = sim.truth(r.server_request_id)
        assert r.tokens_source == "engine"  # Ollama eval_count
        assert r.generated_tokens == truth.tokens
        assert r.think_tokens == truth.think_tokens == 4
        assert r.ttot_s is not None and r.ttot_s >= 0
        if r.category == "reasoning":
            assert 32 <= r.max_tokens <= 42


async def test_server_ignoring_max_tokens_stops_the_run(tmp_path, sim):
    outcome, out_dir = await _bench(
        tmp_path, f"{sim.url}/runaway/v1", "openai", "endless", concurrency=1, number=10, output_tokens="8"
    )
    assert outcome.stop_reason == "max_tokens_ignored" and not outcome.complete
    assert outcome.records[0].error_class == "max_tokens_ignored"
    assert "ignores max_tokens" in (outcome.message or "")
    assert len(outcome.records) == 1
    assert json.loads((out_dir / "summary.json").read_text())["complete"] is False
