"""docs/metrics.md lists every metric the exporter exposes (the contract is checked against real output)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dashboards.lint import metrics_from_markdown
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.sim.testing import RunningSim

ROOT = Path(__file__).resolve().parents[1]
SIM = """
seed: 9
servers:
  - name: v
    dialect: vllm
    models: [{name: m, decode_tps: 500, prefill_tps: 100000}]
  - name: o
    dialect: ollama
    models: [{name: "q:1b", decode_tps: 500, prefill_tps: 100000}]
"""


@pytest.fixture
async def full_exporter_metrics(sim: RunningSim, tmp_path: Path) -> str:
    """/metrics of an exporter that probed a vLLM and an Ollama endpoint, with storage and counters."""
    cfg = load_config_text(f"""
probe: {{max_tokens: 8}}
storage: {{sqlite_path: '{tmp_path}/tw.db', outbox_path: '{tmp_path}/outbox'}}
endpoints:
  - {{name: vllm, kind: vllm, base_url: '{sim.url}/v/v1', model: m,
      mirror_metrics: [vllm:num_requests_running, vllm:prompt_tokens_total]}}
  - {{name: ollama, kind: ollama, base_url: '{sim.url}/o', model: 'q:1b'}}
""")
    app = App(cfg)
    await app.start(schedule=False)
    try:
        for name in ("vllm", "ollama", "vllm"):
            await app.probe(name)
        await app.refresh_windows()
        for counters in app.watchers.counters.values():
            await counters.scrape_once()
        served = app.exposition.render().decode()
        # /metrics (pre-rendered per endpoint) carries exactly the registry's samples
        assert _samples(served) == _samples(generate_latest(app.exposition).decode())
        return served
    finally:
        await app.stop()


def _samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    # process_*/python_* move between two renders (CPU time, collections): compared by name only.
    moving = ("process_", "python_")
    return {
        (s.name, tuple(sorted(s.labels.items())), 0.0 if s.name.startswith(moving) else s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_exposed_metric_is_documented_and_valid(full_exporter_metrics: str) -> None:
    text = full_exporter_metrics
    documented = metrics_from_markdown(ROOT / "docs" / "metrics.md")
    exposed = {f.name for f in text_string_to_metric_families(text)}
    expected = {"tokwatch_probe_runs", "tokwatch_server_up", "tokwatch_storage_up", "tokwatch_window_runs"}
    assert expected <= exposed
    missing = sorted(n for n in exposed if not (documented.defines(n) or documented.defines(n + "_total")))
    assert not missing, f"exposed but not in docs/metrics.md: {missing}"
    if shutil.which("promtool"):  # installed by scripts/install-test-deps.sh (Debian package prometheus)
        lint = subprocess.run(
            ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
        )
        assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()


def test_readme_figures_follow_the_demo(tmp_path: Path) -> None:
    """The README's demo interval, window label and port are what `tokwatch demo` configures."""
    import re

    from tokwatch.commands.demo import DEFAULT_LISTEN, demo_exporter_config
    from tokwatch.windows.window import window_label

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    config = demo_exporter_config("http://127.0.0.1:1", DEFAULT_LISTEN, tmp_path)
    intervals = {int(n) for n in re.findall(r"(?:probed|probes them) every (\d+) s", readme)}
    assert intervals == {int(config.schedule.interval)}
    windows = set(re.findall(r'tokwatch_window_\w+\{[^}]*window="(\w+)"', readme))
    assert windows == {window_label(config.schedule.window)}
    port = DEFAULT_LISTEN.rsplit(":", 1)[1]
    assert f"http://127.0.0.1:{port}/metrics" in readme and f"http://127.0.0.1:{port}/" in readme
    assert len(config.endpoints) == 5 and "five endpoints" in readme


def test_every_bench_stop_reason_is_documented() -> None:
    """docs/bench.md's `stop_reason` list for summary.json names every reason the bench code can set."""
    import re

    from tokwatch.bench.runner import _IMMEDIATE_STOP

    bench = ROOT / "exporter" / "tokwatch" / "bench"
    code = "\n".join(p.read_text(encoding="utf-8") for p in sorted(bench.glob("*.py")))
    produced = set(re.findall(r'\b_stop\(\s*"(\w+)"', code))  # runner: max_tokens_ignored, failing
    produced |= set(re.findall(r'stop_reason(?:, state\.message)? = "(\w+)"', code))  # client_error, ...
    for rhs in re.findall(r"^\s*reason = (.*)$", code, re.MULTILINE):  # all_failed, interrupted, finished
        produced |= set(re.findall(r'"(\w+)"', rhs))
    produced |= {s.value for s in _IMMEDIATE_STOP}  # unreachable, auth_failure: the status itself
    assert {"finished", "interrupted", "failing", "all_failed", "worker_failed"} <= produced  # parse works
    docs = (ROOT / "docs" / "bench.md").read_text(encoding="utf-8")
    listed = re.search(r"`summary\.json` \| .*?`stop_reason` \(([^)]*)\)", docs)
    assert listed is not None, "the summary.json row no longer lists stop_reason values"
    documented = set(re.findall(r"`(\w+)`", listed.group(1)))
    assert produced == documented, f"undocumented: {produced - documented}, stale: {documented - produced}"
