"""SGLang (`--enable-metrics`) adapter: `sglang:*` families, filtered by `model_name`, summed over ranks.

SGLang has no per-request decode-time counter. Its inter-token-latency histogram is observed once per
output batch with the batch's interval added to `_sum` and the number of new tokens added to `_count`,
so Δcount / Δsum is decode tok/s over the tokens after the first. Retractions (SGLang's preemptions)
come from the `sglang:num_retracted_requests_total` counter of recent versions; older versions only have
a per-interval gauge, which cannot be accumulated, so they expose no preemption figure.

Builds since sgl-project/sglang#15758 (December 2025) name the same families `sglang_*` (an underscore, as
Prometheus' naming rules ask, instead of the colon reserved for recording rules); they are read under their
`sglang:` names, so one table of names serves both generations.
"""

from __future__ import annotations

from tokwatch.counters.parse import MetricsSnapshot
from tokwatch.counters.reading import CounterReading, ModelNotServed, RawCounters, model_filter

PREFIX = "sglang:"
UNDERSCORE_PREFIX = "sglang_"
PREFIXES = (PREFIX, UNDERSCORE_PREFIX)


def colon_names(snap: MetricsSnapshot) -> MetricsSnapshot:
    """The scrape with `sglang_*` families named `sglang:*` (unchanged when it has `sglang:` ones)."""
    names = list(snap.names())
    if any(n.startswith(PREFIX) for n in names) or not any(n.startswith(UNDERSCORE_PREFIX) for n in names):
        return snap
    return snap.renamed(UNDERSCORE_PREFIX, PREFIX)


def read_sglang(snap: MetricsSnapshot, model: str | None) -> CounterReading:
    """Extract SGLang's figures for `model` from one scrape (`sglang:` or `sglang_` names)."""
    snap = colon_names(snap)
    try:
        where = model_filter(snap, PREFIX, model)
    except ModelNotServed as exc:
        return CounterReading(server="sglang", problem=f"SGLang {exc}")
    c = RawCounters(snap, where)
    itl_count = c.total("sglang:inter_token_latency_seconds_count")
    itl_sum = c.total("sglang:inter_token_latency_seconds_sum")
    has_decode = itl_count is not None and itl_sum is not None
    prompt = c.total("sglang:prompt_tokens_total")
    cached = c.total("sglang:cached_tokens_total")
    return CounterReading(
        server="sglang",
        basis="inter_token_latency" if has_decode else None,
        generation_tokens=c.total("sglang:generation_tokens_total"),
        prompt_tokens=prompt,
        finished_requests=c.total("sglang:num_requests_total"),
        preemptions=c.total("sglang:num_retracted_requests_total"),
        decode_tokens=itl_count if has_decode else None,
        decode_seconds=itl_sum if has_decode else None,
        # SGLang's prompt token count includes the cached prefix.
        prefix_hits=cached if prompt is not None else None,
        prefix_queries=prompt if cached is not None else None,
        running=c.gauge("sglang:num_running_reqs"),
        waiting=c.gauge("sglang:num_queue_reqs"),
        kv_cache_usage=c.gauge("sglang:token_usage", mean=True),
        prefix_hit_ratio=c.gauge("sglang:cache_hit_rate", mean=True),
        raw=dict(c.raw),
        created=c.created(),
    )
