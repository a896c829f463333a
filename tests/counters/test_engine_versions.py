"""Each engine version's /metrics (tests/data, origins in its README and each file's header) replayed through
the counter adapters into the `tokwatch_server_*` families: every figure a server panel or a server alert
reads is there when that engine version has it, and absent (not zero, not stale) when it does not.

Two scrapes per fixture: the file as it is, then the same text with every counter, histogram count and sum
advanced as one busy interval would (tokens +500, requests and buckets +10, seconds +2), so the rates the
panels draw have an interval to be taken over.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from dashboards import generate
from dashboards.lint import iter_panels, metric_names_in_promql
from tokwatch.counters.adapters import read_counters
from tokwatch.counters.collector import ServerCollector
from tokwatch.counters.parse import parse_metrics
from tokwatch.counters.state import ServerState

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"

# Figures that depend on the exporter's configuration or on Ollama, not on what the engine exports.
NOT_ENGINE_FIGURES = {
    "tokwatch_server_mirrored_total",  # mirror_metrics
    "tokwatch_server_mirrored_value",
    "tokwatch_server_model_reloads_total",  # Ollama's /api/ps
    "tokwatch_server_model_vram_ratio",
}
EVERY_FIGURE = {
    "tokwatch_server_up",
    "tokwatch_server_scrape_errors_total",
    "tokwatch_server_scrape_duration_seconds",
    "tokwatch_server_decode_tokens_per_second",
    "tokwatch_server_prefill_tokens_per_second",
    "tokwatch_server_requests_running",
    "tokwatch_server_requests_waiting",
    "tokwatch_server_kv_cache_usage_ratio",
    "tokwatch_server_prefix_cache_hit_ratio",
    "tokwatch_server_preemptions_total",
}
PREFIX = "tokwatch_server_prefix_cache_hit_ratio"
KV = "tokwatch_server_kv_cache_usage_ratio"
PREEMPTIONS = "tokwatch_server_preemptions_total"

# fixture -> (adapter the endpoint kind names, figures that engine version does not have)
ENGINES = {
    "vllm_v0_0.6_metrics.txt": ("vllm", set()),  # prefix ratio from its gpu_prefix_cache_hit_rate gauge
    "vllm_metrics.txt": ("vllm", set()),  # V1 0.11, a real capture
    "vllm_v1_0.13_metrics.txt": ("vllm", set()),
    "sglang_colon_metrics.txt": ("sglang", set()),
    "sglang_underscore_metrics.txt": ("sglang", set()),
    # llama.cpp has no preemption counter; the older format no cached-prompt counter, the current one no
    # KV-cache gauge (ggml-org/llama.cpp#13660 removed it).
    "llamacpp_metrics_kv_gauges.txt": ("llamacpp", {PREFIX, PREEMPTIONS}),
    "llamacpp_metrics_legacy.txt": ("llamacpp", {PREFIX, PREEMPTIONS, KV}),
    "llamacpp_metrics_after.txt": ("llamacpp", {PREEMPTIONS, KV}),
}

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)\s*$")


def advanced(text: str) -> str:
    """The scrape one busy interval later: counters, histogram buckets, counts and sums advanced."""
    lines = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if line.startswith("#") or match is None or match[1].endswith("_created"):
            lines.append(line)
            continue
        name, labels, value = match[1], match[2] or "", float(match[3])
        if name.endswith(("_bucket", "_count")):
            value += 10
        elif name.endswith(("_sum", "_total")):
            value += 2.0 if "seconds" in name else 500 if "token" in name else 10
        lines.append(f"{name}{labels} {value}")
    return "\n".join(lines) + "\n"


def server_figures_read() -> set[str]:
    """The tokwatch_server_* families the server dashboard's panels and the server alerts query."""
    model = yaml.safe_load((generate.JSON_DIR / "tokwatch-server.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in iter_panels(model) for t in p.get("targets", []) if t.get("expr")]
    rules = yaml.safe_load(
        (ROOT / "prometheus" / "rules" / "tokwatch-alerts.yml").read_text(encoding="utf-8")
    )
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    names = {n for e in exprs for n in metric_names_in_promql(e)}
    return {n for n in names if n.startswith("tokwatch_server_")}


def test_every_server_figure_a_panel_or_alert_reads_is_covered() -> None:
    assert server_figures_read() == EVERY_FIGURE | NOT_ENGINE_FIGURES


def test_each_fixture_names_its_origin() -> None:
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    for name in ENGINES:
        text = (DATA / name).read_text(encoding="utf-8")
        assert name in readme, f"{name} has no row in tests/data/README.md"
        if not text.startswith("# HELP"):  # a constructed fixture says what it was built from
            assert text.startswith("# Constructed fixture (not a capture)"), name


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_engine_version_feeds_every_figure_it_has(name: str) -> None:
    adapter, missing = ENGINES[name]
    text = (DATA / name).read_text(encoding="utf-8")
    state = ServerState("ep", {"site": "a"})
    registry = CollectorRegistry()
    collector = ServerCollector()
    registry.register(collector)
    collector.add(state)
    for at, body in ((0.0, text), (15.0, advanced(text))):
        snap = parse_metrics(body)
        reading = read_counters(snap, adapter, "m")
        assert reading is not None and reading.problem is None, name
        state.record(reading, snap, at, 0.05)
    present = {
        sample.name
        for family in registry.collect()
        for sample in family.samples
        if sample.labels.get("endpoint") == "ep"
    }
    assert present & EVERY_FIGURE == EVERY_FIGURE - missing, name
    get = registry.get_sample_value
    labels = {"endpoint": "ep", "site": "a"}
    assert (get("tokwatch_server_decode_tokens_per_second", labels) or 0) > 0
    assert (get("tokwatch_server_prefill_tokens_per_second", labels) or 0) > 0
    assert get("tokwatch_server_up", labels) == 1
    if PREEMPTIONS not in missing:
        assert (get(PREEMPTIONS, labels) or 0) > 0  # what TokwatchServerPreemptions alerts on


def test_sglang_underscore_names_read_as_the_colon_ones() -> None:
    """A current SGLang (`sglang_*`) gives the same reading as the same figures under `sglang:*`."""
    colon = read_counters(parse_metrics((DATA / "sglang_colon_metrics.txt").read_text()), None, "m")
    under = read_counters(parse_metrics((DATA / "sglang_underscore_metrics.txt").read_text()), None, "m")
    assert colon is not None and under is not None
    fields = ("basis", "generation_tokens", "prompt_tokens", "decode_tokens", "decode_seconds", "prefix_hits")
    fields += ("prefix_queries", "running", "waiting", "kv_cache_usage", "prefix_hit_ratio", "preemptions")
    assert [getattr(under, f) for f in fields] == [getattr(colon, f) for f in fields]
    assert under.server == "sglang" and under.kv_cache_usage == pytest.approx(0.28)
