"""/metrics byte for byte: the exporter's own families for a fixed state, against a file kept in tests/data.

The collectors can be rearranged (split by subject, registered elsewhere) without changing one byte that
Prometheus reads; when a change to the output is intended, regenerate the file with
`TOKWATCH_REGENERATE_GOLDEN=1 python -m pytest tests/metrics/test_exposition_golden.py` and review its diff.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from tokwatch import __version__
from tokwatch.figures.result import RunResult, Status, TimingSource
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text

DATA = Path(__file__).parents[1] / "data"
T0 = 1_700_000_000.0  # fixed start times, inside the 10-year window below whatever today is
# Families whose values belong to this process and this machine, not to tokwatch's state.
_MACHINE = ("process_", "python_")

CONFIG = """
schedule: {interval: 1h, window: 3650d, windows: []}  # the runs are at T0: other windows are empty
storage: {enabled: false}
endpoints:
  - {name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m1, labels: {gpu: '3090'}}
  - {name: b, kind: ollama, base_url: 'http://127.0.0.1:2', model: m2, labels: {site: lab}}
  - {name: c, kind: vllm, base_url: 'http://127.0.0.1:3/v1', model: m3}
"""


def _ok(endpoint: str, t: float, tps: float, **kw: object) -> RunResult:
    fields: dict[str, object] = {
        "source": TimingSource.ENGINE,
        "output_tokens": 64,
        "ttft_s": 0.2,
        "tpot_s": 0.02,
        "e2e_s": 1.5,
        "duration_s": 1.51,
        "itl_s": [0.02, 0.0, 0.03, 0.012],
        "streamed": True,
        "max_stall_s": 0.001,
        "tps_error_ratio": 0.0,
        "ttft_error_s": 0.0,
    }
    fields.update(kw)
    return RunResult(endpoint=endpoint, started_at=t, status=Status.OK, tokens_per_second=tps, **fields)  # type: ignore[arg-type]


def _runs() -> list[RunResult]:
    """Scheduled ok runs on two endpoints, a reasoning run, a disturbed run, an on-demand run, failures."""
    return [
        _ok("a", T0, 100.0),
        _ok("a", T0 + 3600, 104.0),
        _ok("a", T0 + 7200, 96.0, think_tokens=12, ttot_s=0.05, output_itl_s=[0.01, 0.02]),
        _ok(
            "a",
            T0 + 7300,
            900.0,
            source=TimingSource.CLIENT_STREAM,
            timing_disturbed=True,
            max_stall_s=0.2,
            set_aside={"tokens_per_second": "client_stall", "ttft": "client_stall"},
            tps_error_ratio=0.08,
            ttft_error_s=0.2,
        ),
        _ok("b", T0, 50.0),
        _ok("b", T0 + 3600, 60.0),
        _ok("b", T0 + 3700, 999.0, trigger="on_demand"),
        RunResult(
            endpoint="b",
            started_at=T0 + 7200,
            status=Status.TIMEOUT,
            error_class="read_timeout",
            duration_s=30.0,
        ),
        RunResult(
            endpoint="c", started_at=T0, status=Status.DEGRADED, ttft_s=0.5, e2e_s=2.0, output_tokens=3
        ),
    ]


def exposition(app: App) -> str:
    """The app's /metrics body without the process' own families, build versions made neutral."""
    body = app.exposition.render().decode()
    blocks: list[list[str]] = []
    for line in body.splitlines(keepends=True):
        if line.startswith("# HELP ") or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    kept = "".join("".join(b) for b in blocks if not b[0].startswith(tuple(f"# HELP {p}" for p in _MACHINE)))
    return kept.replace(f'python="{platform.python_version()}"', 'python="PYTHON"').replace(
        f'version="{__version__}"', 'version="VERSION"'
    )


# The default series budget, and every opt-in series (`metrics:`, docs/metrics.md "Series budget").
OPTED_IN = "metrics: {histograms: true, diagnostics: true}\n"


@pytest.mark.parametrize(
    ("extra", "golden"),
    [("", "exposition_golden.txt"), (OPTED_IN, "exposition_golden_opted_in.txt")],
    ids=["default", "opted_in"],
)
def test_metrics_output_is_unchanged_for_a_fixed_state(extra: str, golden: str) -> None:
    app = App(load_config_text(extra + CONFIG), instance="golden")
    app.status.reload_success_ts = T0
    app.status.lag_s, app.status.last_round_ts, app.status.next_round_ts = 0.25, T0 + 7200, T0 + 10800
    for run in _runs():
        app.probes.record(run)
    text = exposition(app)
    if os.environ.get("TOKWATCH_REGENERATE_GOLDEN"):
        (DATA / golden).write_text(text)
    assert text == (DATA / golden).read_text()
    assert "tokwatch_window_runs" in text and "tokwatch_fleet_rank" in text  # every subject is in it
