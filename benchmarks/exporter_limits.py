"""What one exporter costs per endpoint: CPU per probed endpoint, RSS per configured endpoint, /metrics size.

Runs the real `App` (SQLite storage, measurement thread) against the simulator in another process with N
endpoints (fast decode, so rounds are short; the CPU cost of a probe is per token and per request, not per
second), for a few rounds, and prints CPU seconds per endpoint-round, resident memory per endpoint and the
endpoints one replica can carry at a given interval and CPU budget (docs/scaling.md has the arithmetic).

    python benchmarks/exporter_limits.py [--endpoints 50,200] [--tokens 256] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import tempfile
import time

from simproc import simulator
from tokwatch.app import App
from tokwatch.config import load_config_text
from tokwatch.scheduler import run_round


def rss_mb() -> float:
    """Resident set size now (MB), from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 1e6


def sim_config(n: int) -> str:
    """One OpenAI-style server with a model per endpoint, decoding fast."""
    models = [{"name": f"m{i}", "decode_tps": 2000, "prefill_tps": 100000} for i in range(n)]
    return json.dumps({"seed": 1, "servers": [{"name": "s", "dialect": "openai", "models": models}]})


def exporter_config(base: str, n: int, tokens: int, tmp: str) -> str:
    """N endpoints, `per_server: 8` (all on one simulator)."""
    lines = "\n".join(
        f"  - {{name: ep{i}, kind: openai, base_url: '{base}/s/v1', model: m{i}}}" for i in range(n)
    )
    return f"""
probe: {{max_tokens: {tokens}}}
schedule: {{interval: 1h, parallelism: 1, per_server: 8, run_on_start: false}}
storage: {{sqlite_path: '{tmp}/tw.db', outbox_path: '{tmp}/outbox'}}
endpoints:
{lines}
"""


async def measure(n: int, tokens: int, rounds: int) -> dict[str, float]:
    """CPU per endpoint-round and RSS per endpoint for one fleet size."""
    with simulator(sim_config(n)) as base, tempfile.TemporaryDirectory() as tmp:
        rss0 = rss_mb()
        app = App(load_config_text(exporter_config(base, n, tokens, tmp)), instance="limits")
        await app.start(schedule=False)
        try:
            plan = app._schedule_settings()[2]
            await run_round(plan, app.probe)  # warm-up round: connections, caches
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(rounds):
                await run_round(plan, app.probe)
                await app._refresh_windows()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
            body = app.exposition.render()
            return {
                "cpu_ms_per_endpoint_round": cpu / (n * rounds) * 1e3,
                "wall_s_per_round": wall / rounds,
                "rss_mb": rss_mb(),
                "rss_mb_per_endpoint": (rss_mb() - rss0) / n,
                "metrics_kb_per_endpoint": len(body) / n / 1e3,
            }
        finally:
            await app.stop()


def main() -> None:
    """Print one row per fleet size, then endpoints per replica at a given interval and CPU budget."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", type=lambda s: [int(x) for x in s.split(",")], default=[50, 200])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--interval", type=float, default=3600.0, help="probe interval for the capacity line")
    ap.add_argument("--cpu-budget", type=float, default=0.25, help="share of one core for probing")
    args = ap.parse_args()
    print(f"max_tokens={args.tokens} warm-up + timed run per endpoint, rounds={args.rounds}")
    print("| endpoints | CPU ms per endpoint-round | RSS MB | RSS MB per endpoint | /metrics KB/endpoint |")
    print("|---:|---:|---:|---:|---:|")
    last: dict[str, float] = {}
    for n in args.endpoints:
        last = asyncio.run(measure(n, args.tokens, args.rounds))
        print(
            f"| {n} | {last['cpu_ms_per_endpoint_round']:.1f} | {last['rss_mb']:.0f} "
            f"| {last['rss_mb_per_endpoint']:.3f} | {last['metrics_kb_per_endpoint']:.1f} |"
        )
    per_endpoint_s = last["cpu_ms_per_endpoint_round"] / 1e3
    capacity = args.cpu_budget * args.interval / per_endpoint_s
    print(
        f"CPU bound: {capacity:,.0f} endpoints per replica at one round per {args.interval:g}s "
        f"within {args.cpu_budget:.0%} of a core"
    )


if __name__ == "__main__":
    main()
