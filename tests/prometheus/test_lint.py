"""The metric-name lint: every metric the shipped rules read exists in tokwatch's real /metrics output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import aiohttp
import pytest

from tests.support.pki import make_pki, server_ssl
from tests.support.tls_front import tls_front

EXPOSITION = """\
# TYPE tokwatch_probe_runs counter
tokwatch_probe_runs_total{endpoint="a",status="ok"} 3
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0"} 1
# TYPE tokwatch_ttft_seconds histogram
tokwatch_ttft_seconds_bucket{endpoint="a",le="+Inf"} 1
tokwatch_ttft_seconds_sum{endpoint="a"} 0.2
tokwatch_ttft_seconds_count{endpoint="a"} 1
"""


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (le, endpoint) (rate(tokwatch_ttft_seconds_bucket{le="+Inf"}[1h]))',
            {"tokwatch_ttft_seconds_bucket"},
        ),
        ("a_total > on(job, instance) group_left() 2 * b_seconds", {"a_total", "b_seconds"}),
        ("increase(vllm:num_preemptions[5m] offset 1h) > 1e3", {"vllm:num_preemptions"}),
        ('{__name__="x_total", job="tokwatch"} unless ignoring(status) y == bool Inf', {"x_total", "y"}),
        ("absent(up{job='tokwatch'}) or vector(1) and sum(z) without (status)", {"up", "z"}),
        ('histogram_quantile(0.99, m{s="a{b}"}[1h:5m])', {"m"}),
    ],
)
def test_metric_names_skip_functions_keywords_labels_and_durations(
    lint: ModuleType, expr: str, names: set[str]
) -> None:
    assert lint.metric_names_in_promql(expr) == names


def _rules(tmp_path: Path, expr: str, annotation: str = "x") -> Path:
    path = tmp_path / "rules.yml"
    path.write_text(
        "groups:\n- name: g\n  rules:\n"
        "  - record: endpoint:tokwatch_probe_runs:rate5m\n"
        "    expr: sum by (endpoint) (rate(tokwatch_probe_runs_total[5m]))\n"
        f"  - alert: A\n    expr: {expr}\n    annotations:\n      description: '{annotation}'\n",
        encoding="utf-8",
    )
    return path


def test_lint_catches_vllm_counter_without_total(lint: ModuleType, tmp_path: Path) -> None:
    rules = _rules(tmp_path, "increase(vllm:num_preemptions[5m]) > 0")
    bad = lint.unknown_uses([rules], EXPOSITION)
    assert [(u.rule, u.metric) for u in bad] == [("A", "vllm:num_preemptions")]


def test_lint_accepts_recorded_names_histogram_series_and_up(lint: ModuleType, tmp_path: Path) -> None:
    expr = "endpoint:tokwatch_probe_runs:rate5m > 0 and on() up == 1 and on() tokwatch_ttft_seconds_count > 0"
    assert lint.unknown_uses([_rules(tmp_path, expr)], EXPOSITION) == []


def test_lint_reads_queries_in_annotation_templates(lint: ModuleType, tmp_path: Path) -> None:
    template = '{{ with printf "tokwatch_probe_run{endpoint=%s}" $labels.endpoint | query }}{{ . }}{{ end }}'
    rules = _rules(tmp_path, "up == 0", template.replace("'", "''"))
    assert [u.metric for u in lint.unknown_uses([rules], EXPOSITION)] == ["tokwatch_probe_run"]


def test_lint_cli_exit_codes(kit: SimpleNamespace, tmp_path: Path) -> None:
    script = str(kit.prom_dir / "lint_metric_names.py")
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(EXPOSITION, encoding="utf-8")
    bad = subprocess.run(
        [
            sys.executable,
            script,
            "--metrics-file",
            str(metrics),
            str(_rules(tmp_path, "vllm:num_preemptions > 0")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1
    assert "A: metric vllm:num_preemptions is not in tokwatch's /metrics output" in bad.stdout
    missing = subprocess.run(
        [sys.executable, script, "--metrics-file", str(tmp_path / "nope.txt"), str(metrics)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert "nope.txt" in missing.stderr
    assert "Traceback" not in missing.stderr


# The cost and energy series the price and energy alerts read (where the exporter has prices and power).
COST_SERIES = ("tokwatch_cost_per_million_tokens{", "tokwatch_energy_joules_per_output_token{")


def _priced_and_powered(st: Any) -> dict[str, object]:
    """Self-hosted prices and the simulator's DCGM series for the `gpu` endpoint (`pricing:`,
    `power_metrics_url`): the cost and energy alerts' series are then exposed. Power is read every 250 ms so
    that idle readings fall between the 2-s probe rounds (the idle baseline)."""
    return {
        "pricing": {"gpu_hour": 2.0, "gpus": 1},
        "power_metrics_url": f"{st.sim_url}/gpu/dcgm/metrics",
        "power_scrape_interval": "250ms",
    }


@pytest.mark.slow
async def test_shipped_rules_only_read_metrics_tokwatch_exposes(
    lint: ModuleType, kit: SimpleNamespace, stack: Any, tmp_path: Path
) -> None:
    """Real output: a simulator with an OpenAI, a vLLM (server counters, a mirrored counter) and an Ollama
    server, the OpenAI one also over HTTPS behind a TLS front (the certificate-expiry gauges), probed every
    2 s by tokwatch with SQLite storage and by tokwatch without storage."""
    st = stack
    pki = make_pki(tmp_path)
    sim = {
        "seed": 3,
        "servers": [
            {"name": "chat", "dialect": "openai", "models": [{"name": "m", "decode_tps": 500}]},
            {
                "name": "gpu",
                "dialect": "vllm",
                "models": [{"name": "m", "decode_tps": 500}],
                "gpu_power": {"gpus": 1, "idle_watts": 60.0, "watts_per_running": 40.0},
            },
            {"name": "ollama", "dialect": "ollama", "models": [{"name": "llama3.2:3b", "decode_tps": 500}]},
        ],
    }
    async with tls_front(server_ssl(pki), st.sim_port) as front_port:
        endpoints = [
            st.endpoint("chat", "chat", "openai", "m"),
            st.endpoint(
                "gpu",
                "gpu",
                "vllm",
                "m",
                scrape_interval="1s",
                mirror_metrics=["vllm:num_preemptions_total"],
                **_priced_and_powered(st),
            ),
            st.endpoint("ollama", "ollama", "ollama", "llama3.2:3b", labels={"site": "lab"}),
            {
                "name": "chat-tls",
                "kind": "openai",
                "base_url": f"https://127.0.0.1:{front_port}/chat/v1",
                "model": "m",
                "tls_config": {"ca_file": str(pki.ca)},
            },
        ]
        await st.start(sim, endpoints)
        # tokwatch with storage refreshes its window figures from the database every 30 s; a second tokwatch
        # without storage computes them in memory after each run, with every opt-in series (the histograms the
        # rules read where they are exported), so both outputs together hold every name.
        memory_port = kit.free_port()
        opt_in = {"histograms": True, "diagnostics": True}
        await st.start_tokwatch(
            "tokwatch-memory", memory_port, endpoints, "2s", storage=False, metrics=opt_in
        )
        wanted = {
            st.tokwatch_url: (
                "tokwatch_server_up{",
                "tokwatch_server_mirrored_total{",
                "tokwatch_storage_up",
                "tokwatch_probe_tls_earliest_cert_expiry_timestamp_seconds{",
            ),
            f"http://127.0.0.1:{memory_port}": (
                "tokwatch_window_decode_tokens_per_second_cv_ratio{",
                *COST_SERIES,
            ),
        }
        async with aiohttp.ClientSession() as session:

            async def complete() -> str:
                texts = [await st.metrics(session, url) for url in wanted]
                done = all(
                    all(w in text for w in names) for text, names in zip(texts, wanted.values(), strict=True)
                )
                return "\n".join(texts) if done else ""

            exposition = str(
                await kit.wait_until(complete, 30, "server counters, storage and window figures")
            )
    bad = lint.unknown_uses(kit.rule_files, exposition)
    assert not bad, "rules read metrics tokwatch does not expose:\n" + "\n".join(
        f"{u.file}: {u.rule}: {u.metric}" for u in bad
    )
