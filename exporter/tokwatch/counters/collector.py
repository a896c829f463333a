"""prometheus_client Collector yielding the `tokwatch_server_*` families from in-memory state (no I/O).

For the app: one per registry::

    collector = ServerCollector()                 # or ServerCollector(states)
    registry.register(collector)
    collector.add(server_counters.state)          # ServerCounters / OllamaSignals .state
    collector.remove("endpoint-name")             # endpoint removed on config reload

Every family carries `endpoint` plus the endpoint's static labels (union over endpoints, "" where an
endpoint lacks one), as the rest of tokwatch's metrics do. Gauges of an endpoint whose server is down are
not exported at all; its counters (`_total`) keep their values.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokwatch.counters.state import ServerState, ServerView

_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "decode_tps",
        "tokwatch_server_decode_tokens_per_second",
        "Server-wide generated tokens per second over the last scrape interval (all requests)",
    ),
    (
        "prefill_tps",
        "tokwatch_server_prefill_tokens_per_second",
        "Server-wide prompt tokens processed per second over the last scrape interval",
    ),
    ("running", "tokwatch_server_requests_running", "Requests the server is running now"),
    ("waiting", "tokwatch_server_requests_waiting", "Requests queued on the server now"),
    ("kv_cache_usage", "tokwatch_server_kv_cache_usage_ratio", "KV-cache usage from the server (0..1)"),
    (
        "prefix_hit_ratio",
        "tokwatch_server_prefix_cache_hit_ratio",
        "Prefix-cache hit ratio: cached / queried prompt tokens over the last interval with queries (0..1)",
    ),
    (
        "vram_ratio",
        "tokwatch_server_model_vram_ratio",
        "Ollama: share of the loaded model in GPU memory (size_vram / size); < 1 means partly on the CPU",
    ),
)


class ServerCollector(Collector):
    """Exports the server-side figures of every registered endpoint, one part per endpoint. Sample::

        tokwatch_server_up{endpoint="a",gpu="3090"} 1.0
        tokwatch_server_scrape_errors_total{endpoint="a",gpu="3090"} 0.0
        tokwatch_server_scrape_duration_seconds{endpoint="a",gpu="3090"} 0.02
        tokwatch_server_decode_tokens_per_second{endpoint="a",gpu="3090"} 200.0
        tokwatch_server_requests_running{endpoint="a",gpu="3090"} 2.0
        tokwatch_server_kv_cache_usage_ratio{endpoint="a",gpu="3090"} 0.5
        tokwatch_server_preemptions_total{endpoint="a",gpu="3090"} 3.0
    """

    def __init__(self, states: Iterable[ServerState] = ()) -> None:
        self._states: dict[str, ServerState] = {s.endpoint: s for s in states}
        self._parts_extra: tuple[str, ...] = ()  # label names `parts()` saw, so parts cost O(1) each
        self.site = ""  # the exporter's site (config `site:`): a `site` label on every family when set

    def add(self, state: ServerState) -> None:
        """Export this endpoint's state (replaces an earlier state of the same endpoint)."""
        self._states = {**self._states, state.endpoint: state}

    def remove(self, endpoint: str) -> None:
        """Stop exporting an endpoint."""
        self._states = {k: v for k, v in self._states.items() if k != endpoint}

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: families depend on the endpoints registered later."""
        return []

    def parts(self) -> Iterator[tuple[Hashable, Hashable]]:
        """One part per endpoint (see tokwatch.metrics.exposition), revised when its state changes."""
        extra = self._parts_extra = self._extra()
        for name, state in self._states.items():
            yield name, (state.revision, id(state), extra, self.site)

    def collect_part(self, key: Hashable) -> Iterator[Metric]:
        """One endpoint's families (label names are still the union over all endpoints)."""
        state = self._states.get(str(key))
        return self._collect([state] if state is not None else [], self._parts_extra)

    def collect(self) -> Iterator[Metric]:
        """Build the families from the current in-memory state."""
        return self._collect(list(self._states.values()), self._extra())

    def _extra(self) -> tuple[str, ...]:
        return tuple(sorted({k for s in self._states.values() for k in s.labels}))

    def _collect(self, states: list[ServerState], extra: tuple[str, ...]) -> Iterator[Metric]:
        site = [self.site] if self.site else []
        names = ["endpoint", *extra, *(["site"] if site else [])]

        def labels(s: ServerState, *more: str) -> list[str]:
            return [s.endpoint, *(s.labels.get(k, "") for k in extra), *site, *more]

        up = GaugeMetricFamily("tokwatch_server_up", "1 if the server metrics source answered", labels=names)
        errors = CounterMetricFamily(
            "tokwatch_server_scrape_errors", "Failed, malformed, oversized or slow scrapes", labels=names
        )
        duration = GaugeMetricFamily(
            "tokwatch_server_scrape_duration_seconds",
            "Duration of the last server metrics scrape",
            labels=names,
        )
        preempt = CounterMetricFamily(
            "tokwatch_server_preemptions",
            "Server preemptions (vLLM) or retractions (SGLang), accumulated across server restarts",
            labels=names,
        )
        reloads = CounterMetricFamily(
            "tokwatch_server_model_reloads",
            "Ollama: timed runs that found the model evicted and reloaded it",
            labels=names,
        )
        mirrored_total = CounterMetricFamily(
            "tokwatch_server_mirrored",
            "Mirrored server counters, accumulated across server restarts",
            labels=[*names, "metric"],
        )
        # Not "tokwatch_server_mirrored": in OpenMetrics that is the counter family's name too.
        mirrored = GaugeMetricFamily(
            "tokwatch_server_mirrored_value", "Mirrored server gauges", labels=[*names, "metric"]
        )
        gauges = {attr: GaugeMetricFamily(name, doc, labels=names) for attr, name, doc in _GAUGES}
        for s in states:
            view: ServerView = s.view
            errors.add_metric(labels(s), s.scrape_errors)
            if s.ollama:
                reloads.add_metric(labels(s), s.model_reloads)
            elif s.has_preemptions:
                preempt.add_metric(labels(s), s.preemptions.total)
            for name, total in sorted(dict(s.mirrored_totals).items()):
                mirrored_total.add_metric(labels(s, name), total.total)
            if not s.scraped:
                continue
            up.add_metric(labels(s), 1.0 if view.up else 0.0)
            if view.scrape_duration_s is not None:
                duration.add_metric(labels(s), view.scrape_duration_s)
            if not view.up:
                continue
            for attr, family in gauges.items():
                value = getattr(view, attr)
                if value is not None:
                    family.add_metric(labels(s), value)
            for name, value in sorted(view.mirrored.items()):
                mirrored.add_metric(labels(s, name), value)
        yield from (up, errors, duration, *gauges.values(), preempt, reloads, mirrored_total, mirrored)
