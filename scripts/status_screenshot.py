#!/usr/bin/env python3
"""Screenshot the status page of a running `tokwatch demo` in headless Chromium, and save its DOM.

Used by tests/statuspage/test_browser.py and to make docs/img/status-page.png:

    python scripts/status_screenshot.py --out docs/img/status-page.png --min-runs 4

Starts the demo on a free loopback port with a throwaway state directory, waits until every tile has a
status and at least `--min-runs` runs on its sparkline, runs Chromium, then stops the demo.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    """Path of a Chromium-family browser, or None."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def _ready(page: str, min_runs: int) -> bool:
    statuses = re.findall(r'<article class="tile" data-endpoint="[^"]*" data-status="([^"]*)"', page)
    runs = [int(n) for n in re.findall(r'aria-label="(\d+) recent runs', page)]
    return bool(statuses) and "none" not in statuses and len(runs) == len(statuses) and min(runs) >= min_runs


def _chromium(browser: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def main(argv: list[str] | None = None) -> int:
    """Run the demo, wait for data, write the screenshot(s) and DOM; exit 2 when no browser is installed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="PNG of the page at desktop size")
    ap.add_argument("--mobile-out", type=Path, help="PNG of the page at phone size (390 px wide)")
    ap.add_argument("--dom", type=Path, help="write the DOM Chromium built")
    ap.add_argument("--endpoint-out", type=Path, help="PNG of the first endpoint's page")
    ap.add_argument("--min-runs", type=int, default=2, help="runs each sparkline needs first (default 2)")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds to wait for data (default 150)")
    ap.add_argument("--size", default="1280,1500", help="desktop window size W,H")
    args = ap.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print("no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="tokwatch-shot-") as state:
        demo = subprocess.Popen(
            [sys.executable, "-m", "tokwatch", "demo", "--listen", f"127.0.0.1:{port}", "--state-dir", state],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + args.timeout
            page = None
            while time.monotonic() < deadline:
                page = _fetch(url + "/")
                if page is not None and _ready(page, args.min_runs):
                    break
                if demo.poll() is not None:
                    print(f"demo exited with {demo.returncode}", file=sys.stderr)
                    return 1
                time.sleep(1.0)
            else:
                print(f"no data on {url}/ after {args.timeout:.0f} s", file=sys.stderr)
                return 1
            args.out.parent.mkdir(parents=True, exist_ok=True)
            _chromium(browser, f"--window-size={args.size}", f"--screenshot={args.out}", url + "/")
            if args.mobile_out:
                _chromium(browser, "--window-size=390,1800", f"--screenshot={args.mobile_out}", url + "/")
            if args.endpoint_out and page:
                first = re.search(r'<a class="name" href="([^"]+)"', page)
                if first:
                    target = url + first.group(1)
                    _chromium(browser, "--window-size=1100,1400", f"--screenshot={args.endpoint_out}", target)
            if args.dom:
                dom = _chromium(browser, "--dump-dom", url + "/")
                args.dom.write_text(dom.stdout)
        finally:
            demo.terminate()
            try:
                demo.wait(timeout=15)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait(timeout=5)
    return 0 if args.out.exists() else 1


if __name__ == "__main__":
    sys.exit(main())
