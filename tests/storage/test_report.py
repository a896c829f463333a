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
