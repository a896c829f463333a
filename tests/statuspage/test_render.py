"""What the status page says and how it colours it, from a real SQLite store through `StatusPages`: the
seven status pills, the CV bands at their thresholds, the methodology footnote."""

from __future__ import annotations

import colorsys
import html
import re
import statistics
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path

import pytest

from tests.statuspage.test_model import HOUR, NOW, _ep, _row
from tests.statuspage.test_pages import Dom
from tokwatch.settings.config import Config, load_config_text
from tokwatch.statuspage import StatusPages
from tokwatch.storage.base import EndpointSpec
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore

# The statuses and their labels as issue 11 and docs/methodology.md name them, with the colour family each
# pill is drawn in (red for failures of the endpoint, amber for answers that are limited or degraded).
PILLS = {
    "ok": ("OK", "green"),
    "timeout": ("TIMEOUT", "red"),
    "rate_limited": ("RATE LIMITED", "amber"),
    "provider_error": ("PROVIDER ERROR", "red"),
    "auth_failure": ("AUTH FAILURE", "purple"),
    "unreachable": ("UNREACHABLE", "red"),
    "degraded": ("DEGRADED", "amber"),
}


def _css() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The light-mode custom properties and rules of style.css (selector -> declarations)."""
    css = (resources.files("tokwatch.statuspage") / "style.css").read_text()
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    css = re.sub(r"@media[^{]*\{(?:[^{}]*\{[^{}]*\})*[^{}]*\}", "", css)  # dark mode etc. left out
    rules: dict[str, dict[str, str]] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        decls = dict(
            (k.strip(), v.strip()) for k, v in (d.split(":", 1) for d in body.split(";") if ":" in d)
        )
        for sel in selectors.split(","):
            rules.setdefault(sel.strip(), {}).update(decls)
    return rules[":root"], rules


def colour_of(css_class: str, prop: str = "background") -> str:
    """The colour `.css_class` sets, custom properties resolved."""
    root, rules = _css()
    value = rules["." + css_class][prop]
    while (var := re.fullmatch(r"var\((--[\w-]+)\)", value)) is not None:
        value = root[var.group(1)]
    return value


def family(colour: str) -> str:
    """green / amber / red / purple / grey from the hue of a #rrggbb colour."""
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    if max(r, g, b) - min(r, g, b) < 0.1:  # chroma: how far from a grey
        return "grey"
    deg = colorsys.rgb_to_hls(r, g, b)[0] * 360
    if deg < 15 or deg >= 330:
        return "red"
    if deg < 65:
        return "amber"
    if 85 <= deg < 170:
        return "green"
    if 250 <= deg < 300:
        return "purple"
    return f"hue {deg:.0f}"


def test_colour_families() -> None:
    assert [family(c) for c in ("#1a7f37", "#cf222e", "#b76e00", "#8250df", "#57606a")] == [
        "green", "red", "amber", "purple", "grey"
    ]  # fmt: skip


def tiles(body: str) -> dict[str, str]:
    """Each tile's HTML by endpoint name."""
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r'<article class="tile" data-endpoint="([^"]+)".*?</article>', body, re.S)
    }


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "tw.db")
    await s.ensure_ready()
    try:
        yield s
    finally:
        await s.close()


async def _page(store: SQLiteStore, config: Config, rows: list[RunRow]) -> str:
    await store.sync_endpoints([EndpointSpec(e.name) for e in config.endpoints])
    assert await store.write_runs(rows) == len(rows)
    page = await StatusPages(lambda: store, lambda: config, clock=lambda: NOW).overview()
    assert page.status == 200
    return page.body


async def test_every_status_has_its_pill_label_and_colour(store: SQLiteStore) -> None:
    config = Config(endpoints=(*(_ep(f"ep-{s}") for s in PILLS), _ep("ep-new")))
    rows = [_row(f"ep-{s}", NOW - 2 * HOUR) for s in PILLS]  # an ok run before, so each has a headline
    rows += [_row(f"ep-{s}", NOW - 60, status=s, error_class=None if s == "ok" else s) for s in PILLS]
    body = await _page(store, config, rows)
    found = tiles(body)
    assert len(found) == len(PILLS) + 1
    for status, (label, colour) in PILLS.items():
        tile = found[f"ep-{status}"]
        pills = re.findall(r'<span class="pill ([^"]+)" data-status="([^"]+)">([^<]+)</span>', tile)
        assert pills == [(f"st-{status}", status, label)] * 2, tile  # the tile's and its one row's
        assert family(colour_of(f"st-{status}")) == colour, status
        assert colour_of("pill", "color") == "#fff"  # white text on every pill
        assert 'class="headline"' in tile  # never blank: the earlier ok run stays in the headline
    assert re.findall(r'<span class="pill (st-none)" data-status="none">(NO RUNS)</span>', found["ep-new"])
    assert colour_of("pill", "color") == "#fff"
    assert family(colour_of("st-none")) == "grey"
    # every status the page can label has a colour of its own in the stylesheet
    _, rules = _css()
    assert {f".st-{s}" for s in PILLS} <= set(rules)


