"""Cost on the status page, in headless Chromium: the comparison's speed vs price chart (decode tok/s
against blended $/Mtok, as the leaderboards plot it) and its cost columns, and the endpoint view's cost
and energy, from stored runs; the pages still fit a phone."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

import pytest

from tests.statuspage.test_browser import Elements
from tests.statuspage.test_pages import serving
from tokwatch.storage.rows import RunRow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from status_screenshot import PHONE, _chromium, find_browser, measure_layout  # noqa: E402

pytestmark = pytest.mark.skipif(find_browser() is None, reason="no Chromium")

CONFIG = """
storage: {{sqlite_path: '{tmp}/tw.db', outbox_path: '{tmp}/outbox.jsonl'}}
schedule: {{interval: 1h, run_on_start: false}}
pricing:
  blend: "3:1"
  models: {{gpt: {{input_per_mtok: 2.0, output_per_mtok: 8.0, cached_input_per_mtok: 0.5}}}}
endpoints:
  - {{name: hosted, kind: openai, base_url: 'http://127.0.0.1:9/v1', model: gpt}}
  - {{name: own, kind: vllm, base_url: 'http://127.0.0.1:9/v1', model: gpt, pricing: {{gpu_hour: 2.0}},
      power_metrics_url: 'http://127.0.0.1:9/metrics'}}
  - {{name: unpriced, kind: openai, base_url: 'http://127.0.0.1:9/v1', model: other}}
"""


def _runs(now: float) -> list[RunRow]:
    rows = []
    for i in range(3):
        t = now - 600 - i * 3600
        common = {"time": t, "status": "ok", "timing_source": "client_stream", "workload": "seed000",
                  "prompt_tokens": 100, "output_tokens": 200, "ttft_s": 0.2}  # fmt: skip
        rows.append(RunRow(run_id=f"h{i}", endpoint="hosted", tokens_per_second=80.0, cached_tokens=50,
                           cost=0.0018, cost_currency="USD", cost_method="list_price",
                           cost_blended_per_mtok=3.5, **common))  # fmt: skip
        rows.append(RunRow(run_id=f"o{i}", endpoint="own", tokens_per_second=140.0, cost=0.0012,
                           cost_currency="USD", cost_method="compute_time", cost_prompt_per_mtok=0.5,
                           cost_generation_per_mtok=4.0, cost_blended_per_mtok=1.375, energy_j=400.0,
                           energy_net_j=60.0, energy_idle_watts=120.0, **common))  # fmt: skip
        rows.append(RunRow(run_id=f"u{i}", endpoint="unpriced", tokens_per_second=60.0, **common))
    return rows


async def test_the_comparison_plots_speed_against_price_with_cost_columns_in_chromium(tmp_path: Path) -> None:
    browser = find_browser()
    assert browser is not None
    async with serving(CONFIG.format(tmp=tmp_path)) as (app, url, _):
        assert app.store is not None
        await app.store.write_runs(_runs(time.time()))
        page = f"{url}/compare?workload=seed000"
        done = await asyncio.to_thread(_chromium, browser, "--dump-dom", page)
        assert done.returncode == 0, done.stderr
        view = f"{url}/endpoints/own"
        endpoint_dom = await asyncio.to_thread(_chromium, browser, "--dump-dom", view)
        assert endpoint_dom.returncode == 0, endpoint_dom.stderr
        measured = await asyncio.to_thread(measure_layout, browser, [page, view])
    # The endpoint view: its prices by compute time and its energy over the last 24 h.
    row = r'<tr data-cost="([a-z-]+)"><th>[^<]*</th><td class="num">([^<]*)</td>'
    shown = dict(re.findall(row, endpoint_dom.stdout))
    assert shown["generation"] == "4.000 USD/Mtok" and shown["blended"] == "1.375 USD/Mtok"
    assert shown["jpt"] == "0.300" and shown["idle"] == "120 W" and shown["joules"] == "400 J"
    assert shown["run-cost"] == "0.001200 USD" and shown["source"] == "config"
    dom = Elements(done.stdout)
    points = {a["data-series"]: (a["data-price"], a["data-decode"]) for t, a in dom.found
              if t == "circle" and a.get("data-series")}  # fmt: skip
    # Hosted at list price: (3 x 2.0 + 8.0) / 4 = 3.5 /Mtok; self-hosted: the newest run's compute-time
    # blend; the endpoint without prices is not plotted.
    assert points == {"hosted": ("3.5", "80"), "own": ("1.375", "140")}
    assert dom.where("svg", id="decode-vs-price")
    cells = {
        key: [a[f"data-{key}"] for a in dom.where("td") if a.get(f"data-{key}") is not None]
        for key in ("blended", "effective", "jpt")
    }
    # Rows grouped by model (gpt: own, then hosted, by decode), the unpriced endpoint's cells empty.
    assert cells["blended"] == ["1.375", "3.5", ""]
    # Hosted effective: half the prompt tokens cached: (3 x (0.5 x 2.0 + 0.5 x 0.5) + 8.0) / 4 = 2.9375.
    assert cells["effective"] == ["", "2.9375", ""]
    assert cells["jpt"] == ["0.3"]  # 60 J above idle over 200 output tokens
    assert "1.375 USD" in done.stdout and "Effective /Mtok" in done.stdout
    for phone in measured:
        assert phone["scroll_width"] <= PHONE[0] and phone["overflowing"] == [], phone
