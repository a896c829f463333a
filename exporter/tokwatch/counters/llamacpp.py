"""llama.cpp (`llama-server --metrics`) adapter: `llamacpp:*` families, which carry no labels.

The `llamacpp:predicted_tokens_seconds` and `llamacpp:prompt_tokens_seconds` gauges are never read: the
server resets the figures behind them on every /metrics request, so any other scraper (Prometheus itself)
silently changes what tokwatch would see. Only the `_total` counters are used.
"""

from __future__ import annotations

from tokwatch.counters.parse import MetricsSnapshot
from tokwatch.counters.reading import CounterReading, RawCounters

PREFIX = "llamacpp:"


def read_llamacpp(snap: MetricsSnapshot, model: str | None) -> CounterReading:
    """Extract llama-server's figures from one scrape (it serves one model; `model` is not checked)."""
    c = RawCounters(snap, {})
    predicted = c.total("llamacpp:tokens_predicted_total")
    predicted_seconds = c.total("llamacpp:tokens_predicted_seconds_total")
    prompt = c.total("llamacpp:prompt_tokens_total")
    cached = c.total("llamacpp:prompt_tokens_cached_total")
    has_decode = predicted is not None and predicted_seconds is not None
    calls = c.total("llamacpp:n_decode_total")
    accepted = c.total("llamacpp:spec_decode_num_accepted_tokens_total")
    if calls is not None and accepted is not None:
        # An accepted draft token is a token without a decode call of its own (speculative decoding).
        calls += accepted
    return CounterReading(
        server="llamacpp",
        basis="tokens_predicted_seconds" if has_decode else None,
        generation_tokens=predicted,
        prompt_tokens=prompt,
        decode_tokens=predicted if has_decode else None,
        decode_seconds=predicted_seconds if has_decode else None,
        # The current format counts cached prompt tokens apart from processed ones.
        prefix_hits=cached,
        prefix_queries=(prompt + cached) if prompt is not None and cached is not None else None,
        decode_calls=calls,
        running=c.gauge("llamacpp:requests_processing"),
        waiting=c.gauge("llamacpp:requests_deferred"),
        kv_cache_usage=c.gauge("llamacpp:kv_cache_usage_ratio", mean=True),
        raw=dict(c.raw),
        created=c.created(),
    )
