"""What a user reads about figures set aside for the exporter's own lateness: the status page tile and run
table, and `tokwatch report`, from a real store of each backend holding a busy host's runs."""

from __future__ import annotations

import json

from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.statuspage.model import build_endpoint_page, build_overview
from tokwatch.statuspage.render import render_endpoint, render_overview
from tokwatch.storage.base import RunStore
from tokwatch.storage.report import build_report, render_json, render_table
from tokwatch.storage.rows import RunRow
from tokwatch.windows.window_rule import WindowRule

NOW = 1_790_000_000.0
HOUR = 3600.0
CLIENT = {  # a client tok/s and TTFT a stall could have moved beyond the tolerance
    "timing_disturbed": True,
    "tps_set_aside": True,
    "set_aside": "tokens_per_second,ttft",
    "timing_source": "client_stream",
}


def _ep(name: str) -> EndpointSettings:
    return EndpointSettings(name=name, kind="openai", base_url="http://127.0.0.1:1/v1", model="m")


def _rows() -> list[RunRow]:
    """busy: 24 hourly runs, 2 of them with client timing set aside (one ok, one degraded: a short answer);
    jammed: every ok run's tok/s set aside."""
    rows = [
        RunRow(
            run_id=f"busy-{i}",
            time=NOW - 60 - i * HOUR,
            endpoint="busy",
            status="ok",
            tokens_per_second=50.0,
            timing_source="client_stream",
            tps_set_aside=False,
        )
        for i in range(22)
    ]
    rows.append(RunRow("busy-aside", NOW - 60 - 22 * HOUR, "busy", "ok", tokens_per_second=80.0, **CLIENT))  # type: ignore[arg-type]
    t = NOW - 60 - 23 * HOUR
    rows.append(RunRow("busy-short", t, "busy", "degraded", timing_disturbed=True, set_aside="ttft"))
    rows += [
        RunRow(f"jammed-{i}", NOW - 60 - i * HOUR, "jammed", "ok", tokens_per_second=900.0, **CLIENT)  # type: ignore[arg-type]
        for i in range(3)
    ]
    return rows


async def test_the_status_page_says_how_many_runs_and_why(store: RunStore) -> None:
    config = Config(endpoints=(_ep("busy"), _ep("jammed")))
    await store.write_runs(_rows())
    html = render_overview(await build_overview(store, config, NOW), config)
    assert "2 of 24 runs' client timing set aside: host busy; tok/s of 1 left out of the median" in html
    assert "3 of 3 runs' client timing set aside: host busy; tok/s of 3 left out of the median" in html
    # every run counts in uptime, whatever its client timing; the set-aside tok/s is in no median
    assert 'title="23 of 24 runs ok" data-ok="23" data-runs="24">95.8 %</td>' in html
    assert 'title="3 of 3 runs ok" data-ok="3" data-runs="3">100.0 %</td>' in html
    assert '<span class="tps">50.0</span> tok/s' in html and "80.0" not in html and "900.0" not in html
    assert "tok/s set aside: host busy" in html  # jammed: ok runs, but no tok/s sample at all
    page = render_endpoint(await build_endpoint_page(store, config, _ep("busy"), NOW), config)
    assert "set aside: tokens_per_second, ttft</small>" in page and "set aside: ttft</small>" in page


async def test_the_report_has_a_set_aside_column_and_says_why(store: RunStore) -> None:
    await store.write_runs(_rows())
    report = await build_report(store, NOW, 7 * 86400, rule=WindowRule())
    table = render_table(report)
    head, _, *lines = table.splitlines()
    assert "set aside 24h" in head
    busy = next(line.split() for line in lines if line.startswith("busy"))
    jammed = next(line.split() for line in lines if line.startswith("jammed"))
    assert busy[busy.index("24") + 1 : busy.index("24") + 4] == ["2", "(tok/s", "1)"]  # runs 24h, set aside
    assert "3" in jammed and "(tok/s" in jammed
    assert "set aside: runs whose client timing the exporter's own lateness (a busy host)" in table
    data = {e["endpoint"]: e for e in json.loads(render_json(report))["endpoints"]}
    busy_json = data["busy"]
    assert (busy_json["runs_24h"], busy_json["set_aside_24h"], busy_json["tps_set_aside_24h"]) == (24, 2, 1)
    assert data["busy"]["median_24h"] == 50.0 and data["jammed"]["median_24h"] is None
    assert data["jammed"]["uptime_24h"] == 1.0
    # naming timing_disturbed takes the set-aside tok/s in: the figures are the user's to choose
    both = await build_report(store, NOW, 7 * 86400, rule=WindowRule.of(["timing_disturbed"]))
    assert {e.endpoint: e.median_24h for e in both.endpoints} == {"busy": 50.0, "jammed": 900.0}
    assert all(e.tps_set_aside_24h == 0 for e in both.endpoints)