def _levels(spread: float, runs: int = 24) -> list[float]:
    return [100.0 + (spread if i % 2 else -spread) for i in range(runs)]


def _alternating(name: str, spread: float) -> list[RunRow]:
    """Hourly ok runs over the last 24 h at 100 ± spread tok/s, alternately."""
    return [_row(name, NOW - 60 - i * HOUR, tps=v) for i, v in enumerate(_levels(spread))]


# spread -> CV of 24 alternating runs = spread * sqrt(24/23) %: each band, and each side of both thresholds
SPREADS = {"tight": 2.0, "tight-edge": 4.8, "typical-low": 5.0, "typical": 10.0, "typical-high": 14.6,
           "jittery-edge": 14.8, "jittery": 25.0}  # fmt: skip


def band_by_the_spec(cv: float) -> str:
    """Issue 11: green < 5 %, amber 5-15 %, red > 15 %."""
    return "tight" if cv < 0.05 else "typical" if cv <= 0.15 else "jittery"


async def test_cv_bands_follow_the_thresholds_with_their_colours(store: SQLiteStore) -> None:
    config = Config(endpoints=(*(_ep(n) for n in SPREADS), _ep("one-run"), _ep("never-ok")))
    rows = [r for name, spread in SPREADS.items() for r in _alternating(name, spread)]
    rows.append(_row("one-run", NOW - 60, tps=80.0))
    rows += [_row("never-ok", NOW - 60 - i * HOUR, status="auth_failure") for i in range(3)]
    body = await _page(store, config, rows)
    found = tiles(body)
    expected_bands = {"tight": "tight", "tight-edge": "tight", "typical-low": "typical",
                      "typical": "typical", "typical-high": "typical", "jittery-edge": "jittery",
                      "jittery": "jittery"}  # fmt: skip
    for name, spread in SPREADS.items():
        values = _levels(spread)
        sd = statistics.stdev(values)
        cv = sd / statistics.mean(values)
        assert band_by_the_spec(cv) == expected_bands[name], (name, cv)  # the fixture spans the bands
        (cell,) = re.findall(r'<td class="num cv band-(\w+)" data-band="(\w+)"[^>]*>(.*?)</td>', found[name])
        assert cell[0] == cell[1] == expected_bands[name], (name, cv, cell)
        assert cell[2] == f"{cv * 100:.1f} %", (name, cell)
        assert f'data-stddev="{sd:.3f}" title="stddev ±{sd:.1f} tok/s">{cell[2]}</td>' in found[name]
    for name in ("one-run", "never-ok"):  # no CV below two ok runs: neutral, and said why
        (cell,) = re.findall(r'<td class="num cv band-(\w+)" data-band="(\w+)"[^>]*>(.*?)</td>', found[name])
        assert cell[:2] == ("none", "none") and cell[2] == "—"
        assert 'data-band="none" title="from 2 ok runs">' in found[name]
    assert "no ok run yet" in found["never-ok"] and "no ok run yet" not in found["one-run"]
    colours = {band: family(colour_of(f"band-{band}")) for band in ("tight", "typical", "jittery")}
    assert colours == {"tight": "green", "typical": "amber", "jittery": "red"}
    assert family(colour_of("band-none")) == "grey"


PROMPT = 'Say "hi" & <stop>'


