"""The status page at fleet size, from a real SQLite store: a tile per endpoint with its workloads and sites
as rows (TTFT beside decode, uptime coloured, seed000's prefill marked), the header's separate counts, a
workload's comparison view (sorted, grouped by model, charts) and network vs server time."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.statuspage.test_model import HOUR, NOW, _row
from tests.statuspage.test_render import colour_of, family, tiles
from tokwatch.settings.config import Config, load_config_text
from tokwatch.statuspage import StatusPages
from tokwatch.statuspage.render import UPTIME_FAIR, UPTIME_GOOD, uptime_band
from tokwatch.storage.base import EndpointSpec
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore

CONFIG = """
site: a
probe: {workloads: [seed000, short]}
endpoints:
  - {name: fast, kind: vllm, base_url: 'http://127.0.0.1:1/v1', model: llama-8b}
  - {name: slow, kind: vllm, base_url: 'http://127.0.0.1:2/v1', model: llama-8b}
  - {name: other, kind: openai, base_url: 'http://127.0.0.1:3/v1', model: qwen-7b}
"""
# endpoint -> (decode tok/s, TTFT s) on `short`
SPEED = {"fast": (120.0, 0.30), "slow": (60.0, 0.20), "other": (90.0, 0.50)}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "tw.db")
    await s.ensure_ready()
    try:
        yield s
    finally:
        await s.close()


def _series_rows(ep: str, workload: str, site: str, tps: float, ttft: float, runs: int = 12) -> list[RunRow]:
    return [
        _row(
            ep, NOW - 60 - i * HOUR - (workload == "short") - 2 * (site == "b"),  # unique run ids
            tps=tps + (i % 3), workload=workload, site=site, ttft_s=ttft + 0.01 * (i % 2),
            prefill_tokens_per_second=2000.0 if workload == "short" else 45.0, prompt_tokens=100,
        )
        for i in range(runs)
    ]  # fmt: skip


async def _fleet(store: SQLiteStore) -> tuple[Config, StatusPages]:
    config = load_config_text(CONFIG, "t.yml")
    await store.sync_endpoints([EndpointSpec(e.name) for e in config.endpoints])
    rows: list[RunRow] = []
    for ep, (tps, ttft) in SPEED.items():
        for site, k in (("a", 1.0), ("b", 0.5)):  # site b sees half the speed and twice the TTFT
            rows += _series_rows(ep, "short", site, tps * k, ttft / k)
            rows += _series_rows(ep, "seed000", site, tps * k + 10, 0.05 / k, runs=3)
    await store.write_runs(rows)
    return config, StatusPages(lambda: store, lambda: config, clock=lambda: NOW)


async def test_a_tile_per_endpoint_with_its_series_as_rows(store: SQLiteStore) -> None:
    _, pages = await _fleet(store)
    body = (await pages.overview()).body
    found = tiles(body)
    assert list(found) == ["fast", "slow", "other"]  # one tile per endpoint, not per series (was 12)
    counts = re.search(r'<p class="muted" id="counts">([^<]*) · refreshes', body)
    assert counts is not None and counts.group(1) == "3 endpoints · 2 workloads · 2 sites"
    rows = re.findall(r'<tr class="series" data-endpoint="fast" data-status="ok" data-workload="(\w+)" '
                      r'data-site="(\w+)">(.*?)</tr>', found["fast"], re.S)  # fmt: skip
    assert [(w, s) for w, s, _ in rows] == [
        ("seed000", "a"),
        ("seed000", "b"),
        ("short", "a"),
        ("short", "b"),
    ]
    by = {(w, s): html for w, s, html in rows}
    # TTFT beside decode on every row: p50, and p90 once 10 samples are there (short: 12, seed000: 3)
    ttft = re.compile(r'<td class="num ttft" data-p50="([\d.]+)" data-p90="([\d.]*)">([^<]*)')
    (short_a,) = ttft.findall(by[("short", "a")])
    assert float(short_a[0]) == pytest.approx(0.305) and float(short_a[1]) == pytest.approx(0.31)
    assert short_a[2] == "305" and "<small> · 310</small>" in by[("short", "a")]
    (seed_b,) = ttft.findall(by[("seed000", "b")])
    assert float(seed_b[0]) == pytest.approx(0.1) and seed_b[1] == "" and "(n=3)" in by[("seed000", "b")]
    assert re.search(r'<td class="num decode"><div class="pct" data-p50="121\.000"', by[("short", "a")])
    # seed000's prefill is no prefill measurement: not shown, and why on hover; a sized workload's is
    (seed_prefill,) = re.findall(
        r'<td class="num prefill not-prefill" title="([^"]+)">n/a</td>', by[("seed000", "a")]
    )
    assert seed_prefill.startswith("Not a prefill measurement: seed000") and "Prefill speed" in seed_prefill
    assert "45" not in re.sub(r"<[^>]+>", " ", by[("seed000", "a")]).split("n/a")[0].split()[-1]
    assert '<td class="num prefill">2,000</td>' in by[("short", "a")]
    assert "/compare?workload=short" in body and "/compare?workload=seed000" in body


async def test_uptime_is_coloured_like_the_cv_band(store: SQLiteStore) -> None:
    """Green from 99 %, amber from 95 %, red below (the methodology footnote states the same)."""
    assert (UPTIME_GOOD, UPTIME_FAIR) == (0.99, 0.95)
    assert [uptime_band(u) for u in (1.0, 0.99, 0.989, 0.95, 0.949, None)] == [
        "full", "full", "some", "some", "low", None
    ]  # fmt: skip
    config = Config(endpoints=tuple(load_config_text(CONFIG).endpoints))
    await store.sync_endpoints([EndpointSpec(e.name) for e in config.endpoints])
    rows = [_row("fast", NOW - 60 - i * 600, tps=100.0) for i in range(100)]  # 100 %
    rows += [_row("slow", NOW - 60 - i * 600, tps=100.0, status="ok" if i else "timeout") for i in range(40)]
    rows += [
        _row("other", NOW - 60 - i * 600, tps=100.0, status="ok" if i % 5 else "timeout") for i in range(40)
    ]
    await store.write_runs(rows)
    body = (await StatusPages(lambda: store, lambda: config, clock=lambda: NOW).overview()).body
    found = tiles(body)
    band = re.compile(r'<td class="num uptime ub-(\w+)" data-uptime-band="(\w+)"[^>]*>([\d.]+) %')
    assert band.findall(found["fast"]) == [("full", "full", "100.0")]
    assert band.findall(found["slow"]) == [("some", "some", "97.5")]
    assert band.findall(found["other"]) == [("low", "low", "80.0")]
    assert [family(colour_of(f"ub-{b}")) for b in ("full", "some", "low")] == ["green", "amber", "red"]
    assert colour_of("ub-full") == colour_of("band-tight") and colour_of("ub-low") == colour_of(
        "band-jittery"
    )
    assert "Uptime: ok runs / runs (band: green from 99 %, amber 95 to 99 %, red below)" in body


async def test_the_comparison_sorts_groups_by_model_and_charts(store: SQLiteStore) -> None:
    _, pages = await _fleet(store)
    page = await pages.compare("short")
    assert page.status == 200
    body = page.body
    table = re.search(r'<table id="compare" data-sort="decode" data-site="a" data-order="desc">(.*?)</table>',
                      body, re.S)  # fmt: skip
    assert table is not None
    groups = re.findall(r'<tr class="model"><th colspan="11">([^<]+)</th></tr>', table.group(1))
    assert groups == ["llama-8b", "qwen-7b"]  # grouped by model, sites as columns (2 x 5 + endpoint)
    order = re.findall(r'<tr data-endpoint="([^"]+)" data-model="([^"]+)">', table.group(1))
    assert order == [
        ("fast", "llama-8b"),
        ("slow", "llama-8b"),
        ("other", "qwen-7b"),
    ]  # decode, fastest first
    assert '<th colspan="5" class="site">a</th><th colspan="5" class="site">b</th>' in body
    # site b's column holds site b's figures (half the speed)
    fast = re.search(r'<tr data-endpoint="fast".*?</tr>', table.group(1), re.S)
    assert fast is not None
    decodes = re.findall(r'data-decode="([\d.]+)"', fast.group(0))
    assert [float(d) for d in decodes] == [pytest.approx(121.0), pytest.approx(61.0)]  # 60 + 0..2 at b
    # sorting by TTFT at site a: quickest first; a heading sorted on flips the order
    by_ttft = (await pages.compare("short", "ttft", "a")).body
    assert re.findall(r'<tr data-endpoint="([^"]+)" data-model', by_ttft) == ["slow", "fast", "other"]
    assert (
        'aria-sort="ascending"><a href="/compare?workload=short&amp;sort=ttft&amp;site=a&amp;order=desc"'
        in by_ttft
    )
    flipped = (await pages.compare("short", "ttft", "a", "desc")).body
    assert re.findall(r'<tr data-endpoint="([^"]+)" data-model', flipped) == ["fast", "slow", "other"]
    # the charts: TTFT by prompt size (every workload, a line per endpoint and site), decode vs TTFT
    chart = re.search(r'<svg class="chart cmp" id="ttft-by-prompt".*?</svg>', body, re.S)
    assert chart is not None and chart.group(0).count("<path ") == 6
    assert "seed000" in chart.group(0) and "short (100)" in chart.group(0)
    scatter = re.search(r'<svg class="chart cmp" id="decode-vs-ttft".*?</svg>', body, re.S)
    assert scatter is not None and scatter.group(0).count('class="pt"') == 6
    assert "<script" not in body and "http://" not in body  # server-rendered, no external assets
    # seed000's comparison marks its prefill column, an unknown workload is a 404
    seed = (await pages.compare("seed000")).body
    assert seed.count('class="num not-prefill"') == 6
    assert (await pages.compare("nope")).status == 404
    assert (await pages.compare(None)).body.count('data-workload="seed000"') >= 1  # the first workload


async def test_the_endpoint_page_splits_network_and_server_time(store: SQLiteStore) -> None:
    config = load_config_text(CONFIG, "t.yml")
    await store.sync_endpoints([EndpointSpec(e.name) for e in config.endpoints])
    net = {"phase_resolve_s": 0.002, "phase_connect_s": 0.020, "phase_tls_s": 0.030,
           "phase_processing_s": 0.25, "network_rtt_s": 0.020, "connection_reused": False}  # fmt: skip
    kept = {"phase_processing_s": 0.25, "connection_reused": True}  # a kept connection: no set-up, no rtt
    rows = [
        _row("fast", NOW - 60 - i * HOUR, ttft_s=0.3, site="a", **(net if i % 2 else kept)) for i in range(6)
    ]
    rows.append(_row("fast", NOW - 30, ttft_s=0.9, site="a", cache_assisted=True, **net))  # left out
    await store.write_runs(rows)
    page = await StatusPages(lambda: store, lambda: config, clock=lambda: NOW).endpoint("fast")
    section = re.search(r'<section id="network" data-runs="(\d+)" data-measured="(\d+)">(.*?)</section>',
                        page.body, re.S)  # fmt: skip
    assert section is not None and section.group(1, 2) == ("6", "3")
    cells = dict(
        re.findall(
            r'<tr data-phase="([^"]+)"><td>(?:<span class="sw"[^>]*></span>)?[^<]+</td>'
            r'<td class="num">([^<]+)</td>',
            section.group(3),
        )
    )
    assert cells == {
        "DNS resolve": "2.0", "TCP connect": "20.0", "TLS handshake": "30.0", "Network round trip": "20.0",
        "Server time": "280.0", "TTFT of the same runs": "300.0", "TTFT, every run": "300.0",
        "Processing": "250.0",
    }  # fmt: skip
    assert "Network share of TTFT: 7 %" in section.group(3) and '<svg class="chart netbar"' in section.group(
        3
    )
