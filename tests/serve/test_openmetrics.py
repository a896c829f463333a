"""/metrics in OpenMetrics for a scraper that asks for it (Prometheus does), text 0.0.4 otherwise.

Both formats of a full exporter (probe, window, server-counter, storage and self metrics) over real HTTP:
the text output passes `promtool check metrics`; promtool reads only the text format (an OpenMetrics
counter's `_total` samples are unknown to it), so the OpenMetrics output is validated by prometheus_client's
OpenMetrics parser and, in the e2e test, by a real Prometheus scraping it.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from tokwatch.metrics.exposition import CONTENT_TYPES
from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.sim.testing import RunningSim

# What Prometheus 2.42 (Debian 12's package, the one the e2e tests run) sends.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
SIM = """
seed: 9
servers:
  - {name: v, dialect: vllm, models: [{name: m, decode_tps: 500, prefill_tps: 100000}]}
  - {name: o, dialect: ollama, models: [{name: "q:1b", decode_tps: 500, prefill_tps: 100000}]}
"""
MOVING = ("process_", "python_")  # CPU time and collections move between two scrapes


@dataclass
class Exporter:
    app: App
    url: str


@pytest.fixture
async def exporter(sim: RunningSim, tmp_path: Path) -> AsyncIterator[Exporter]:
    """An exporter that probed a vLLM and an Ollama endpoint, with storage and server counters."""
    cfg = load_config_text(f"""
probe: {{max_tokens: 8}}
schedule: {{interval: 1h, run_on_start: false}}
storage: {{sqlite_path: '{tmp_path}/tw.db', outbox_path: '{tmp_path}/outbox'}}
endpoints:
  - {{name: vllm, kind: vllm, base_url: '{sim.url}/v/v1', model: m}}
  - {{name: ollama, kind: ollama, base_url: '{sim.url}/o', model: 'q:1b'}}
""")
    app = App(cfg)
    await app.start(schedule=False)
    runner, port = await start_site(app, "127.0.0.1", 0)
    try:
        for name in ("vllm", "ollama"):
            await app.probe(name)
        await app.refresh_windows()
        for counters in app.watchers.counters.values():
            await counters.scrape_once()
        yield Exporter(app, f"http://127.0.0.1:{port}")
    finally:
        await app.stop()
        await runner.cleanup()


def _samples(families: object) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), 0.0 if s.name.startswith(MOVING) else s.value)
        for family in families  # type: ignore[attr-defined]
        for s in family.samples
    }


async def _scrape(url: str, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.get(url + "/metrics", headers=headers) as resp,
    ):
        assert resp.status == 200
        return dict(resp.headers), await resp.read()


async def test_openmetrics_when_asked_text_otherwise_both_valid(exporter: Exporter) -> None:
    om_headers, om_raw = await _scrape(exporter.url, {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    assert om_headers["Content-Type"] == CONTENT_TYPES["openmetrics"]
    assert om_headers["Content-Encoding"] == "gzip" and "Accept" in om_headers["Vary"]
    om = gzip.decompress(om_raw).decode()
    assert om.endswith("# EOF\n")
    assert "# TYPE tokwatch_probe_runs counter" in om and "# TYPE tokwatch_probe_runs_total" not in om

    text_headers, text_raw = await _scrape(exporter.url, {"Accept-Encoding": "identity"})
    assert text_headers["Content-Type"] == CONTENT_TYPES["text"] == "text/plain; version=0.0.4; charset=utf-8"
    text = text_raw.decode()
    assert "# EOF" not in text and "# TYPE tokwatch_probe_runs_total counter" in text

    # The OpenMetrics parser is strict (family order, EOF, counter and histogram rules): it raises on any
    # violation. Both formats carry the same samples.
    assert _samples(openmetrics_families(om)) == _samples(text_string_to_metric_families(text))
    if shutil.which("promtool"):  # installed by scripts/install-test-deps.sh (Debian package prometheus)
        lint = await asyncio.to_thread(
            subprocess.run,
            ["promtool", "check", "metrics"],
            input=text_raw,
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.e2e
async def test_a_real_prometheus_scrapes_the_openmetrics_exposition(
    exporter: Exporter, tmp_path: Path
) -> None:
    """Prometheus negotiates OpenMetrics, parses it with its own OpenMetrics parser and names the counter
    family without `_total` in its metadata (as it does for OpenMetrics only)."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus is not installed (Debian package prometheus)")
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    target = exporter.url.removeprefix("http://")
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        f"scrape_configs:\n  - job_name: tokwatch\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    proc = await asyncio.create_subprocess_exec(
        prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            target_state: dict[str, object] = {}
            metadata: dict[str, object] = {}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    async with session.get(f"{api}/targets") as resp:
                        active = (await resp.json())["data"]["activeTargets"]
                    query = {"metric": "tokwatch_probe_runs"}
                    async with session.get(f"{api}/metadata", params=query) as resp:
                        metadata = (await resp.json())["data"]
                except aiohttp.ClientError:
                    active = []
                target_state = active[0] if active else {}
                if target_state.get("health") == "up" and metadata:
                    break
                await asyncio.sleep(0.5)
            assert target_state.get("health") == "up", target_state
            assert target_state.get("lastError") == ""
            assert metadata["tokwatch_probe_runs"][0]["type"] == "counter"  # type: ignore[index]
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 10)
