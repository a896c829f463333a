"""Shared fixtures for the server-counters tests: real sample captures and hand-made exposition texts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

# Real server captures, copied into the repository (tests/data/README.md says where each came from).
SAMPLES = Path(__file__).resolve().parents[1] / "data"


def _sample_text(name: str) -> str:
    """A real server capture from tests/data."""
    return (SAMPLES / name).read_text(encoding="utf-8")


def _vllm_text(
    *,
    gen_sum: float = 0,
    gen_count: float = 0,
    decode_s: float = 0,
    generation: float = 0,
    prompt: float = 0,
    success: float = 0,
    running: float = 0,
    waiting: float = 0,
    preemptions: float = 0,
    kv: float = 0.0,
    hits: float = 0,
    queries: float = 0,
    itl_sum: float = 0,
    created: float = 1700000000.0,
    legacy: bool = False,
    engines: tuple[str, ...] = ("0",),
    models: tuple[str, ...] = ("m",),
    histograms: bool = True,
) -> str:
    """A vLLM /metrics body; every value is split evenly over the engines and models given."""
    share = len(engines) * len(models)
    kv_name = "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc"
    itl_name = "vllm:time_per_output_token_seconds" if legacy else "vllm:inter_token_latency_seconds"
    prefix = "vllm:gpu_prefix_cache" if legacy else "vllm:prefix_cache"
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        "# TYPE vllm:num_requests_waiting gauge",
        f"# TYPE {kv_name} gauge",
        "# TYPE vllm:generation_tokens_total counter",
        "# TYPE vllm:prompt_tokens_total counter",
        "# TYPE vllm:request_success_total counter",
        "# TYPE vllm:num_preemptions_total counter",
    ]
    for e in engines:
        for m in models:
            lab = f'engine="{e}",model_name="{m}"'
            lines += [
                f"vllm:num_requests_running{{{lab}}} {running / share}",
                f"vllm:num_requests_waiting{{{lab}}} {waiting / share}",
                f"{kv_name}{{{lab}}} {kv}",
                f"vllm:generation_tokens_total{{{lab}}} {generation / share}",
                f"vllm:generation_tokens_created{{{lab}}} {created}",
                f"vllm:prompt_tokens_total{{{lab}}} {prompt / share}",
                f'vllm:request_success_total{{{lab},finished_reason="stop"}} {success / share}',
                f'vllm:request_success_total{{{lab},finished_reason="length"}} 0',
                f"vllm:num_preemptions_total{{{lab}}} {preemptions / share}",
                f"{prefix}_hits_total{{{lab}}} {hits / share}",
                f"{prefix}_queries_total{{{lab}}} {queries / share}",
                f"{itl_name}_sum{{{lab}}} {itl_sum / share}",
                f"{itl_name}_count{{{lab}}} {max(generation - success, 0) / share}",
            ]
            if histograms:
                lines += [
                    f"vllm:request_generation_tokens_sum{{{lab}}} {gen_sum / share}",
                    f"vllm:request_generation_tokens_count{{{lab}}} {gen_count / share}",
                    f"vllm:request_decode_time_seconds_sum{{{lab}}} {decode_s / share}",
                    f"vllm:request_decode_time_seconds_count{{{lab}}} {gen_count / share}",
                ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def sample_text() -> Callable[[str], str]:
    """Reads a real capture by file name."""
    return _sample_text


@pytest.fixture
def vllm_text() -> Callable[..., str]:
    """Builds a vLLM /metrics body from keyword figures (see `_vllm_text`)."""
    return _vllm_text
