"""One answer everywhere: `tokwatch report`, the /metrics window gauges and the status page, on one store.

The store holds scheduled and on-demand runs, runs whose client tok/s a client stall set aside, and one
endpoint whose every run had client figures set aside while its tok/s came from the server or the client (a
busy host); under each `schedule.window_includes` the three surfaces, read as a user reads them (the report
command's JSON, /metrics and / over HTTP), give the same window figures and set-aside counts, and the
expected ones.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import tokwatch
from tests.support.stores import Database
from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.settings.config import load_config
from tokwatch.storage.rows import RunRow


@dataclass(frozen=True)
class Figures:
    runs: int
    ok_runs: int | None  # the report does not print ok runs
    median: float | None
    stddev: float | None
    uptime: float | None
    disturbed: int = 0  # runs with client-timed figures set aside
    tps_set_aside: int = 0  # of them, ok runs whose tok/s is no sample


def _rows(now: float) -> list[RunRow]:
    def run(ep: str, minutes: float, status: str = "ok", tps: float | None = None, **kw: object) -> RunRow:
        fields: dict[str, object] = {"timing_source": "engine" if tps is not None else None, **kw}
        return RunRow(
            run_id=f"{ep}-{minutes}",
            time=now - minutes * 60,
            endpoint=ep,
            status=status,
            tokens_per_second=tps,
            **fields,  # type: ignore[arg-type]
        )

    # A client stall bounded the run's client tok/s (and TTFT) above the tolerance: set aside.
    client = {
        "timing_disturbed": True,
        "max_stall_s": 0.02,
        "tps_set_aside": True,
        "set_aside": "tokens_per_second,ttft",
        "timing_source": "client_stream",
    }
    # Only its TTFT was set aside: its tok/s came from the server, which no client stall moves.
    server = {"timing_disturbed": True, "max_stall_s": 0.02, "tps_set_aside": False, "set_aside": "ttft"}
    return [
        run("mixed", 60, tps=40.0),
        run("mixed", 120, tps=42.0),
        run("mixed", 180, "timeout"),
        run("mixed", 240, tps=45.0, **client),
        run("mixed", 300, tps=47.0, **client),
        run("mixed", 360, **server),  # ok, but no tok/s at all
        run("mixed", 30, tps=90.0, triggered_by="on_demand"),
        run("mixed", 35, tps=95.0, triggered_by="on_demand", **client),
        run("busy-host", 60, tps=45.0, **server),
        run("busy-host", 120, tps=46.0, **server),
        run("busy-host", 180, tps=900.0, **client),
        run("busy-host", 240, tps=910.0, **client),
    ]


BUSY_ALL = [45.0, 46.0, 900.0, 910.0]
# What each surface must say, worked out by hand from the rows above: every run counts in runs and uptime
# unless it is on demand; a set-aside tok/s is a sample only when `window_includes` names timing_disturbed.
EXPECTED: dict[tuple[str, ...], dict[str, Figures | None]] = {
    (): {
        "mixed": Figures(6, 5, 41.0, 2**0.5, 5 / 6, 3, 2),
        "busy-host": Figures(4, 4, 45.5, 0.5**0.5, 1.0, 4, 2),
    },
    ("timing_disturbed",): {
        "mixed": Figures(6, 5, 43.5, 3.1091263510296048, 5 / 6, 3, 0),
        "busy-host": Figures(4, 4, 473.0, statistics.stdev(BUSY_ALL), 1.0, 4, 0),
    },
    ("on_demand", "timing_disturbed"): {
        "mixed": Figures(8, 7, 46.0, 25.46697207495753, 7 / 8, 4, 0),
        "busy-host": Figures(4, 4, 473.0, statistics.stdev(BUSY_ALL), 1.0, 4, 0),
    },
}


def _config(path: Path, storage: str, includes: tuple[str, ...]) -> None:
    path.write_text(f"""
storage: {storage}
schedule: {{interval: 1h, run_on_start: false, window_includes: [{", ".join(includes)}]}}
metrics: {{diagnostics: true}}  # the window's run breakdown, compared here
endpoints:
  - {{name: mixed, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m}}
  - {{name: busy-host, kind: openai, base_url: 'http://127.0.0.1:2/v1', model: m}}
