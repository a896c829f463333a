"""`tokwatch report` content and formats."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tokwatch.storage.report import build_report, render_json, render_markdown, render_table
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore
from tokwatch.windows.window_rule import WindowRule


async def test_report_figures_and_formats(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    now = time.time()
    rows = [
        RunRow(run_id=f"a{i}", time=now - 300 - i * 3600, endpoint="a", status="ok", tokens_per_second=v)
        for i, v in enumerate([100.0, 104.0, 96.0])
    ]
    rows += [
        RunRow(run_id=f"b{i}", time=now - 300 - i * 3600, endpoint="b", status="ok", tokens_per_second=v)
        for i, v in enumerate([50.0, 70.0, 60.0])
    ]
    rows.append(RunRow(run_id="b-last", time=now - 10, endpoint="b", status="timeout"))
    try:
        await store.write_runs(rows)
        report = await build_report(store, now, 7 * 86400, rule=WindowRule())
    finally:
        await store.close()
    by = {r.endpoint: r for r in report.endpoints}
    assert by["a"].last_tokens_per_second == 100.0 and by["a"].last_status == "ok"
    assert by["a"].median_24h == 100.0 and by["a"].cv_band == "tight"
    assert by["b"].last_status == "timeout" and by["b"].last_tokens_per_second == 50.0
    assert by["b"].uptime_24h == 0.75 and by["b"].cv_band == "jittery"
    assert report.comparison is not None and report.comparison.text().startswith("a is 67% faster than b")

    table = render_table(report)
    assert "a is 67% faster than b" in table and "jittery" in table and "75.0%" in table
    md = render_markdown(report)
    assert md.startswith("| endpoint |") and "| b |" in md
    data = json.loads(render_json(report))
    assert data["comparison"]["fastest"] == "a" and round(data["comparison"]["percent_faster"]) == 67
    assert {e["endpoint"] for e in data["endpoints"]} == {"a", "b"}


async def test_report_shows_network_vs_server_time_and_no_column_twice(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    now = time.time()
    opened = {"phase_resolve_s": 0.004, "phase_connect_s": 0.02, "phase_tls_s": 0.03, "network_rtt_s": 0.02}
    rows = [
        RunRow(run_id=f"a{i}", time=now - 300 - i * 3600, endpoint="a", status="ok", tokens_per_second=100.0,
               ttft_s=0.5, workload="short", phase_processing_s=0.45, **(opened if i < 2 else {}))
        for i in range(4)
    ]  # fmt: skip
    try:
        await store.write_runs(rows)
        week = await build_report(store, now, 7 * 86400, rule=WindowRule(), windows_s=(86400.0, 7 * 86400.0))
        two_days = await build_report(store, now, 2 * 86400, rule=WindowRule(), windows_s=(86400.0,))
        day = await build_report(store, now, 86400, rule=WindowRule())
    finally:
        await store.close()
    (a,) = week.endpoints
    assert a.network_24h is not None and (a.network_24h.runs, a.network_24h.measured) == (4, 2)
    assert a.network_24h.server_s == 0.48 and a.network_24h.network_rtt_s == 0.02
    head, _, line = render_table(week).splitlines()[:3]
    assert "network ms 24h" in head and "server ms 24h" in head
    assert "20.0 (dns 4.0, tls 30.0)" in line and "480.0" in line
    # the --since window's median and uptime are a row of the percentile table (7d) or the 24 h columns
    assert "7d median" not in head and "uptime 7d" not in head and head.count("uptime") == 1
    assert "24h median" in render_table(day).splitlines()[0]
    assert render_table(day).splitlines()[0].count("24h median") == 1
    assert "48h median" in render_table(two_days).splitlines()[0]  # not shown elsewhere: kept
    data = json.loads(render_json(week))["endpoints"][0]["network_24h"]
    assert data["server_seconds"] == 0.48 and data["measured_runs"] == 2 and data["tls_seconds"] == 0.03
    assert data["network_share"] == 0.02 / 0.5


async def test_report_shows_cost_and_energy_columns_only_where_runs_were_priced_or_metered(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    now = time.time()
    priced = {"cost_currency": "EUR", "cost_method": "compute_time", "cost_blended_per_mtok": 3.5}
    rows = [
        RunRow(run_id=f"a{i}", time=now - 300 - i * 600, endpoint="a", status="ok", tokens_per_second=100.0,
               output_tokens=100, think_tokens=0, cost=0.002, energy_j=500.0, energy_net_j=net,
               energy_idle_watts=120.0, **priced)
        for i, net in enumerate([40.0, 60.0, 80.0])
    ]  # fmt: skip
    rows.append(RunRow(run_id="b", time=now - 100, endpoint="b", status="ok", tokens_per_second=50.0))
    try:
        await store.write_runs(rows[-1:])
        plain = await build_report(store, now, 86400, rule=WindowRule())
        await store.write_runs(rows[:-1])
        report = await build_report(store, now, 86400, rule=WindowRule())
    finally:
        await store.close()
    assert "probe cost 24h" not in render_table(plain) and plain.endpoints[0].cost_24h is None
    by = {r.endpoint: r for r in report.endpoints}
    cost = by["a"].cost_24h
    assert cost is not None and by["b"].cost_24h is None
    assert cost.runs_cost == 0.006 and cost.currency == "EUR" and cost.blended_per_mtok == 3.5
    assert cost.joules_per_output_token == 0.6 and cost.idle_watts == 120.0  # median of 0.4, 0.6, 0.8
    head, _, line_a, line_b = render_table(report).splitlines()[:4]
    assert " ".join(head.split()[-10:]) == "probe cost 24h $/Mtok blended J/out tok 24h idle W"
    assert "0.0060 EUR" in line_a and "3.500 (compute)" in line_a and "0.600" in line_a
    assert line_b.split()[-4:] == ["-", "-", "-", "-"]
    data = json.loads(render_json(report))["endpoints"]
    assert data[0]["cost_24h"]["joules_per_output_token"] == 0.6 and data[1]["cost_24h"] is None
