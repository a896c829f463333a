"""The `tokwatch_server_*` families, read back through a real CollectorRegistry."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tokwatch.counters.collector import ServerCollector
from tokwatch.counters.parse import parse_metrics
from tokwatch.counters.state import ServerState
from tokwatch.counters.vllm import read_vllm
from tokwatch.figures.result import RunResult, Status


def scrape(state: ServerState, text: str, at: float) -> None:
    snap = parse_metrics(text)
    state.record(read_vllm(snap, "m"), snap, at, 0.02)


@pytest.fixture
def registry() -> tuple[CollectorRegistry, ServerCollector]:
    reg = CollectorRegistry()
    collector = ServerCollector()
    reg.register(collector)
    return reg, collector


def test_families_labels_and_down_server(
    registry: tuple[CollectorRegistry, ServerCollector], vllm_text: Callable[..., str]
) -> None:
    reg, collector = registry
    a = ServerState("a", {"team": "x"}, mirror=("evictions",))
    b = ServerState("b", {"region": "eu"})
    collector.add(a)
    collector.add(b)
    extra = "# TYPE evictions_total counter\nevictions_total {n}\n"
    scrape(a, vllm_text(generation=0, running=2, kv=0.5, preemptions=1) + extra.format(n=1), 0.0)
    scrape(a, vllm_text(generation=300, running=2, kv=0.5, preemptions=4) + extra.format(n=3), 15.0)
    la = {"endpoint": "a", "team": "x", "region": ""}
    lb = {"endpoint": "b", "team": "", "region": "eu"}
    get = reg.get_sample_value
    assert get("tokwatch_server_up", la) == 1
    assert get("tokwatch_server_up", lb) is None  # never scraped yet
    assert get("tokwatch_server_decode_tokens_per_second", la) == pytest.approx(20.0)
    assert get("tokwatch_server_requests_running", la) == 2
    assert get("tokwatch_server_kv_cache_usage_ratio", la) == 0.5
    assert get("tokwatch_server_preemptions_total", la) == 3
    assert get("tokwatch_server_mirrored_total", {**la, "metric": "evictions"}) == 2
    assert get("tokwatch_server_scrape_errors_total", lb) == 0
    assert get("tokwatch_server_scrape_duration_seconds", la) == pytest.approx(0.02)
    a.record_error(1.0, "refused")
    assert get("tokwatch_server_up", la) == 0
    assert get("tokwatch_server_requests_running", la) is None  # no stale gauges
    assert get("tokwatch_server_kv_cache_usage_ratio", la) is None
    assert get("tokwatch_server_preemptions_total", la) == 3
    assert get("tokwatch_server_scrape_errors_total", la) == 1
    collector.remove("a")
    assert get("tokwatch_server_scrape_errors_total", la) is None
    assert b"tokwatch_server_up" in generate_latest(reg)


def test_ollama_families(registry: tuple[CollectorRegistry, ServerCollector]) -> None:
    reg, collector = registry
    state = ServerState("ol", ollama=True)
    collector.add(state)
    labels = {"endpoint": "ol"}
    assert reg.get_sample_value("tokwatch_server_model_reloads_total", labels) == 0
    state.record_ollama(0.6, 0.01)
    state.record_reload()
    assert reg.get_sample_value("tokwatch_server_model_reloads_total", labels) == 1
    assert reg.get_sample_value("tokwatch_server_model_vram_ratio", labels) == pytest.approx(0.6)
    assert reg.get_sample_value("tokwatch_server_preemptions_total", labels) is None
    assert RunResult("ol", 0.0, Status.OK).cold is None  # the field OllamaSignals.observe reads


def test_exposition_is_valid_openmetrics_and_text(
    registry: tuple[CollectorRegistry, ServerCollector], vllm_text: Callable[..., str]
) -> None:
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    reg, collector = registry
    state = ServerState("a", mirror=("evictions", "depth"))
    collector.add(state)
    collector.add(ServerState("o", ollama=True))
    for n in (1, 4):
        extra = f"# TYPE evictions_total counter\nevictions_total {n}\ndepth 2\n"
        scrape(state, vllm_text(generation=n * 100, preemptions=n) + extra, float(n))
    # A mirrored counter and a mirrored gauge at once must not produce two families of one name.
    om = {f.name: f for f in parse_openmetrics(openmetrics_latest(reg).decode())}
    assert om["tokwatch_server_mirrored"].type == "counter"
    assert om["tokwatch_server_mirrored_value"].samples[0].value == 2
    text = {f.name for f in parse_text(generate_latest(reg).decode())}
    assert {"tokwatch_server_mirrored", "tokwatch_server_mirrored_value", "tokwatch_server_up"} <= text