""")


@pytest.fixture
async def storage(database: Database, tmp_path: Path) -> str:
    """The `storage:` setting of a store of each backend already holding the rows."""
    store = await database.open()
    try:
        await store.migrate()
        await store.write_runs(_rows(time.time()))
    finally:
        await store.close()
    where = "sqlite_path" if database.backend == "sqlite" else "dsn"
    return f"{{{where}: '{database.where}', outbox_path: '{tmp_path}/outbox.jsonl'}}"


def _from_report(config: Path) -> dict[str, Figures | None]:
    env = {**os.environ, "PYTHONPATH": str(Path(tokwatch.__file__).parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "tokwatch", "report", "-c", str(config), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Figures | None] = {}
    for e in json.loads(proc.stdout)["endpoints"]:
        figures = Figures(
            e["runs_24h"],
            None,
            e["median_24h"],
            e["stddev_24h"],
            e["uptime_24h"],
            e["set_aside_24h"],
            e["tps_set_aside_24h"],
        )
        out[e["endpoint"]] = figures if e["runs_24h"] else None
    return out


def _from_metrics(text: str) -> dict[str, Figures | None]:
    values: dict[str, dict[str, float]] = {}
    windows = set()
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("tokwatch_window_"):
            for s in fam.samples:
                windows.add(s.labels["window"])
                if s.labels["window"] == "24h" and "percentile" not in s.labels:  # the report's window
                    values.setdefault(s.labels["endpoint"], {})[s.name] = s.value
    assert windows <= {"30m", "24h", "72h", "7d"} and "24h" in windows  # schedule.windows' defaults
    return {
        name: Figures(
            int(v["tokwatch_window_runs"]),
            int(v["tokwatch_window_ok_runs"]),
            v.get("tokwatch_window_decode_tokens_per_second_median"),
            v.get("tokwatch_window_decode_tokens_per_second_stddev"),
            v.get("tokwatch_window_uptime_ratio"),
            int(v["tokwatch_window_timing_disturbed_runs"]),
            int(v["tokwatch_window_decode_tokens_per_second_set_aside_runs"]),
        )
        for name, v in values.items()
    }


_TILE = re.compile(r'<article class="tile" data-endpoint="([^"]+)".*?</article>', re.S)
# The tile's row (one series per endpoint here): decode p50 (the median), CV with the stddev, uptime.
_MEDIAN = re.compile(r'<td class="num decode">(?:<div class="pct" data-p50="([\d.]+)"|—)')
_CV = re.compile(r'<td class="num cv band-\w+" data-band="\w+"(?: data-stddev="([\d.]+)")?')
_SET_ASIDE = re.compile(r'<p class="set-aside[^"]*" title="[^"]*" data-runs="(\d+)" data-tps="(\d+)">')
_UPTIME = re.compile(
    r'<td class="num uptime ub-\w+" data-uptime-band="\w+"'
    r'(?: title="[^"]*" data-ok="(\d+)" data-runs="(\d+)">([\d.]+) %|>—)</td>'
)


def _from_page(html: str) -> dict[str, Figures | None]:
    """The tile figures as the page prints them (rounded: one decimal)."""
    out: dict[str, Figures | None] = {}
    for m in _TILE.finditer(html):
        tile = m.group(0)
        median, cv, uptime = _MEDIAN.search(tile), _CV.search(tile), _UPTIME.search(tile)
        assert median and cv and uptime, tile
        if uptime.group(3) is None:
            out[m.group(1)] = None
            continue
        set_aside = _SET_ASIDE.search(tile)
        out[m.group(1)] = Figures(
            int(uptime.group(2)),
            int(uptime.group(1)),
            float(median.group(1)) if median.group(1) else None,
            float(cv.group(1)) if cv.group(1) else None,
            float(uptime.group(3)) / 100,
            int(set_aside.group(1)) if set_aside else 0,
            int(set_aside.group(2)) if set_aside else 0,
        )
    return out


def _same(got: dict[str, Figures | None], want: dict[str, Figures | None], *, printed: bool = False) -> None:
    """Equal figures; `printed`: as the page prints them (tok/s to 0.1, uptime to 0.1 %)."""
    assert {n for n, f in got.items() if f is not None} == {n for n, f in want.items() if f is not None}
    tps, ratio = (0.05, 0.0005) if printed else (1e-9, 1e-12)
    for name, w in want.items():
        g = got.get(name)
        if w is None:
            continue
        assert g is not None
        assert g.runs == w.runs, name
        assert g.ok_runs is None or g.ok_runs == w.ok_runs, name
        assert g.median == pytest.approx(w.median, abs=tps), name
        assert g.uptime == pytest.approx(w.uptime, abs=ratio), name
        assert g.stddev == pytest.approx(w.stddev, abs=tps), name
        assert (g.disturbed, g.tps_set_aside) == (w.disturbed, w.tps_set_aside), name


async def test_report_metrics_and_status_page_agree(storage: str, tmp_path: Path) -> None:
    config = tmp_path / "tokwatch.yml"
    _config(config, storage, ())
    app = App(load_config(str(config)), str(config))
    await app.start(schedule=False)
    runner, port = await start_site(app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            for includes, want in EXPECTED.items():
                _config(config, storage, includes)
                ok, message = await app.reload()
                assert ok, message
                await app.refresh_windows()
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    metrics = _from_metrics(await resp.text())
                async with http.get(f"http://127.0.0.1:{port}/") as resp:
                    page = _from_page(await resp.text())
                report = _from_report(config)
                _same(metrics, want)
                _same(report, want)
                _same(page, want, printed=True)
    finally:
        await app.stop()
        await runner.cleanup()
