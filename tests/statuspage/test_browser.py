"""The demo's status page in a real browser (headless Chromium): DOM structure and real screenshots."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tokwatch.commands.demo import demo_exporter_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "status_screenshot.py"
sys.path.insert(0, str(SCRIPT.parent))
from status_screenshot import PHONE, find_browser, measure_layout  # noqa: E402

pytestmark = pytest.mark.skipif(
    find_browser() is None, reason="no Chromium (scripts/install-test-deps.sh installs Debian's chromium)"
)


class Elements(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))

    def where(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [
            a
            for t, a in self.found
            if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


@pytest.mark.slow
def test_demo_page_in_chromium(tmp_path: Path) -> None:
    shot, mobile, dom_file = tmp_path / "desktop.png", tmp_path / "phone.png", tmp_path / "dom.html"
    detail, layout = tmp_path / "endpoint.png", tmp_path / "layout.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(shot),
            "--mobile-out",
            str(mobile),
            "--dom",
            str(dom_file),
            "--endpoint-out",
            str(detail),
            "--layout",
            str(layout),
            "--min-runs",
            "2",
            "--timeout",
            "150",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr

    dom = Elements(dom_file.read_text())
    expected = [e.name for e in demo_exporter_config("http://127.0.0.1:1", "127.0.0.1:0", tmp_path).endpoints]
    tiles = [a for t, a in dom.found if t == "article" and a.get("class") == "tile"]
    assert [a["data-endpoint"] for a in tiles] == expected  # one tile per endpoint, config order
    assert all(a["data-status"] not in (None, "none") for a in tiles)
    rows = [a for t, a in dom.found if t == "tr" and a.get("class") == "series"]
    assert len(rows) >= len(expected) and {a["data-endpoint"] for a in rows} == set(expected)
    bands = [a["data-band"] for a in dom.where("td") if a.get("data-band")]
    assert len(bands) == len(rows) and set(bands) <= {"tight", "typical", "jittery", "none"}
    assert all(f"band-{b}" in (a.get("class") or "") for a in dom.where("td") if (b := a.get("data-band")))
    uptime = [a["data-uptime-band"] for a in dom.where("td") if a.get("data-uptime-band")]
    assert len(uptime) == len(rows) and set(uptime) <= {"full", "some", "low", "none"}
    assert dom.where("section", id="comparison"), "the comparison strip is rendered"
    ranked = [a for t, a in dom.found if t == "li" and a.get("data-endpoint")]
    pairs = [a for t, a in dom.found if t == "li" and a.get("class") == "pair"]
    assert len(ranked) >= 2 and len(pairs) == len(ranked) - 1
    assert len([a for t, a in dom.found if t == "svg" and a.get("class") == "spark"]) == len(expected)
    assert dom.where("meta", name="viewport")

    for png, width in ((shot, 1280), (mobile, 390), (detail, 1100)):
        assert_not_blank(png, width)
    assert_fits_a_phone(json.loads(layout.read_text()), tiles=len(expected))


@pytest.mark.slow
def test_seeded_page_shows_every_state_in_chromium(tmp_path: Path) -> None:
    """The state the docs' screenshots are made from: every CV band, non-ok pills, a tile without an ok
    run, an ongoing incident with its last ok run in the headline, several workloads and sites as rows,
    the comparison view; and it fits a phone."""
    shot, mobile, dom_file = tmp_path / "desktop.png", tmp_path / "phone.png", tmp_path / "dom.html"
    detail, layout, compare = tmp_path / "endpoint.png", tmp_path / "layout.json", tmp_path / "compare.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seeded", "--out", str(shot), "--mobile-out", str(mobile),
         "--dom", str(dom_file), "--endpoint-out", str(detail), "--endpoint", "sglang-a100",
         "--compare-out", str(compare), "--compare", "short", "--layout", str(layout), "--timeout", "60"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = dom_file.read_text()
    dom = Elements(text)
    tiles = {a["data-endpoint"]: a["data-status"] for t, a in dom.found if t == "article"}
    assert tiles == {
        "vllm-h100": "ok", "sglang-a100": "timeout", "ollama-desk": "ok", "cloud-gpt-4o-mini": "ok",
        "staging-mistral": "auth_failure", "llamacpp-pi": "ok",
    }  # fmt: skip
    # a tile per endpoint, its series as rows: two workloads from eu-west, two endpoints from us-east too
    rows = [
        (a["data-endpoint"], a["data-workload"], a["data-site"])
        for a in dom.where("tr")
        if a.get("data-workload")
    ]
    assert len(rows) == 16 and rows[:4] == [
        ("vllm-h100", "seed000", "eu-west"), ("vllm-h100", "seed000", "us-east"),
        ("vllm-h100", "short", "eu-west"), ("vllm-h100", "short", "us-east"),
    ]  # fmt: skip
    assert re.search(r'id="counts">6 endpoints · 2 workloads · 2 sites ·', text)
    bands = [a["data-band"] for a in dom.where("td") if a.get("data-band")]
    assert bands == ["tight"] * 6 + ["typical"] * 2 + ["jittery"] * 4 + ["none"] * 2 + ["tight"] * 2
    uptime = [a["data-uptime-band"] for a in dom.where("td") if a.get("data-uptime-band")]
    assert uptime[:4] == ["full"] * 4 and uptime[12:14] == ["low", "low"]  # staging: 0 %
    assert text.count('class="num prefill not-prefill"') == 8  # seed000's rows: no prefill figure
    assert "TIMEOUT</span>" in text and "AUTH FAILURE</span>" in text and text.count("no ok run yet") == 1
    assert re.search(r"last ok run · server_wall · [45] h ago", text), "the incident keeps its headline"
    assert text.count('class="fail"') >= 4 + 5  # the ongoing timeouts and the failed key, as red ticks
    for png, width in ((shot, 1280), (mobile, 390), (detail, 1100), (compare, 1280)):
        assert_not_blank(png, width)
    measured = json.loads(layout.read_text())
    assert measured[2]["url"].endswith("/compare?workload=short")
    assert_fits_a_phone(measured, tiles=6)


def assert_fits_a_phone(measured: list[dict[str, Any]], tiles: int) -> None:
    """The overview, an endpoint page and a comparison, laid out by Chromium at 390 px: nothing wider than
    the screen (the tables scroll inside their own box), text no smaller than 9 px."""
    overview, endpoint, compare = measured
    assert overview["tiles"] == tiles and endpoint["tiles"] == 0 and compare["tiles"] == 0
    for page in measured:
        assert page["viewport"] == PHONE[0], page
        assert page["scroll_width"] <= PHONE[0] and page["body_scroll_width"] <= PHONE[0], page
        assert page["overflowing"] == [], page
        assert page["min_font_px"] >= 9, page


def test_the_layout_check_sees_an_overflowing_page() -> None:
    """The phone-width measurement is not vacuous: a 600 px box is reported (by element and by scroll
    width), so is a long unbreakable word whose box fits but whose text does not (scroll width), and the
    same 600 px table inside a horizontal scroller is not."""
    browser = find_browser()
    assert browser is not None
    head = '<meta name="viewport" content="width=device-width,initial-scale=1">'
    head += "<style>.scroll{overflow-x:auto}</style>"
    table = '<table style="width:600px"><tr><td>t</td></tr></table>'
    wide, word, scrolled = (
        "data:text/html," + quote(head + body)
        for body in ('<p>ok</p><div style="width:600px">wide</div>', f"<p>{'x' * 120}</p>",
                     f'<div class="scroll">{table}</div>')
    )  # fmt: skip
    (box, long_word, inside) = measure_layout(browser, [wide, word, scrolled])
    assert box["scroll_width"] == 608 and box["overflowing"] == ["div 8..608"], box  # 8 px body margin
    assert long_word["scroll_width"] > PHONE[0], long_word
    assert inside["scroll_width"] <= PHONE[0] and inside["overflowing"] == [], inside


def assert_not_blank(png: Path, width: int) -> None:
    """A real rendering: right width, many colours, a good share of pixels differ from the background."""
    from PIL import Image

    with Image.open(png) as img:
        rgb = img.convert("RGB")
        assert rgb.width == width
        small = rgb.resize((rgb.width // 4, rgb.height // 4))
        raw = small.tobytes()
    pixels = [raw[i : i + 3] for i in range(0, len(raw), 3)]
    background = max(set(pixels), key=pixels.count)
    differing = sum(1 for p in pixels if sum(abs(a - b) for a, b in zip(p, background, strict=True)) > 30)
    assert len(set(pixels)) > 50, f"{png.name}: too few colours for a rendered page"
    assert differing / len(pixels) > 0.05, f"{png.name}: nearly blank"
