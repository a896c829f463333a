"""Server-side /metrics of simulated engines: vLLM (V1 and legacy V0 names) and llama.cpp formats."""

from __future__ import annotations

from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from tokwatch.sim.config import ServerSettings
from tokwatch.sim.engine import EngineObserver
from tokwatch.sim.truth import RequestTruth

# Bucket boundaries exactly as a real vLLM V1 (about 0.11) exposes them.
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_N_BUCKETS = (1, 2, 5, 10, 20)
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# The older (V0) generation used shorter bucket lists.
_V0_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
_V0_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_V0_LATENCY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
FINISHED_REASONS = ("stop", "length", "abort")


class MetricsBackend(EngineObserver, Protocol):
    """An engine observer that can also render its /metrics page."""

    def render(self) -> tuple[bytes, str] | None:
        """Exposition body and content type, or None when the dialect has no /metrics."""
        ...


class NoMetrics:
    """Dialects without a /metrics endpoint (OpenAI, Ollama)."""

    def on_state(self, engine: int, running: int, waiting: int, kv_used: int) -> None:
        """Nothing to record."""

    def on_scheduled(self, engine: int, rec: RequestTruth) -> None:
        """Nothing to record."""

    def on_token(self, engine: int, rec: RequestTruth, running: int, gap: float | None) -> None:
        """Nothing to record."""

    def on_preempted(self, engine: int, rec: RequestTruth) -> None:
        """Nothing to record."""

    def on_finished(self, engine: int, rec: RequestTruth) -> None:
        """Nothing to record."""

    def render(self) -> tuple[bytes, str] | None:
        """No /metrics page."""
        return None


