"""Collectors: exact samples from a fresh registry per test, and promtool's lint on the exposition."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tokwatch.figures.result import RunResult, Status, TimingSource
from tokwatch.metrics.probe import ProbeMetrics, SeriesOptions, probe_result_families
from tokwatch.settings.config import load_config_text

CONFIG = load_config_text(
    """
endpoints:
  - {name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m1, labels: {gpu: '3090'}}
  - {name: b, kind: ollama, base_url: 'http://127.0.0.1:2', model: m2, labels: {site: lab}}
"""
)


def ok_run(endpoint: str = "a", tps: float = 50.0, t: float = 1000.0) -> RunResult:
    return RunResult(
        endpoint=endpoint,
        started_at=t,
        status=Status.OK,
        tokens_per_second=tps,
        source=TimingSource.ENGINE,
        output_tokens=256,
        ttft_s=0.2,
        tpot_s=0.02,
        e2e_s=5.3,
        duration_s=5.31,
        itl_s=[0.02, 0.0, 0.03],
        streamed=True,
    )


@pytest.fixture
def registry() -> tuple[CollectorRegistry, ProbeMetrics]:
    reg = CollectorRegistry(auto_describe=False)
    pm = ProbeMetrics()
    pm.set_endpoints(CONFIG.endpoints)
    reg.register(pm)
    return reg, pm


def test_runs_counter_and_last_ok(registry: tuple[CollectorRegistry, ProbeMetrics]) -> None:
    reg, pm = registry
    pm.record(ok_run(tps=50.0, t=1000.0))
    pm.record(RunResult(endpoint="a", started_at=2000.0, status=Status.TIMEOUT, error_class="read_timeout"))
    labels = {"endpoint": "a", "gpu": "3090", "site": "", "workload": "seed000"}
    assert reg.get_sample_value("tokwatch_probe_runs_total", {**labels, "status": "ok"}) == 1
    assert reg.get_sample_value("tokwatch_probe_runs_total", {**labels, "status": "timeout"}) == 1
    # a status has a series from its first run on: no zeros for the statuses never seen
    assert reg.get_sample_value("tokwatch_probe_runs_total", {**labels, "status": "degraded"}) is None
    assert reg.get_sample_value("tokwatch_probe_success", labels) == 0
    assert reg.get_sample_value("tokwatch_probe_status", {**labels, "status": "timeout"}) == 1
    assert reg.get_sample_value("tokwatch_probe_status", {**labels, "status": "ok"}) == 0
    assert reg.get_sample_value("tokwatch_probe_status", {**labels, "status": "degraded"}) is None
    # the headline number stays on the last ok run during an incident (seed 000)
    assert (
        reg.get_sample_value("tokwatch_probe_decode_tokens_per_second", {**labels, "source": "engine"})
        == 50.0
    )
    assert reg.get_sample_value("tokwatch_probe_last_ok_timestamp_seconds", labels) == 1000.0
    assert reg.get_sample_value("tokwatch_probe_last_run_timestamp_seconds", labels) == 2000.0


def test_histograms_are_opt_in(registry: tuple[CollectorRegistry, ProbeMetrics]) -> None:
    reg, pm = registry
    pm.record(ok_run())
    labels = {"endpoint": "a", "gpu": "3090", "site": "", "workload": "seed000"}
    assert reg.get_sample_value("tokwatch_ttft_seconds_count", labels) is None
    assert reg.get_sample_value("tokwatch_probe_ttft_seconds", labels) == 0.2  # the run's own figure


def test_histograms_observe_tokens_and_skip_failed_runs(
    registry: tuple[CollectorRegistry, ProbeMetrics],
) -> None:
    reg, pm = registry
    pm.set_endpoints(CONFIG.endpoints, options=SeriesOptions(histograms=True))
    pm.record(ok_run())
    pm.record(RunResult(endpoint="a", started_at=1.0, status=Status.PROVIDER_ERROR, ttft_s=0.1))
    labels = {"endpoint": "a", "gpu": "3090", "site": "", "workload": "seed000"}
    assert reg.get_sample_value("tokwatch_ttft_seconds_count", labels) == 1
    # the OpenTelemetry GenAI boundaries: TTFT from 1 ms, per-token gaps from 10 ms
    assert reg.get_sample_value("tokwatch_ttft_seconds_bucket", {**labels, "le": "0.25"}) == 1
    assert reg.get_sample_value("tokwatch_ttft_seconds_bucket", {**labels, "le": "0.1"}) == 0
    assert reg.get_sample_value("tokwatch_ttft_seconds_bucket", {**labels, "le": "0.001"}) == 0
    assert reg.get_sample_value("tokwatch_inter_token_latency_seconds_count", labels) == 3
    assert reg.get_sample_value("tokwatch_inter_token_latency_seconds_sum", labels) == pytest.approx(0.05)
    assert reg.get_sample_value("tokwatch_inter_token_latency_seconds_bucket", {**labels, "le": "0.01"}) == 1
    assert reg.get_sample_value("tokwatch_inter_token_latency_seconds_bucket", {**labels, "le": "0.025"}) == 2
    assert reg.get_sample_value("tokwatch_time_per_output_token_seconds_bucket", {**labels, "le": "2.5"}) == 1


def test_static_labels_are_unioned(registry: tuple[CollectorRegistry, ProbeMetrics]) -> None:
    reg, _ = registry
    assert (
        reg.get_sample_value(
            "tokwatch_endpoint_info",
            {"endpoint": "b", "gpu": "", "site": "lab", "kind": "ollama", "model": "m2"},
        )
        == 1
    )


def test_reload_drops_removed_endpoints_keeps_others(
    registry: tuple[CollectorRegistry, ProbeMetrics],
) -> None:
    reg, pm = registry
    pm.record(ok_run("a"))
    pm.set_endpoints(CONFIG.endpoints[:1])
    assert (
        reg.get_sample_value(
            "tokwatch_probe_runs_total",
            {"endpoint": "a", "gpu": "3090", "workload": "seed000", "status": "ok"},
        )
        == 1
    )
    assert (
        reg.get_sample_value(
            "tokwatch_endpoint_info", {"endpoint": "b", "gpu": "", "kind": "ollama", "model": "m2"}
        )
        is None
    )


def test_probe_families_for_one_run() -> None:
    reg = CollectorRegistry(auto_describe=False)
    fams = probe_result_families(ok_run(), CONFIG.endpoints[0])

    class C:
        def collect(self):  # type: ignore[no-untyped-def]
            return fams

    reg.register(C())  # type: ignore[arg-type]
    # /probe samples are marked on-demand
    labels = {"endpoint": "a", "gpu": "3090", "workload": "seed000", "trigger": "on_demand"}
    assert reg.get_sample_value("tokwatch_probe_success", labels) == 1
    scheduled = {"endpoint": "a", "gpu": "3090", "workload": "seed000"}
    assert reg.get_sample_value("tokwatch_probe_success", scheduled) is None
    assert (
        reg.get_sample_value("tokwatch_probe_decode_tokens_per_second", {**labels, "source": "engine"}) == 50
    )
    assert reg.get_sample_value("tokwatch_probe_duration_seconds", labels) == 5.31


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_promtool_check_metrics_passes(registry: tuple[CollectorRegistry, ProbeMetrics]) -> None:
    reg, pm = registry
    pm.record(ok_run())
    text = generate_latest(reg)
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
