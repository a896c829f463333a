"""What one exporter covers and costs: round time per round at a given parallelism, the endpoints one replica
can cover at a given interval, CPU per probed endpoint, RSS per configured endpoint, /metrics size.

Runs the real `App` (SQLite storage, measurement thread) against simulated servers in another process: N
endpoints spread evenly over S simulated servers (each on its own port, so tokwatch's scheduler sees S
servers), probed as configured by default (`per_server: 1`, warm-up + timed run) with `parallelism` P
servers at once. One unmeasured round first (connections, caches), then `--rounds` timed rounds. Every
(N, P) runs in a fresh child process, so RSS is not inherited from the previous size.

Columns:
- round s: measured wall time of each timed round (`run_round` start to end).
- servers' s: what the simulated servers alone take: probe time = 2 x max_tokens / decode rate (TTFT ~ 0
  here), each server's endpoints one after another, servers started in order on the first of P free slots
  (what `run_round` does). With equal servers that is docs/scaling.md's ceil(S / P) x N / S x probe time.
- overhead ms/probe: (round - servers') per probe on that critical path, i.e. what the exporter, the HTTP
  round trips and the shared simulator process add to each probe.
- endpoints per replica: N x interval / measured round time. The measured round scaled linearly to the
  interval (more endpoints per server, same S and P), for servers as fast as the simulated ones; for real
  servers use their probe time (docs/scaling.md).

    python benchmarks/exporter_limits.py [--endpoints 50,200,500] [--parallelism 1,4,8] [--servers 8]
        [--tokens 64] [--decode-tps 500] [--rounds 1] [--interval 3600]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

from simproc import simulators
from tokwatch.app import App
from tokwatch.config import load_config_text
from tokwatch.scheduler import run_round


def rss_mb() -> float:
    """Resident set size now (MB), from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 1e6


def per_server(n: int, servers: int) -> int:
    """Endpoints on the busiest simulated server."""
    return math.ceil(n / servers)


def serial_probes(n: int, servers: int, parallelism: int) -> int:
    """Probes one after another on a round's critical path: server j holds the endpoints i with i mod S = j,
    and takes the first of `parallelism` slots to free up, in order (list scheduling, as `run_round`)."""
    slots = [0] * min(parallelism, servers)
    for j in range(servers):
        size = len(range(j, n, servers))
        slots[slots.index(min(slots))] += size
    return max(slots)


def sim_config(n: int, servers: int, decode_tps: float) -> str:
    """One OpenAI-style server with a model per endpoint it hosts (every simulated server the same)."""
    models = [
        {"name": f"m{i}", "decode_tps": decode_tps, "prefill_tps": 100000}
        for i in range(per_server(n, servers))
    ]
    return json.dumps({"seed": 1, "servers": [{"name": "s", "dialect": "openai", "models": models}]})


def exporter_config(bases: list[str], n: int, tokens: int, parallelism: int, tmp: str) -> str:
    """N endpoints, endpoint i on server i mod S; `per_server: 1` (the default), P servers at once."""
    s = len(bases)
    lines = "\n".join(
        f"  - {{name: ep{i}, kind: openai, base_url: '{bases[i % s]}/s/v1', model: m{i // s}, timeout: 60s}}"
        for i in range(n)
    )
    return f"""
probe: {{max_tokens: {tokens}, warmup: true}}
schedule: {{interval: 1h, parallelism: {parallelism}, per_server: 1, run_on_start: false}}
storage: {{sqlite_path: '{tmp}/tw.db', outbox_path: '{tmp}/outbox'}}
endpoints:
{lines}
"""


