"""vLLM /metrics adapter: which `vllm:*` families mean what, across both naming generations.

Counters are summed over the `engine` label (data-parallel engines) and filtered by `model_name` when
several models are served. Renamed families are read newest name first: `kv_cache_usage_perc` (was
`gpu_cache_usage_perc`), `inter_token_latency_seconds` (was `time_per_output_token_seconds`),
`prefix_cache_{hits,queries}_total` (was `gpu_prefix_cache_{hits,queries}_total`, and before that the
`gpu_prefix_cache_hit_rate` gauge).
"""

from __future__ import annotations

from tokwatch.counters.parse import MetricsSnapshot
from tokwatch.counters.reading import CounterReading, ModelNotServed, RawCounters, model_filter

PREFIX = "vllm:"
ITL_SUMS = ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum")


def read_vllm(snap: MetricsSnapshot, model: str | None) -> CounterReading:
    """Extract vLLM's figures for `model` from one scrape."""
    try:
        where = model_filter(snap, PREFIX, model)
    except ModelNotServed as exc:
        return CounterReading(server="vllm", problem=f"vLLM {exc}")
    c = RawCounters(snap, where)
    generation = c.total("vllm:generation_tokens_total")
    finished = c.total("vllm:request_success_total", "vllm:e2e_request_latency_seconds_count")
    gen_sum = c.total("vllm:request_generation_tokens_sum")
    gen_count = c.total("vllm:request_generation_tokens_count")
    decode_time = c.total("vllm:request_decode_time_seconds_sum")
    itl_sum = c.total(*ITL_SUMS)
    basis: str | None = None
    decode_tokens: float | None = None
    decode_seconds: float | None = None
    if gen_sum is not None and gen_count is not None and decode_time is not None:
        # Per finished request: n generated tokens, decode time from first to last token = n-1 gaps.
        basis, decode_tokens, decode_seconds = "request_decode_time", gen_sum - gen_count, decode_time
    elif generation is not None and finished is not None and itl_sum is not None:
        basis, decode_tokens, decode_seconds = "inter_token_latency", generation - finished, itl_sum
    return CounterReading(
        server="vllm",
        basis=basis,
        generation_tokens=generation,
        prompt_tokens=c.total("vllm:prompt_tokens_total"),
        finished_requests=finished,
        preemptions=c.total("vllm:num_preemptions_total"),
        decode_tokens=decode_tokens,
        decode_seconds=decode_seconds,
        prefix_hits=c.total("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        prefix_queries=c.total("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        running=c.gauge("vllm:num_requests_running"),
        waiting=c.gauge("vllm:num_requests_waiting"),
        kv_cache_usage=c.gauge("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", mean=True),
        prefix_hit_ratio=c.gauge("vllm:gpu_prefix_cache_hit_rate", mean=True),
        raw=dict(c.raw),
        created=c.created(),
    )