class VllmMetrics:
    """vLLM's Prometheus metrics in a per-server registry; `legacy` emits the V0 names and labels."""

    def __init__(self, settings: ServerSettings) -> None:
        self.legacy = settings.legacy_names
        self.capacity = settings.kv_capacity_tokens
        self.models = [m.name for m in settings.models]
        self.engines = [str(i) for i in range(settings.data_parallel)]
        self.registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        r = self.registry
        labels = ["model_name"] if self.legacy else ["model_name", "engine"]
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=r
        )
        if self.legacy:
            self.kv_usage = Gauge(
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.",
                labels,
                registry=r,
            )
            self.cpu_usage = Gauge(
                "vllm:cpu_cache_usage_perc",
                "CPU KV-cache usage. 1 means 100 percent usage.",
                labels,
                registry=r,
            )
            self.swapped = Gauge(
                "vllm:num_requests_swapped", "Number of requests swapped to CPU.", labels, registry=r
            )
        else:
            self.kv_usage = Gauge(
                "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=r
            )
            self.prefix_queries = Counter(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                labels,
                registry=r,
            )
            self.prefix_hits = Counter(
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                labels,
                registry=r,
            )
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=r
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.req_prompt = Histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            labels,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.req_generation = Histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            labels,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.iteration = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            labels,
            buckets=_ITERATION_BUCKETS,
            registry=r,
        )
        self.max_gen = Histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            labels,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.params_n = Histogram(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            labels,
            buckets=_N_BUCKETS,
            registry=r,
        )
        self.params_max = Histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            labels,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        ttft_b = _V0_TTFT_BUCKETS if self.legacy else _TTFT_BUCKETS
        itl_b = _V0_TPOT_BUCKETS if self.legacy else _ITL_BUCKETS
        lat_b = _V0_LATENCY_BUCKETS if self.legacy else _LATENCY_BUCKETS
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=ttft_b,
            registry=r,
        )
        tpot_help = "Histogram of time per output token in seconds."
        if not self.legacy:
            tpot_help += "DEPRECATED: Use vllm:inter_token_latency_seconds instead."
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds", tpot_help, labels, buckets=itl_b, registry=r
        )
        self.itl: Histogram | None = None
        self.req_tpot: Histogram | None = None
        if not self.legacy:
            self.itl = Histogram(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                labels,
                buckets=_ITL_BUCKETS,
                registry=r,
            )
            self.req_tpot = Histogram(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                labels,
                buckets=_ITL_BUCKETS,
                registry=r,
            )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=lat_b,
            registry=r,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels,
            buckets=lat_b,
            registry=r,
        )
        self.inference = Histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            labels,
            buckets=lat_b,
            registry=r,
        )
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            labels,
            buckets=lat_b,
            registry=r,
        )
        self.decode = Histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            labels,
            buckets=lat_b,
            registry=r,
        )
        if not self.legacy:
            info = Gauge(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                ["block_size", "enable_prefix_caching", "engine", "num_gpu_blocks"],
                registry=r,
            )
            blocks = str((self.capacity or 0) // 16)
            for e in self.engines:
                info.labels("16", str(settings.prefix_caching), e, blocks).set(1)
        self._initialise()

    def _labels(self, model: str, engine: int | str) -> tuple[str, ...]:
        return (model,) if self.legacy else (model, str(engine))

    def _initialise(self) -> None:
        # Real vLLM exports every series from 0, so rate() works from the first sample.
        for m in self.models:
            for e in self.engines:
                lab = self._labels(m, e)
                for metric in self._all_labelled():
                    metric.labels(*lab)
                for reason in FINISHED_REASONS:
                    self.success.labels(*lab, reason)

    def _all_labelled(self) -> list[Counter | Gauge | Histogram]:
        out: list[Counter | Gauge | Histogram] = [
            self.running,
            self.waiting,
            self.kv_usage,
            self.preemptions,
            self.prompt_tokens,
            self.generation_tokens,
            self.req_prompt,
            self.req_generation,
            self.iteration,
            self.max_gen,
            self.params_n,
            self.params_max,
            self.ttft,
            self.tpot,
            self.e2e,
            self.queue,
            self.inference,
            self.prefill,
            self.decode,
        ]
        if self.legacy:
            out += [self.cpu_usage, self.swapped]
        else:
            out += [self.prefix_queries, self.prefix_hits]
            out += [h for h in (self.itl, self.req_tpot) if h is not None]
        return out

    def on_state(self, engine: int, running: int, waiting: int, kv_used: int) -> None:
        """Engine-level gauges carry the server's first model name, as one vLLM engine serves one model."""
        lab = self._labels(self.models[0], engine)
        self.running.labels(*lab).set(running)
        self.waiting.labels(*lab).set(waiting)
        self.kv_usage.labels(*lab).set(min(1.0, kv_used / self.capacity) if self.capacity else 0.0)

    def on_scheduled(self, engine: int, rec: RequestTruth) -> None:
        """Queue time, prompt and prefix-cache counters."""
        lab = self._labels(rec.model, engine)
        if rec.scheduled_at is not None:
            self.queue.labels(*lab).observe(rec.scheduled_at - rec.arrival)
        if not self.legacy:
            self.prefix_queries.labels(*lab).inc(rec.prompt_tokens)
            self.prefix_hits.labels(*lab).inc(rec.cached_tokens)

    def on_token(self, engine: int, rec: RequestTruth, running: int, gap: float | None) -> None:
        """generation_tokens_total moves per token, as in vLLM's per-step iteration stats."""
        lab = self._labels(rec.model, engine)
        self.generation_tokens.labels(*lab).inc()
        if gap is None:
            self.prompt_tokens.labels(*lab).inc(rec.prompt_tokens)
            self.ttft.labels(*lab).observe(rec.generated_at[-1] - rec.arrival)
            self.iteration.labels(*lab).observe(rec.prompt_tokens - rec.cached_tokens)
        else:
            self.tpot.labels(*lab).observe(gap)
            if self.itl is not None:
                self.itl.labels(*lab).observe(gap)
            self.iteration.labels(*lab).observe(running)

    def on_preempted(self, engine: int, rec: RequestTruth) -> None:
        """num_preemptions_total."""
        self.preemptions.labels(*self._labels(rec.model, engine)).inc()

    def on_finished(self, engine: int, rec: RequestTruth) -> None:
        """Per-request histograms and request_success_total{finished_reason}."""
        if not rec.generated_at or rec.scheduled_at is None:
            return
        lab = self._labels(rec.model, engine)
        reason = rec.finish_reason if rec.finish_reason in ("stop", "length") else "abort"
        self.success.labels(*lab, reason).inc()
        end = rec.finished_at if rec.finished_at is not None else rec.generated_at[-1]
        first, last = rec.generated_at[0], rec.generated_at[-1]
        self.e2e.labels(*lab).observe(end - rec.arrival)
        self.req_prompt.labels(*lab).observe(rec.prompt_tokens)
        self.req_generation.labels(*lab).observe(rec.tokens)
        max_tokens = rec.max_tokens if rec.max_tokens is not None else rec.tokens
        self.params_max.labels(*lab).observe(max_tokens)
        self.max_gen.labels(*lab).observe(max_tokens)
        self.params_n.labels(*lab).observe(1)
        self.prefill.labels(*lab).observe(first - rec.scheduled_at)
        self.decode.labels(*lab).observe(last - first)
        self.inference.labels(*lab).observe(end - rec.scheduled_at)
        if self.req_tpot is not None and rec.tokens > 1:
            self.req_tpot.labels(*lab).observe((last - first) / (rec.tokens - 1))

    def render(self) -> tuple[bytes, str] | None:
        """The text exposition, as vLLM's /metrics serves it."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class LlamaCppMetrics:
    """llama-server's /metrics: totals update when a request finishes, throughput gauges reset on read."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.prompt_cached = 0
        self.prompt_seconds = 0.0
        self.predicted = 0
        self.predicted_seconds = 0.0
        self.decode_calls = 0.0
        self.busy_slot_sum = 0.0
        self.n_tokens_max = 0
        self.processing = 0
        self.deferred = 0
        # Since the last scrape (llama.cpp resets these on every /metrics read).
        self._win_prompt_tokens = 0
        self._win_prompt_seconds = 0.0
        self._win_predicted = 0
        self._win_predicted_seconds = 0.0

    def on_state(self, engine: int, running: int, waiting: int, kv_used: int) -> None:
        """Busy and deferred slots."""
        self.processing = running
        self.deferred = waiting

    def on_scheduled(self, engine: int, rec: RequestTruth) -> None:
        """Nothing until the prompt is processed."""

    def on_token(self, engine: int, rec: RequestTruth, running: int, gap: float | None) -> None:
        """A decode call serves every busy slot, so one token is 1/running of a call."""
        self.decode_calls += 1.0 / max(1, running)
        self.busy_slot_sum += 1.0
        if gap is None and rec.scheduled_at is not None:
            prompt_n = rec.prompt_tokens - rec.cached_tokens
            seconds = rec.generated_at[0] - rec.scheduled_at
            self.prompt_tokens += prompt_n
            self.prompt_cached += rec.cached_tokens
            self.prompt_seconds += seconds
            self._win_prompt_tokens += prompt_n
            self._win_prompt_seconds += seconds

    def on_preempted(self, engine: int, rec: RequestTruth) -> None:
        """llama.cpp does not preempt."""

    def on_finished(self, engine: int, rec: RequestTruth) -> None:
        """Generation totals, counted when the slot is released."""
        if not rec.generated_at:
            return
        seconds = rec.generated_at[-1] - rec.generated_at[0]
        self.predicted += rec.tokens
        self.predicted_seconds += seconds
        self._win_predicted += rec.tokens - 1
        self._win_predicted_seconds += seconds
        self.n_tokens_max = max(self.n_tokens_max, rec.prompt_tokens + rec.tokens)

    def render(self) -> tuple[bytes, str] | None:
        """The exposition in llama-server's format (values as C++ prints them)."""
        prompt_rate = self._win_prompt_tokens / self._win_prompt_seconds if self._win_prompt_seconds else 0.0
        predicted_rate = (
            self._win_predicted / self._win_predicted_seconds if self._win_predicted_seconds else 0.0
        )
        self._win_prompt_tokens = self._win_predicted = 0
        self._win_prompt_seconds = self._win_predicted_seconds = 0.0
        decode_calls = round(self.decode_calls)
        busy = self.busy_slot_sum / self.decode_calls if self.decode_calls else 0.0
        families: list[tuple[str, str, str, float]] = [
            (
                "prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed, excluding cached tokens",
                self.prompt_tokens,
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens reused from the cache",
                self.prompt_cached,
            ),
            ("prompt_seconds_total", "counter", "Total time spent processing prompts", self.prompt_seconds),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed", self.predicted),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "Total time spent generating tokens",
                self.predicted_seconds,
            ),
            (
                "n_decode_total",
                "counter",
                "Total number of llama_decode() calls, excluding speculative decoding and multimodal "
                "decoding",
                decode_calls,
            ),
            (
                "n_tokens_max",
                "counter",
                "Largest observed sequence length (prompt + generation)",
                self.n_tokens_max,
            ),
            ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated", 0),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "Speculative: Total draft tokens accepted by the target model",
                0,
            ),
            (
                "spec_decode_num_drafts_total",
                "counter",
                "Speculative: Total speculative decoding verification steps",
                0,
            ),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s", prompt_rate),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s",
                predicted_rate,
            ),
            ("requests_processing", "gauge", "Number of requests processing", self.processing),
            ("requests_deferred", "gauge", "Number of requests deferred", self.deferred),
            (
                "n_busy_slots_per_decode",
                "gauge",
                "Average number of busy slots per llama_decode() call",
                busy,
            ),
        ]
        lines = []
        for name, kind, help_text, value in families:
            full = f"llamacpp:{name}"
            lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}", f"{full} {value:.6g}"]
        return ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4"