async def measure(n: int, parallelism: int, args: argparse.Namespace) -> dict[str, object]:
    """Round times, CPU per endpoint-round and RSS per endpoint for one fleet size and parallelism."""
    sim = sim_config(n, args.servers, args.decode_tps)
    with simulators(sim, args.servers) as bases, tempfile.TemporaryDirectory() as tmp:
        rss0 = rss_mb()
        app = App(
            load_config_text(exporter_config(bases, n, args.tokens, parallelism, tmp)), instance="limits"
        )
        await app.start(schedule=False)
        try:
            plan = app._schedule_settings()[2]
            await run_round(plan, app.probe)  # warm-up round: connections, caches
            cpu0 = time.process_time()
            walls: list[float] = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                await run_round(plan, app.probe)
                walls.append(time.perf_counter() - t0)
                await app.refresh_windows()
            cpu = time.process_time() - cpu0
            results = [o.result for o in app.probes.last_outcomes.values()]
            body = app.exposition.render()
            return {
                "endpoints": n,
                "parallelism": parallelism,
                "round_s": walls,
                "cpu_ms_per_endpoint_round": cpu / (n * args.rounds) * 1e3,
                "rss_mb": rss_mb(),
                "rss_mb_per_endpoint": (rss_mb() - rss0) / n,
                "metrics_kb_per_endpoint": len(body) / n / 1e3,
                "not_ok": sum(r.status != "ok" for r in results),
                "disturbed": sum(r.timing_disturbed for r in results),
            }
        finally:
            await app.stop()


def child(n: int, parallelism: int, args: argparse.Namespace) -> dict[str, object]:
    """`measure` in a fresh interpreter (this script with --one), so each row starts from the same RSS."""
    cmd = [
        sys.executable,
        __file__,
        "--one",
        f"{n},{parallelism}",
        *("--servers", str(args.servers), "--tokens", str(args.tokens)),
        *("--decode-tps", str(args.decode_tps), "--rounds", str(args.rounds)),
    ]
    budget = 120 + 4 * (args.rounds + 1) * n * 2 * args.tokens / args.decode_tps  # generous, still bounded
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"N={n} P={parallelism} failed:\n{proc.stderr[-3000:]}")
    row: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def main() -> None:
    """One row per (endpoints, parallelism): round time, the servers' own share, capacity, CPU and RSS."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--endpoints", type=ints, default=[50, 200, 500])
    ap.add_argument("--parallelism", type=ints, default=[1, 4, 8], help="servers probed at once")
    ap.add_argument("--servers", type=int, default=8, help="simulated servers the endpoints are spread over")
    ap.add_argument("--tokens", type=int, default=64, help="probe.max_tokens (warm-up and timed run)")
    ap.add_argument("--decode-tps", type=float, default=500.0, help="the simulated servers' decode rate")
    ap.add_argument("--rounds", type=int, default=1, help="timed rounds after one unmeasured round")
    ap.add_argument("--interval", type=float, default=3600.0, help="probe interval for the capacity column")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # "N,P": measure one row, print it as JSON
    args = ap.parse_args()
    if args.one:
        n, p = (int(x) for x in args.one.split(","))
        print(json.dumps(asyncio.run(measure(n, p, args))))
        return

    probe_s = 2 * args.tokens / args.decode_tps
    print(
        f"servers={args.servers} max_tokens={args.tokens} decode={args.decode_tps:g} tok/s (probe time "
        f"{probe_s:.3f} s: warm-up + timed run) rounds={args.rounds} interval={args.interval:g}s "
        f"loadavg at start={'/'.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        "| endpoints | parallelism | round s (measured) | servers' s | overhead ms/probe "
        f"| endpoints per replica at {args.interval:g} s (scaled) | CPU ms per endpoint-round | RSS MB "
        "| RSS MB per endpoint | /metrics KB per endpoint | not ok / disturbed |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.endpoints:
        for p in args.parallelism:
            row = child(n, p, args)
            walls = [float(w) for w in row["round_s"]]  # type: ignore[union-attr]
            wall = sum(walls) / len(walls)
            serial = serial_probes(n, args.servers, p)
            servers_s = serial * probe_s
            overhead_ms = (wall - servers_s) / serial * 1e3
            capacity = n * args.interval / wall
            rounds = " / ".join(f"{w:.1f}" for w in walls)
            print(
                f"| {n} | {p} | {rounds} | {servers_s:.1f} | {overhead_ms:.0f} "
                f"| {capacity:,.0f} | {row['cpu_ms_per_endpoint_round']:.1f} | {row['rss_mb']:.0f} "
                f"| {row['rss_mb_per_endpoint']:.3f} | {row['metrics_kb_per_endpoint']:.1f} "
                f"| {row['not_ok']} / {row['disturbed']} |",
                flush=True,
            )
    print(f"loadavg at end={'/'.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
