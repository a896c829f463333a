"""Storage benchmark: one year of hourly runs for 100 endpoints, then time window figures and the report.

PostgreSQL runs on a throwaway local cluster (initdb + pg_ctl, like the tests); SQLite in a temp file.
Usage: python benchmarks/store.py [--endpoints 100] [--days 365] [--backend both|postgres|sqlite]
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
from functools import partial
from pathlib import Path

from tokwatch.storage.base import RunStore
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.report import build_report
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore
from tokwatch.storage.window import fleet_comparison, window_figures
from tokwatch.windows.window_rule import WindowRule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/support
from tests.support.postgres import LocalPostgres, find_bindir

STATUSES = ("ok",) * 96 + ("timeout", "rate_limited", "provider_error", "unreachable")


def make_rows(endpoints: int, days: int, now: float, seed: int = 1) -> list[RunRow]:
    """Hourly runs on the half hour for every endpoint; ~4 % failures; tok/s ~ N(base, 8 %)."""
    rng = random.Random(seed)
    start = now - days * 86400
    start -= start % 3600
    hours = days * 24
    rows = []
    for e in range(endpoints):
        base = rng.uniform(20, 200)
        name = f"endpoint-{e:03d}"
        for h in range(hours):
            status = rng.choice(STATUSES)
            rows.append(
                RunRow(
                    run_id=f"{e:03d}-{h:06d}",
                    time=start + h * 3600 + 1800,
                    endpoint=name,
                    status=status,
                    tokens_per_second=max(1.0, rng.gauss(base, base * 0.08)) if status == "ok" else None,
                    timing_source="engine" if status == "ok" else None,
                    output_tokens=256 if status == "ok" else None,
                    ttft_s=rng.uniform(0.05, 0.8),
                    e2e_s=rng.uniform(1, 12),
                    instance="bench",
                )
            )
    return rows


async def timed(fn: Callable[[], Awaitable[object]], repeat: int) -> tuple[float, float]:
    """(median, min) wall milliseconds over `repeat` calls, after one warm-up call."""
    await fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples), min(samples)


async def bench(store: RunStore, rows: list[RunRow], now: float, repeat: int) -> dict[str, float]:
    """Load, then time the three read paths the exporter and `tokwatch report` use."""
    await store.migrate()
    t0 = time.perf_counter()
    await store.bulk_load(rows)
    load_s = time.perf_counter() - t0
    count = await store.count_runs()
    assert count == len(rows), (count, len(rows))
    out = {"rows": float(count), "load_s": load_s, "rows_per_s": count / load_s}
    rule = WindowRule()  # the default configuration's
    figs = await window_figures(store, now, rule=rule)
    assert len(figs) > 0
    day = partial(window_figures, store, now, rule=rule)
    fleet = partial(fleet_comparison, store, now, rule=rule)
    report = partial(build_report, store, now, 7 * 86400, rule=rule)
    out["window_24h_ms"], out["window_24h_min_ms"] = await timed(day, repeat)
    out["fleet_7d_ms"], out["fleet_7d_min_ms"] = await timed(fleet, repeat)
    out["report_ms"], out["report_min_ms"] = await timed(report, repeat)
    return out


def show(name: str, r: dict[str, float]) -> None:
    """One block of results."""
    print(f"{name}: {int(r['rows'])} rows loaded in {r['load_s']:.1f} s = {r['rows_per_s']:,.0f} rows/s")
    for label, key in (
        ("window figures, 24h, all endpoints", "window_24h"),
        ("fleet comparison, 7d", "fleet_7d"),
        ("report (24h + 7d + last runs)", "report"),
    ):
        print(f"  {label:<36} {r[key + '_ms']:8.1f} ms median ({r[key + '_min_ms']:.1f} min)")


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", type=int, default=100)
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--backend", choices=["both", "postgres", "sqlite"], default="both")
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()
    now = time.time()
    t0 = time.perf_counter()
    rows = make_rows(args.endpoints, args.days, now)
    print(
        f"generated {len(rows)} runs ({args.endpoints} endpoints x {args.days} days hourly) "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    if args.backend in ("both", "postgres"):
        bindir = find_bindir()
        if bindir is None:
            print("postgres: skipped (initdb/pg_ctl not found)", file=sys.stderr)
        else:
            server = LocalPostgres(bindir)
            try:
                server.init()
                server.start()
                store = PostgresStore(server.create_database("bench"), timeout_s=600.0)
                await store.open()
                try:
                    show("postgres (COPY)", await bench(store, rows, now, args.repeat))
                finally:
                    await store.close()
            finally:
                server.destroy()
    if args.backend in ("both", "sqlite"):
        with tempfile.TemporaryDirectory() as d:
            sqlite = SQLiteStore(Path(d) / "bench.db")
            try:
                show("sqlite (executemany)", await bench(sqlite, rows, now, args.repeat))
            finally:
                await sqlite.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
