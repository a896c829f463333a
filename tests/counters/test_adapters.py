"""vLLM, llama.cpp and SGLang adapters: naming generations, DP summing, model filtering, real captures."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tokwatch.counters.adapters import detect_server, read_counters
from tokwatch.counters.llamacpp import read_llamacpp
from tokwatch.counters.parse import parse_metrics
from tokwatch.counters.sglang import read_sglang
from tokwatch.counters.vllm import read_vllm
from tokwatch.counters.window import measure_readings

SGLANG_TEXT = """# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
sglang:cached_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0e+06
sglang:num_requests_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000
sglang:num_retracted_requests_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 3
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0075
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1
sglang:inter_token_latency_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 100.0
sglang:inter_token_latency_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 5000
sglang:gen_throughput{model_name="meta-llama/Llama-3.1-8B-Instruct"} 999
"""


def test_real_vllm_v1_capture(sample_text: Callable[[str], str]) -> None:
    r = read_vllm(parse_metrics(sample_text("vllm_metrics.txt")), "Qwen/Qwen1.5-0.5B-Chat")
    assert r.problem is None
    assert r.basis == "request_decode_time"
    assert (r.generation_tokens, r.finished_requests, r.preemptions, r.running, r.kv_cache_usage) == (
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    )
    assert "vllm:generation_tokens_created" in r.created


@pytest.mark.parametrize("legacy", [False, True])
def test_both_vllm_naming_generations(vllm_text: Callable[..., str], legacy: bool) -> None:
    text = vllm_text(kv=0.4, hits=30, queries=120, generation=10, success=1, itl_sum=0.9, legacy=legacy)
    r = read_vllm(parse_metrics(text), "m")
    assert r.kv_cache_usage == pytest.approx(0.4)
    assert (r.prefix_hits, r.prefix_queries) == (30, 120)
    assert r.basis == "request_decode_time"
    # Without the per-request histograms, the ITL (new) or TPOT (old) histogram gives the decode time.
    r2 = read_vllm(
        parse_metrics(vllm_text(generation=10, success=1, itl_sum=0.9, legacy=legacy, histograms=False)), "m"
    )
    assert r2.basis == "inter_token_latency"
    assert (r2.decode_tokens, r2.decode_seconds) == (9, pytest.approx(0.9))


def test_vllm_sums_over_data_parallel_engines(vllm_text: Callable[..., str]) -> None:
    text = vllm_text(generation=400, success=4, running=2, kv=0.5, engines=("0", "1"))
    snap = parse_metrics(text)
    assert len(snap.select("vllm:generation_tokens_total")) == 2
    r = read_vllm(snap, "m")
    assert r.generation_tokens == 400 and r.finished_requests == 4 and r.running == 2
    assert r.kv_cache_usage == pytest.approx(0.5)  # a ratio is averaged over engines, not summed


def test_vllm_filters_by_model_name_when_several_models_are_served(vllm_text: Callable[..., str]) -> None:
    text = vllm_text(generation=100, models=("a",)) + vllm_text(generation=900, models=("b",)).replace(
        "# TYPE", "# IGNORED"
    )
    snap = parse_metrics(text)
    assert read_vllm(snap, "a").generation_tokens == 100
    assert read_vllm(snap, "b").generation_tokens == 900
    missing = read_vllm(snap, "c")
    assert missing.problem is not None and "serves 2 models" in missing.problem
    assert measure_readings(missing, missing).reason == missing.problem
    # A single served model is used whatever the endpoint calls it (served-model aliases).
    assert read_vllm(parse_metrics(vllm_text(generation=5)), "alias").generation_tokens == 5


def test_llamacpp_before_after_one_request(sample_text: Callable[[str], str]) -> None:
    before = read_llamacpp(parse_metrics(sample_text("llamacpp_metrics_before.txt")), None)
    after = read_llamacpp(parse_metrics(sample_text("llamacpp_metrics_after.txt")), None)
    m = measure_readings(before, after)
    assert m.tokens_per_second == pytest.approx(893 / 9.45707)
    assert not m.shared, m.reason
    assert after.prefix_hits == 181 and after.prefix_queries == 95 + 181


def test_llamacpp_never_reads_its_resetting_tok_s_gauges(sample_text: Callable[[str], str]) -> None:
    text = sample_text("llamacpp_metrics_after.txt")
    changed = text.replace("llamacpp:predicted_tokens_seconds 93.1966", "llamacpp:predicted_tokens_seconds 1")
    assert changed != text
    assert read_llamacpp(parse_metrics(text), None) == read_llamacpp(parse_metrics(changed), None)


def test_llamacpp_legacy_and_partial_formats(sample_text: Callable[[str], str]) -> None:
    legacy = read_llamacpp(parse_metrics(sample_text("llamacpp_metrics_legacy.txt")), None)
    assert legacy.basis == "tokens_predicted_seconds"
    assert legacy.decode_tokens == 123063 and legacy.decode_seconds == pytest.approx(683.744)
    assert legacy.prefix_hits is None  # the legacy format has no cached-token counter
    partial = read_llamacpp(parse_metrics(sample_text("llamacpp_metrics_current_partial.txt")), None)
    assert partial.basis is None  # no tokens_predicted_seconds_total in that capture
    assert partial.running == 3


def test_sglang_families() -> None:
    r = read_sglang(parse_metrics(SGLANG_TEXT), "meta-llama/Llama-3.1-8B-Instruct")
    assert r.basis == "inter_token_latency"
    assert (r.decode_tokens, r.decode_seconds) == (5000, 100.0)
    assert (r.running, r.waiting, r.preemptions, r.finished_requests) == (2, 1, 3, 1000)
    assert r.kv_cache_usage == pytest.approx(0.28)
    assert r.prefix_hits == 4.0e6 and r.prefix_queries == 8.128902e06


def test_server_detection_uses_families_and_the_kind_hint(vllm_text: Callable[..., str]) -> None:
    assert detect_server(parse_metrics(SGLANG_TEXT), "openai") == "sglang"
    assert detect_server(parse_metrics(vllm_text()), "llamacpp") == "vllm"
    assert detect_server(parse_metrics("process_cpu_seconds_total 1\n"), "vllm") is None
    assert read_counters(parse_metrics("process_cpu_seconds_total 1\n"), "vllm", "m") is None
