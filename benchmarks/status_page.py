"""Status page render time: store queries + HTML for N endpoints with a history of hourly runs.

For each backend (embedded SQLite, and a throwaway local PostgreSQL when its binaries are installed) the
store is filled with N endpoints x H hourly runs (about 4 % failures), then these are timed:
- overview: every query behind `/` (24 h and 7 d figures, last runs, sparklines) plus the HTML;
- html only: rendering an overview already queried (the share the page itself costs);
- endpoint: one endpoint's page (90 days of daily figures, last 100 runs, incidents).

    python benchmarks/status_page.py [--endpoints 100] [--hours 48,168] [--repeat 15]
        [--backends sqlite,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tokwatch.settings.config import Config, load_config_text
from tokwatch.statuspage.model import build_endpoint_page, build_overview
from tokwatch.statuspage.render import render_endpoint, render_overview
from tokwatch.storage.base import EndpointSpec, RunStore
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/support
from tests.support.postgres import LocalPostgres, find_bindir


def fleet(n: int) -> Config:
    """N endpoints with two labels each."""
    lines = "\n".join(
        f"  - {{name: ep{i:03d}, kind: vllm, base_url: 'http://127.0.0.1:1/v1', model: m, "
        f"labels: {{site: s{i % 4}}}}}"
        for i in range(n)
    )
    return load_config_text(f"endpoints:\n{lines}\n")


def history(config: Config, hours: int, now: float) -> list[RunRow]:
    """Hourly runs for every endpoint, ~4 % of them failures."""
    rng = random.Random(1)
    rows = []
    for i, ep in enumerate(config.endpoints):
        level = 40.0 + i
        for h in range(hours):
            t = now - 60 - h * 3600.0
            failed = rng.random() < 0.04
            rows.append(
                RunRow(
                    run_id=f"{ep.name}-{h}",
                    time=t,
                    endpoint=ep.name,
                    status="timeout" if failed else "ok",
                    tokens_per_second=None if failed else rng.gauss(level, level * 0.03),
                    timing_source=None if failed else "vllm_metrics",
                    ttft_s=None if failed else 0.05,
                    error_class="timeout" if failed else None,
                )
            )
    return rows


async def timed(fn: Callable[[], Awaitable[object]], repeat: int) -> tuple[float, float]:
    """Median and max wall time in ms over `repeat` calls (after one warm-up call)."""
    await fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times)


Timing = tuple[str, float, float, int]


async def measure(store: RunStore, config: Config, hours: int, repeat: int) -> list[Timing]:
    """Fill the store, then time the pages; returns (what, median ms, max ms, bytes)."""
    now = time.time()
    await store.ensure_ready()
    await store.sync_endpoints([EndpointSpec(e.name) for e in config.endpoints])
    await store.bulk_load(history(config, hours, now))
    ov = await build_overview(store, config, now)
    page = await build_endpoint_page(store, config, config.endpoints[0], now)
    html = render_overview(ov, config)
    detail = render_endpoint(page, config)

    async def overview() -> None:
        render_overview(await build_overview(store, config), config)

    async def html_only() -> None:
        render_overview(ov, config)

    async def endpoint() -> None:
        render_endpoint(await build_endpoint_page(store, config, config.endpoints[0]), config)

    out = []
    for what, fn, size in (
        ("overview (queries + html)", overview, len(html)),
        ("overview html only", html_only, len(html)),
        ("endpoint page", endpoint, len(detail)),
    ):
        med, worst = await timed(fn, repeat)
        out.append((what, med, worst, size))
    return out


async def main() -> None:
    """Print a table per backend and history length."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", type=int, default=100)
    ap.add_argument("--hours", default="48,168", help="hourly runs per endpoint, comma-separated")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--backends", default="sqlite,postgres")
    args = ap.parse_args()
    config = fleet(args.endpoints)
    backends = args.backends.split(",")
    pg: LocalPostgres | None = None
    if "postgres" in backends:
        bindir = find_bindir()
        if bindir is None:
            print("postgres: binaries not found, skipped")
            backends.remove("postgres")
        else:
            pg = LocalPostgres(bindir)
            pg.init()
            pg.start()
    print(f"{'backend':9} {'runs/ep':>7} {'what':28} {'median ms':>10} {'max ms':>8} {'KiB':>6}")
    try:
        for hours in (int(h) for h in args.hours.split(",")):
            for backend in backends:
                with tempfile.TemporaryDirectory() as tmp:
                    store: RunStore
                    if backend == "sqlite":
                        store = SQLiteStore(Path(tmp) / "tw.db")
                    else:
                        assert pg is not None
                        store = PostgresStore(pg.new_database(), timeout_s=10.0)
                        await store.open()
                    try:
                        for what, med, worst, size in await measure(store, config, hours, args.repeat):
                            kib = size / 1024
                            print(f"{backend:9} {hours:>7} {what:28} {med:>10.1f} {worst:>8.1f} {kib:>6.0f}")
                    finally:
                        await store.close()
    finally:
        if pg is not None:
            pg.destroy()


if __name__ == "__main__":
    asyncio.run(main())
