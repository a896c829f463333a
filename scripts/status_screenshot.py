#!/usr/bin/env python3
"""Screenshot the status page in headless Chromium, save its DOM, measure its layout at phone width.

Used by tests/statuspage/test_browser.py and to make the docs' screenshots:

    python scripts/status_screenshot.py --seeded --out docs/img/status-page.png \\
        --mobile-out docs/img/status-page-phone.png \\
        --endpoint-out docs/img/status-endpoint.png --endpoint vllm-h100 \\
        --compare-out docs/img/status-compare.png

Two sources of data:
- default: starts `tokwatch demo` on a free loopback port with a throwaway state directory and waits until
  every tile has a status and at least `--min-runs` runs on its sparkline (live simulated probes);
- `--seeded`: writes 90 days of hourly runs of a made-up fleet into a throwaway SQLite store (a seeded RNG:
  the same history each time, relative to now) and starts `tokwatch serve` on it with every endpoint
  disabled (no probe adds to it), so the page shows every state at once: green, amber and red CV bands,
  an ongoing TIMEOUT incident with its last ok run in the headline, rate-limited runs as red ticks, an
  endpoint that never had an ok run; two workloads (seed000, short) from the exporter's site `eu-west`,
  and two endpoints measured from a second site, `us-east`, too (rows of one tile), with network phases.
Then runs Chromium and stops the exporter. `--layout FILE` loads the page (and the endpoint page) at a
390 px wide phone viewport through Chromium's DevTools protocol and writes what the layout measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
ROOT = Path(__file__).resolve().parents[1]
EXPORTER = ROOT / "exporter"  # this checkout's package, whatever is installed
PHONE = (390, 844)


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
    runs = [int(n) for n in re.findall(r'aria-label="(\d+) recent runs?,', page)]
    return bool(statuses) and "none" not in statuses and len(runs) == len(statuses) and min(runs) >= min_runs


def _chromium(browser: str, *args: str) -> subprocess.CompletedProcess[str]:
    # A profile of its own: two screenshots taken at once (tests in parallel) never share the default one.
    with tempfile.TemporaryDirectory(prefix="tokwatch-shot-", ignore_cleanup_errors=True) as profile:
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *args,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


# --- the seeded fleet ----------------------------------------------------------------------------------

HOUR = 3600.0
DAYS = 90

# name, kind, model, labels, tok/s level, relative jitter, timing source
SEEDED_FLEET: list[tuple[str, str, str, dict[str, str], float, float, str]] = [
    ("vllm-h100", "vllm", "Qwen/Qwen3-8B", {"dc": "dc1", "gpu": "h100"}, 142.0, 0.015, "vllm_metrics"),
    (
        "sglang-a100",
        "sglang",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"dc": "dc2", "gpu": "a100"},
        118.0,
        0.02,
        "server_wall",
    ),
    ("ollama-desk", "ollama", "llama3.2:3b", {"dc": "office"}, 46.0, 0.09, "engine"),
    ("cloud-gpt-4o-mini", "openai", "gpt-4o-mini", {"dc": "cloud"}, 82.0, 0.24, "client_stream"),
    ("staging-mistral", "openai", "mistral-small-latest", {"dc": "staging"}, 0.0, 0.0, "client_stream"),
    ("llamacpp-pi", "llamacpp", "smollm2-135m", {"dc": "lab"}, 24.5, 0.03, "engine"),
]


def seeded_config(state: Path) -> str:
    """tokwatch.yml for the seeded fleet, its store in `state`. The usual hourly schedule, but every endpoint
    is disabled, so no round adds runs to the seeded history (disabled endpoints keep their tiles)."""
    lines = [
        "site: eu-west",
        "probe: {max_tokens: 128, workloads: [seed000, short]}",
        "schedule: {interval: 1h, offset: 30m, run_on_start: false}",
        f"storage: {{sqlite_path: '{state}/tokwatch.db', outbox_path: '{state}/outbox.jsonl'}}",
        "endpoints:",
    ]
    for port, (name, kind, model, labels, *_rest) in enumerate(SEEDED_FLEET, start=1):
        tags = ", ".join(f"{k}: {v}" for k, v in labels.items())
        lines.append(
            f"  - {{name: {name}, kind: {kind}, model: '{model}', base_url: 'http://127.0.0.1:{port}/v1', "
            f"labels: {{{tags}}}, enabled: false}}"
        )
    return "\n".join(lines) + "\n"


# Series of the seeded fleet besides seed000 from eu-west: (workload, site, endpoints it covers).
SEEDED_SERIES = (
    ("seed000", "eu-west", None),
    ("short", "eu-west", None),
    ("seed000", "us-east", ("vllm-h100", "cloud-gpt-4o-mini")),
    ("short", "us-east", ("vllm-h100", "cloud-gpt-4o-mini")),
)


def seeded_runs(now: float) -> list[Any]:
    """90 days of hourly runs (on the half hour) of SEEDED_FLEET's series, newest round before `now`."""
    from tokwatch.storage.rows import RunRow

    rng = random.Random(11)
    last_round = (now - 1800) // HOUR * HOUR + 1800
    rows: list[RunRow] = []
    for n, (workload, site, only) in enumerate(SEEDED_SERIES):
        far = site == "us-east"  # an ocean away: a longer round trip, so a longer TTFT
        sized = workload == "short"
        for i, (name, _kind, _model, _labels, level, jitter, source) in enumerate(SEEDED_FLEET):
            if only is not None and name not in only:
                continue
            for k in range(DAYS * 24):
                t = last_round - k * HOUR + 2.0 * i + 0.3 * n + rng.random()
                days_ago = k / 24
                base = level * (0.93 if sized else 1.0)
                if name == "vllm-h100" and days_ago > 21:
                    base *= 128.0 / 142.0  # before an engine upgrade
                if name == "sglang-a100" and 34 <= days_ago <= 41:
                    base *= 84.0 / 118.0  # a week on a smaller GPU share
                status, error_class, message = "ok", None, None
                roll = rng.random()
                run_id = f"seed-{name}-{workload}-{site}-{k}"
                if name == "staging-mistral":
                    if k >= 5:
                        continue  # added five rounds ago, with a key the server does not accept
                    status, error_class, message = (
                        "auth_failure",
                        "http_401",
                        'HTTP 401: {"message":"Unauthorized"}',
                    )
                elif name == "sglang-a100" and k < 4:
                    status, error_class, message = "timeout", "read_timeout", "no response byte within 60 s"
                elif name == "sglang-a100" and 12 * 24 <= k < 12 * 24 + 3:
                    status, error_class, message = (
                        "provider_error",
                        "http_5xx",
                        "HTTP 503: Service Unavailable",
                    )
                elif name == "cloud-gpt-4o-mini" and roll < 0.08:
                    status, error_class = "rate_limited", "http_429"
                    message = "HTTP 429: Rate limit reached for gpt-4o-mini on tokens per min (TPM)"
                elif name == "ollama-desk" and roll < 0.02:
                    status, error_class, message = "unreachable", "connect", "connection refused"
                elif roll < 0.004:
                    status, error_class, message = (
                        "provider_error",
                        "http_5xx",
                        "HTTP 500: Internal Server Error",
                    )
                if status != "ok":
                    rows.append(
                        RunRow(
                            run_id,
                            t,
                            name,
                            status,
                            error_class=error_class,
                            error_message=message,
                            e2e_s=60.0 if status == "timeout" else 0.2,
                            workload=workload,
                            site=site,
                        )
                    )
                    continue
                tps = max(1.0, rng.gauss(base, base * jitter))
                cloud = name == "cloud-gpt-4o-mini"
                rtt = (0.068 if far else 0.002) + (0.018 if cloud else 0.0)
                server = rng.uniform(0.04, 0.12) * (3.0 if cloud else 1.0) + (0.06 if sized else 0.0)
                ttft = server + rtt
                opened = k % 3 == 0  # a round whose warm-up opened the connection (else kept from before)
                phases = {
                    "phase_resolve_s": 0.0012 if opened else None,
                    "phase_connect_s": rtt if opened else None,
                    "phase_tls_s": 2 * rtt if opened and (cloud or far) else (0.0 if opened else None),
                    "network_rtt_s": rtt if opened else None,
                    "connection_reused": not opened,
                }
                prompt = 100 if sized else 39
                rows.append(
                    RunRow(
                        run_id,
                        t,
                        name,
                        "ok",
                        tokens_per_second=tps,
                        timing_source=source,
                        output_tokens=128,
                        prompt_tokens=prompt,
                        ttft_s=ttft,
                        itl_p50_s=1 / tps,
                        itl_p99_s=1.8 / tps,
                        e2e_s=ttft + 127 / tps,
                        workload=workload,
                        site=site,
                        prefill_tokens_per_second=prompt / server,
                        phase_processing_s=ttft,
                        **phases,  # type: ignore[arg-type]
                    )
                )
    return rows