async def test_methodology_footnote_names_prompt_max_tokens_schedule_and_sources(store: SQLiteStore) -> None:
    custom = load_config_text(
        f"""
probe:
  prompt: '{PROMPT}'
  max_tokens: 96
  warmup: false
  timing_preference: [server_wall, client_stream]
schedule: {{interval: 15m, offset: 5m, window_includes: [on_demand]}}
endpoints: [{{name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m}}]
""",
        "t.yml",
    )
    default = Config(endpoints=(_ep("a"),))
    for config, want in (
        (custom, [
            "<q>" + html.escape(PROMPT) + "</q>",
            "max_tokens 96",
            "Every 15m (offset 5m)",
            "one timed run (no warm-up)",
            "in this order: server_wall → client_stream.",
            "on_demand (schedule.window_includes)",
        ]),
        (default, [
            "<q>Explain theory of relativity simply</q>",
            "max_tokens 256",
            "Every 1h (offset 30m)",
            "one warm-up run (discarded), then one timed run",
            "in this order: engine → vllm_metrics → server_wall → client_stream → client_wall.",
            "neither (schedule.window_includes)",
        ]),
    ):  # fmt: skip
        pages = StatusPages(lambda: store, lambda c=config: c, clock=lambda: NOW)  # type: ignore[misc]
        for page in (await pages.overview(), await pages.endpoint("a")):
            (footer,) = re.findall(r'<footer class="method">(.*?)</footer>', page.body, re.S)
            assert all(w in footer for w in want), [w for w in want if w not in footer]
            # the thresholds the bands use are the ones it states
            assert "green below 5 %, amber 5 to 15 %, red above" in footer
            assert Dom(page.body).having("footer", "class")


async def test_tile_shows_the_p50_with_the_p90_as_a_whisker_from_its_minimum(store: SQLiteStore) -> None:
    config = Config(endpoints=(_ep("many"), _ep("few"), _ep("never-ok")))
    rows = _alternating("many", 10.0)  # 24 runs at 90 and 110 tok/s
    rows += [_row("few", NOW - 60 - i * HOUR, tps=80.0 + i) for i in range(3)]
    rows.append(_row("never-ok", NOW - 60, status="timeout"))
    found = tiles(await _page(store, config, rows))
    values = sorted(_levels(10.0))
    pct = re.compile(r'<div class="pct" data-p50="([\d.]+)" data-p90="([\d.]*)" data-n="(\d+)">(.*?)</div>')
    (many,) = pct.findall(found["many"])
    assert float(many[0]) == pytest.approx(statistics.median(values))
    assert float(many[1]) == pytest.approx(110.0)  # linear p90 of 12 x 90 and 12 x 110
    assert many[2] == "24" and "<small> · 110.0</small>" in many[3]
    assert '<svg class="whisker"' in many[3] and 'class="wh"' in many[3]
    (few,) = pct.findall(found["few"])
    assert float(few[0]) == pytest.approx(81.0) and few[1] == ""  # 3 runs: no p90, and why
    assert 'title="p90 from 10 runs"> (n=3)' in few[3] and 'class="wh"' not in few[3]
    assert 'class="pct"' not in found["never-ok"]


async def test_endpoint_page_has_a_percentile_table_per_workload(store: SQLiteStore) -> None:
    config = load_config_text(
        "schedule: {windows: [30m, 72h]}\n"
        "endpoints:\n"
        "  - {name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m,\n"
        "     workloads: [seed000, {name: big, input_tokens: 2000, output_tokens: 100}]}\n",
        "t.yml",
    )
    await store.sync_endpoints([EndpointSpec("a")])
    rows = [_row("a", NOW - 60 - i * HOUR, tps=100.0 + i, ttft_s=0.2) for i in range(12)]
    rows += [
        _row("a", NOW - 120 - i * HOUR, tps=30.0, workload="big", prefill_tokens_per_second=2000.0)
        for i in range(2)
    ]
    await store.write_runs(rows)
    page = await StatusPages(lambda: store, lambda: config, clock=lambda: NOW).endpoint("a")
    assert page.status == 200
    table = re.compile(r'<table class="pct" data-workload="(\w+)" data-site="">(.*?)</table>', re.S)
    tables = dict(table.findall(page.body))
    assert set(tables) == {"seed000", "big"}
    windows = re.findall(r'<tr data-window="(\w+)">', tables["seed000"])
    assert windows == ["30m", "24h", "72h"]  # 30 min holds one run; every configured window with runs
    row_24h = re.search(r'<tr data-window="24h">(.*?)</tr>', tables["seed000"], re.S)
    assert row_24h is not None
    cells = re.findall(r'<td class="num[^"]*">([^<]*)</td>', row_24h.group(1))
    # uptime, runs, decode p50/p90/p99/n, (seed000: prefill n/a, not measured), TTFT p50/p90/p99/n
    assert cells[:2] == ["100.0 %", "12"]
    assert cells[2:6] == ["105.5", "109.9", "—", "12"]
    assert cells[6:10] == ["200", "200", "—", "12"]
    not_prefill = r'<td colspan="4" class="num not-prefill" title="Not a prefill measurement[^"]*">n/a</td>'
    assert re.search(not_prefill, row_24h.group(1))
    big = re.search(r'<tr data-window="24h">(.*?)</tr>', tables["big"], re.S)
    assert big is not None and "2,000" in big.group(1)
    assert "p90 from 10" in page.body
