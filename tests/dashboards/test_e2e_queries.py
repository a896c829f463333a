"""The dashboards' PromQL against a REAL Prometheus scraping a REAL tokwatch that probes the simulator.

No Grafana here, so each panel's query is sent to Prometheus' query API the way Grafana would (variables
substituted) and the test asserts that the panels that should show something return series.
Marker `e2e` (starts prometheus, tokwatch and the simulator as subprocesses on 127.0.0.1).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
import yaml

from dashboards import generate
from dashboards.lint import annotation_expr, iter_panels, metrics_from_exposition, unknown_metrics
from tokwatch.metrics.probe import HISTOGRAMS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(170)]

ROOT = Path(__file__).resolve().parents[2]

# Panels allowed to be empty in this setup: they only show events or servers the setup does not have.
MAY_BE_EMPTY = {
    "tokwatch-server.json": {
        "Scrape errors",  # `> 0`: only buckets with failed scrapes
        "Mirrored counters per bucket",  # no mirror_metrics configured
        "Mirrored gauges",
        "Ollama model reloads",  # no Ollama endpoint
        "Ollama model in VRAM",
        "Preemptions per bucket",  # depends on KV pressure timing
    },
    "tokwatch-health.json": {"Server /metrics scrape errors per bucket"},
    # The latency histograms are off by default (metrics.histograms, docs/metrics.md "Series budget").
    "tokwatch-overview.json": {
        "Inter-token latency p50 / p99",
        "TPOT p50 / p95 / mean",
        "E2E latency p50 / p95 / p99",
        "Inter-token latency distribution",
        "TTOT p50 / p95",
        "Output-phase inter-token latency p50 / p99",
    },
}


def _stack_helpers() -> ModuleType:
    """The simulator + tokwatch process helpers of tests/prometheus (shared rather than copied)."""
    path = ROOT / "tests" / "prometheus" / "conftest.py"
    spec = importlib.util.spec_from_file_location("tokwatch_dashboards_e2e_stack", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


HELPERS = _stack_helpers()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Any]:
    procs = HELPERS.Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


def expand(expr: str) -> str:
    """Grafana variables -> values suited to a test that has run for under a minute."""
    values = {
        "${datasource}": "",
        "$__interval": "15s",
        "$__rate_interval": "15s",
        "$latency_window": "5m",
        "$window": "24h",
        '"$endpoint"': '".*"',
        '"$instance"': '".*"',
        '"$workload"': '"seed000"',
    }
    for key, value in values.items():
        expr = expr.replace(key, value)
    assert "$" not in expr, expr
    return expr


async def _query(session: aiohttp.ClientSession, prom: str, expr: str) -> list[Any]:
    async with session.get(
        f"{prom}/api/v1/query", params={"query": expr}, timeout=aiohttp.ClientTimeout(total=10)
    ) as resp:
        body = await resp.json()
    assert body["status"] == "success", f"{expr}: {body}"
    return list(body["data"]["result"])


async def test_dashboard_panels_show_data(processes: Any, tmp_path: Path) -> None:
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        pytest.skip("prometheus is not installed")
    stack = HELPERS.Stack(processes, tmp_path)
    model = {"name": "m", "decode_tps": 400, "prefill_tps": 20000}
    sim = {
        "seed": 5,
        "servers": [
            {"name": "plain", "dialect": "openai", "models": [model]},
            {
                "name": "reasoner",
                "dialect": "openai",
                "models": [{**model, "think_tokens": 8, "reasoning_format": "reasoning_content"}],
            },
            {"name": "limited", "dialect": "openai", "models": [{**model, "faults": {"http_429": 1.0}}]},
            {
                "name": "busy",
                "dialect": "vllm",
                "kv_capacity_tokens": 512,
                "background_rps": 4,
                "background_prompt_tokens": 64,
                "background_max_tokens": 64,
                "models": [model],
            },
        ],
    }
    await stack.start(
        sim,
        [
            stack.endpoint("plain", "plain", "openai", "m", timeout="5s"),
            stack.endpoint("reasoner", "reasoner", "openai", "m", timeout="5s"),
            stack.endpoint("limited", "limited", "openai", "m", timeout="5s"),
            stack.endpoint("busy", "busy", "vllm", "m", timeout="10s", scrape_interval="1s"),
        ],
        interval="2s",
    )
    prom_port = HELPERS.free_port()
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "tokwatch",
                        "static_configs": [{"targets": [f"127.0.0.1:{stack.tokwatch_port}"]}],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    processes.start(
        "prometheus",
        [
            prometheus_bin,
            f"--config.file={prom_config}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
    )
    prom = f"http://127.0.0.1:{prom_port}"

    dashboards = {
        name: json.loads((generate.JSON_DIR / name).read_text(encoding="utf-8")) for name in MAY_BE_EMPTY
    }
    async with aiohttp.ClientSession() as session:

        async def enough_history() -> bool:
            processes.check_alive()
            if not await HELPERS.http_ok(session, f"{prom}/-/ready"):
                return False
            # Window figures come from the store's cache (refreshed every 30 s) and need a few runs.
            ready = "count(tokwatch_window_runs > 2) >= 4 and count(count_over_time(up[1m]) > 15) > 0"
            return bool(await _query(session, prom, ready))

        await HELPERS.wait_until(enough_history, 100, "Prometheus history and window figures", interval=1.0)

        empty: list[str] = []
        checked = 0
        for name, dash in dashboards.items():
            for panel in iter_panels(dash):
                for target in panel.get("targets", []):
                    if not target.get("expr") or panel["title"] in MAY_BE_EMPTY[name]:
                        continue
                    checked += 1
                    if not await _query(session, prom, expand(target["expr"])):
                        empty.append(f"{name}: {panel['title']!r} {target['refId']}: {target['expr']}")
            for annotation in dash["annotations"]["list"]:
                expr = annotation_expr(annotation)
                if expr and not await _query(session, prom, expand(expr)):
                    empty.append(f"{name}: annotation {annotation['name']!r}")
        assert not empty, "panels without data:\n" + "\n".join(empty)
        assert checked >= 50

        # Every metric the overview and health dashboards query is in the live /metrics output (the server
        # dashboard also covers Ollama and mirrored metrics this setup does not produce), but for the opt-in
        # latency histograms.
        live = metrics_from_exposition(await stack.metrics(session))
        for name in ("tokwatch-overview.json", "tokwatch-health.json"):
            unknown = unknown_metrics(dashboards[name], live)
            assert [u for u in unknown if not any(f"metric '{h}_" in u for h in HISTOGRAMS)] == []

        # The status pill's code for the rate-limited endpoint maps to RATE LIMITED.
        status_panel = next(
            p for p in iter_panels(dashboards["tokwatch-overview.json"]) if p["title"] == "Status"
        )
        series = await _query(session, prom, expand(status_panel["targets"][0]["expr"]))
        codes = {s["metric"]["endpoint"]: s["value"][1] for s in series}
        texts = status_panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
        assert texts[codes["limited"]]["text"] == "RATE LIMITED"
        assert texts[codes["plain"]]["text"] == "OK"