def seed_store(state: Path, now: float) -> Path:
    """Write the seeded config and history into `state`; returns the config's path."""
    from tokwatch.settings.config import load_config
    from tokwatch.storage.base import EndpointSpec
    from tokwatch.storage.sqlite import SQLiteStore

    config_path = state / "tokwatch.yml"
    config_path.write_text(seeded_config(state))
    config = load_config(config_path)

    async def write() -> None:
        store = SQLiteStore(Path(str(config.storage.sqlite_path)))
        try:
            await store.ensure_ready()
            await store.sync_endpoints([EndpointSpec(e.name) for e in config.endpoints])
            await store.write_runs(seeded_runs(now))
        finally:
            await store.close()

    asyncio.run(write())
    return config_path


# --- layout at phone width through the DevTools protocol -------------------------------------------------

# Every rendered element's box against the viewport; content inside a horizontal scroller (.scroll, the
# wide tables) may extend past it as long as the scroller itself fits.
_LAYOUT_JS = r"""
(() => {
  const vw = document.documentElement.clientWidth;
  const over = [];
  let minFont = Infinity;
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    const scroller = el.parentElement && el.parentElement.closest('.scroll');
    if (!scroller && (r.right > vw + 0.5 || r.left < -0.5)) {
      const cls = typeof el.className === 'string' && el.className
        ? '.' + el.className.split(' ').join('.') : '';
      over.push(`${el.tagName.toLowerCase()}${cls} ${Math.round(r.left)}..${Math.round(r.right)}`);
    }
    const text = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (text && !(el instanceof SVGElement)) {
      minFont = Math.min(minFont, parseFloat(getComputedStyle(el).fontSize));
    }
  }
  return {
    viewport: vw,
    scroll_width: document.documentElement.scrollWidth,
    body_scroll_width: document.body.scrollWidth,
    overflowing: over.slice(0, 30),
    min_font_px: minFont,
    tiles: document.querySelectorAll('article.tile').length,
    url: location.href,
  };
})()
"""