def make_metrics(settings: ServerSettings) -> MetricsBackend:
    """A fresh metrics backend for the server's dialect (a restart calls this again)."""
    if settings.dialect in ("vllm", "sglang"):
        return VllmMetrics(settings) if settings.dialect == "vllm" else SglangMetrics(settings)
    if settings.dialect == "llamacpp":
        return LlamaCppMetrics()
    return NoMetrics()


class SglangMetrics(NoMetrics):
    """SGLang's core /metrics families (`sglang:` prefix, `model_name` label)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.models = [m.name for m in settings.models]
        self.capacity = settings.kv_capacity_tokens
        r = self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", lab, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", lab, registry=r
        )
        self.requests = Counter("sglang:num_requests", "Number of requests processed.", lab, registry=r)
        self.running = Gauge("sglang:num_running_reqs", "The number of running requests.", lab, registry=r)
        self.queue = Gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", lab, registry=r
        )
        self.usage = Gauge("sglang:token_usage", "The token usage.", lab, registry=r)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            lab,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            lab,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            lab,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        for m in self.models:
            for metric in (
                self.prompt_tokens,
                self.generation_tokens,
                self.requests,
                self.running,
                self.queue,
                self.usage,
                self.ttft,
                self.itl,
                self.e2e,
            ):
                metric.labels(m)

    def on_state(self, engine: int, running: int, waiting: int, kv_used: int) -> None:
        """Running/queued requests and token usage."""
        m = self.models[0]
        self.running.labels(m).set(running)
        self.queue.labels(m).set(waiting)
        self.usage.labels(m).set(min(1.0, kv_used / self.capacity) if self.capacity else 0.0)

    def on_token(self, engine: int, rec: RequestTruth, running: int, gap: float | None) -> None:
        """Token counters and latency histograms."""
        self.generation_tokens.labels(rec.model).inc()
        if gap is None:
            self.prompt_tokens.labels(rec.model).inc(rec.prompt_tokens)
            self.ttft.labels(rec.model).observe(rec.generated_at[-1] - rec.arrival)
        else:
            self.itl.labels(rec.model).observe(gap)

    def on_finished(self, engine: int, rec: RequestTruth) -> None:
        """Request count and e2e latency."""
        if rec.generated_at:
            self.requests.labels(rec.model).inc()
            end = rec.finished_at if rec.finished_at is not None else rec.generated_at[-1]
            self.e2e.labels(rec.model).observe(end - rec.arrival)

    def render(self) -> tuple[bytes, str] | None:
        """The text exposition."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
