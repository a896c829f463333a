"""The demo's status page in a real browser (headless Chromium): DOM structure and real screenshots."""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tokwatch.demo import demo_exporter_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "status_screenshot.py"
sys.path.insert(0, str(SCRIPT.parent))
from status_screenshot import find_browser  # noqa: E402

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


def test_demo_page_in_chromium(tmp_path: Path) -> None:
    shot, mobile, dom_file = tmp_path / "desktop.png", tmp_path / "phone.png", tmp_path / "dom.html"
    detail = tmp_path / "endpoint.png"
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
    bands = [a["data-band"] for a in dom.where("div") if a.get("data-band")]
    assert len(bands) == len(expected) and set(bands) <= {"tight", "typical", "jittery", "none"}
    assert all(f"band-{b}" in (a.get("class") or "") for a in dom.where("div") if (b := a.get("data-band")))
    assert dom.where("section", id="comparison"), "the comparison strip is rendered"
    ranked = [a for t, a in dom.found if t == "li" and a.get("data-endpoint")]
    pairs = [a for t, a in dom.found if t == "li" and a.get("class") == "pair"]
    assert len(ranked) >= 2 and len(pairs) == len(ranked) - 1
    assert len([a for t, a in dom.found if t == "svg" and a.get("class") == "spark"]) == len(expected)
    assert dom.where("meta", name="viewport")

    for png, width in ((shot, 1280), (mobile, 390), (detail, 1100)):
        assert_not_blank(png, width)


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