async def _measure(port: int, urls: list[str], width: int, height: int) -> list[dict[str, Any]]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t.get("type") == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 1_000_000))
            events: list[str] = []

            async def call(method: str, **params: Any) -> dict[str, Any]:
                msg_id = next(ids)
                await ws.send_json({"id": msg_id, "method": method, "params": params})
                async for raw in ws:
                    msg = json.loads(raw.data)
                    if msg.get("id") == msg_id:
                        if "error" in msg:
                            raise RuntimeError(f"{method}: {msg['error']}")
                        return dict(msg.get("result", {}))
                    if "method" in msg:
                        events.append(msg["method"])
                raise RuntimeError("DevTools connection closed")

            async def loaded() -> None:
                while "Page.loadEventFired" not in events:
                    raw = await ws.receive(timeout=30)
                    events.append(json.loads(raw.data).get("method", ""))

            # mobile: the page's <meta name="viewport"> applies, as on a phone
            await call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=True,
            )
            await call("Page.enable")
            out = []
            for url in urls:
                events.clear()
                await call("Page.navigate", url=url)
                await loaded()
                result = await call("Runtime.evaluate", expression=_LAYOUT_JS, returnByValue=True)
                out.append(dict(result["result"]["value"]))
            return out


def measure_layout(
    browser: str, urls: list[str], width: int = PHONE[0], height: int = PHONE[1]
) -> list[dict[str, Any]]:
    """Load each URL in headless Chromium at a `width` px wide mobile viewport and measure its layout."""
    # Chromium's helper processes outlive a terminated browser for a moment and keep writing to the profile:
    # the browser runs in its own session so the whole group is stopped, and a file written late does not
    # fail the clean-up.
    with tempfile.TemporaryDirectory(prefix="tokwatch-cdp-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            active = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (active.exists() and len(active.read_text().splitlines()) >= 2):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("Chromium did not open its DevTools port")
                time.sleep(0.1)
            port = int(active.read_text().splitlines()[0])
            return asyncio.run(_measure(port, urls, width, height))
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the browser's process group, SIGKILL if it has not ended within 15 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):  # helpers still alive after the browser ended
        os.killpg(proc.pid, signal.SIGKILL)


# --- main ------------------------------------------------------------------------------------------------


def _start(args: argparse.Namespace, state: str, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(EXPORTER), os.environ.get("PYTHONPATH")) if p),
    }
    listen = f"127.0.0.1:{port}"
    if args.seeded:
        config = seed_store(Path(state), time.time())
        cmd = ["serve", "--config", str(config), "--listen", listen]
    else:
        cmd = ["demo", "--listen", listen, "--state-dir", state]
    return subprocess.Popen(
        [sys.executable, "-m", "tokwatch", *cmd],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the exporter, wait for data, write the screenshot(s), DOM and layout; exit 2 without a browser."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="PNG of the page at desktop size")
    ap.add_argument("--mobile-out", type=Path, help="PNG of the page at phone size (390 px wide)")
    ap.add_argument("--dom", type=Path, help="write the DOM Chromium built")
    ap.add_argument("--endpoint-out", type=Path, help="PNG of an endpoint's page")
    ap.add_argument("--compare-out", type=Path, help="PNG of a workload's comparison view")
    ap.add_argument(
        "--compare", help="the workload of --compare-out and --layout (default: the page's first)"
    )
    ap.add_argument(
        "--endpoint", help="the endpoint of --endpoint-out and --layout (default: the first tile)"
    )
    ap.add_argument(
        "--layout", type=Path, help="write the page's layout at 390 px (JSON; overview, endpoint)"
    )
    ap.add_argument("--seeded", action="store_true", help="a seeded 90-day history instead of the live demo")
    ap.add_argument("--min-runs", type=int, default=2, help="runs each sparkline needs first (default 2)")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds to wait for data (default 150)")
    ap.add_argument("--size", default="1280,1500", help="desktop window size W,H")
    args = ap.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print("no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(EXPORTER))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="tokwatch-shot-") as state:
        exporter = _start(args, state, port)
        try:
            deadline = time.monotonic() + args.timeout
            page = None
            while time.monotonic() < deadline:
                page = _fetch(url + "/")
                if page is not None and _ready(page, args.min_runs):
                    break
                if exporter.poll() is not None:
                    print(f"the exporter exited with {exporter.returncode}", file=sys.stderr)
                    return 1
                time.sleep(1.0)
            else:
                print(f"no data on {url}/ after {args.timeout:.0f} s", file=sys.stderr)
                return 1
            assert page is not None
            first = re.search(r'<a class="name" href="([^"]+)"', page)
            detail = f"/endpoints/{args.endpoint}" if args.endpoint else (first.group(1) if first else "/")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            _chromium(browser, f"--window-size={args.size}", f"--screenshot={args.out}", url + "/")
            if args.mobile_out:
                _chromium(browser, "--window-size=390,1800", f"--screenshot={args.mobile_out}", url + "/")
            if args.endpoint_out:
                _chromium(
                    browser, "--window-size=1100,1400", f"--screenshot={args.endpoint_out}", url + detail
                )
            link = re.search(r'href="(/compare\?workload=[^"]+)"', page)
            compare = (
                f"{url}/compare?workload={args.compare}"
                if args.compare
                else url + (link.group(1) if link else "/")
            )
            if args.compare_out:
                where = compare
                _chromium(browser, "--window-size=1280,1500", f"--screenshot={args.compare_out}", where)
            if args.dom:
                dom = _chromium(browser, "--dump-dom", url + "/")
                args.dom.write_text(dom.stdout)
            if args.layout:
                measured = measure_layout(browser, [url + "/", url + detail, compare])
                args.layout.write_text(json.dumps(measured, indent=2))
        finally:
            exporter.terminate()
            try:
                exporter.wait(timeout=15)
            except subprocess.TimeoutExpired:
                exporter.kill()
                exporter.wait(timeout=5)
    return 0 if args.out.exists() else 1


if __name__ == "__main__":
    sys.exit(main())
