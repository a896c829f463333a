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

With `--workloads W` (2 or 3) every endpoint is probed with W workloads (issue 21): seed000 (its usual
prompt), then 1,000- and 10,000-token fresh prompts, each with `--tokens` output tokens, so a round holds
N x W probes; CPU, RSS and /metrics are then also given per endpoint-workload, and servers' s adds each
workload's prefill time (input tokens / `--prefill-tps`) to its probe time.

    python benchmarks/exporter_limits.py [--endpoints 50,200,500] [--parallelism 1,4,8] [--servers 8]
        [--tokens 64] [--decode-tps 500] [--prefill-tps 1000000] [--workloads 1] [--rounds 1]
        [--interval 3600]
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
from tokwatch.probes.http import WARMUP_MAX_TOKENS
from tokwatch.service.app import App
from tokwatch.service.scheduler import run_round
from tokwatch.settings.config import load_config_text


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


# Input tokens of the workloads `--workloads W` takes the first W of (None: seed000's configured prompt).
WORKLOAD_INPUTS: tuple[int | None, ...] = (None, 1000, 10000)
PER_SERIES_HEAD = (
    " CPU ms per endpoint-workload-round | RSS MB per endpoint-workload | /metrics KB per endpoint-workload |"
)
SEED000_PROMPT_TOKENS = 30  # about what the servers count for seed000's prompt with the chat template


def workloads_yaml(count: int, tokens: int) -> str:
    """`probe.workloads` for `count` workloads: seed000, then fresh prompts of 1k and 10k tokens."""
    sized = [f"{{name: in{n}, input_tokens: {n}, output_tokens: {tokens}}}" for n in WORKLOAD_INPUTS[1:count]]
    return "[" + ", ".join(["seed000", *sized]) + "]"


def probe_seconds(count: int, tokens: int, decode_tps: float, prefill_tps: float) -> float:
    """What the simulated server alone takes for one endpoint's probes of `count` workloads: warm-up and
    timed run of each, prefill of its input then its output tokens at the decode rate."""
    total = 2 * (SEED000_PROMPT_TOKENS / prefill_tps + tokens / decode_tps)  # seed000: full warm-up
    for n in WORKLOAD_INPUTS[1:count]:  # a sized workload's warm-up stops at WARMUP_MAX_TOKENS
        total += 2 * n / prefill_tps + (min(tokens, WARMUP_MAX_TOKENS) + tokens) / decode_tps
    return total


def sim_config(n: int, servers: int, decode_tps: float, prefill_tps: float) -> str:
    """One OpenAI-style server with a model per endpoint it hosts (every simulated server the same)."""
    models = [
        {"name": f"m{i}", "decode_tps": decode_tps, "prefill_tps": prefill_tps}
        for i in range(per_server(n, servers))
    ]
    return json.dumps({"seed": 1, "servers": [{"name": "s", "dialect": "openai", "models": models}]})


def exporter_config(
    bases: list[str], n: int, tokens: int, parallelism: int, tmp: str, workloads: int = 1
) -> str:
    """N endpoints, endpoint i on server i mod S; `per_server: 1` (the default), P servers at once."""
    s = len(bases)
    lines = "\n".join(
        f"  - {{name: ep{i}, kind: openai, base_url: '{bases[i % s]}/s/v1', model: m{i // s}, timeout: 60s}}"
        for i in range(n)
    )
    return f"""
probe: {{max_tokens: {tokens}, warmup: true, workloads: {workloads_yaml(workloads, tokens)}}}
schedule: {{interval: 1h, parallelism: {parallelism}, per_server: 1, run_on_start: false}}
storage: {{sqlite_path: '{tmp}/tw.db', outbox_path: '{tmp}/outbox'}}
endpoints:
{lines}
"""


async def measure(n: int, parallelism: int, args: argparse.Namespace) -> dict[str, object]:
    """Round times, CPU per endpoint-round and RSS per endpoint for one fleet size and parallelism."""
    sim = sim_config(n, args.servers, args.decode_tps, args.prefill_tps)
    with simulators(sim, args.servers) as bases, tempfile.TemporaryDirectory() as tmp:
        rss0 = rss_mb()
        app = App(
            load_config_text(exporter_config(bases, n, args.tokens, parallelism, tmp, args.workloads)),
            instance="limits",
        )
        await app.start(schedule=False)
        try:
            plan = app._schedule_settings()[2]
            await run_round(plan, app.probes.probe_target)  # warm-up round: connections, caches
            cpu0 = time.process_time()
            walls: list[float] = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                await run_round(plan, app.probes.probe_target)
                walls.append(time.perf_counter() - t0)
                await app.refresh_windows()
            cpu = time.process_time() - cpu0
            results = [o.result for o in app.probes.last_outcomes.values()]
            body = app.exposition.render()
            series = n * args.workloads
            return {
                "endpoints": n,
                "parallelism": parallelism,
                "round_s": walls,
                "runs": len(results),
                "cpu_ms_per_endpoint_round": cpu / (n * args.rounds) * 1e3,
                "cpu_ms_per_series_round": cpu / (series * args.rounds) * 1e3,
                "rss_mb": rss_mb(),
                "rss_mb_per_endpoint": (rss_mb() - rss0) / n,
                "rss_mb_per_series": (rss_mb() - rss0) / series,
                "metrics_kb_per_endpoint": len(body) / n / 1e3,
                "metrics_kb_per_series": len(body) / series / 1e3,
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
        *("--prefill-tps", str(args.prefill_tps), "--workloads", str(args.workloads)),
    ]
    probe_s = probe_seconds(args.workloads, args.tokens, args.decode_tps, args.prefill_tps)
    budget = 120 + 4 * (args.rounds + 1) * n * probe_s  # generous, still bounded
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
    ap.add_argument("--prefill-tps", type=float, default=1e6, help="the simulated servers' prefill rate")
    ap.add_argument(
        "--workloads", type=int, choices=(1, 2, 3), default=1, help="per endpoint: seed000, 1k, 10k input"
    )
    ap.add_argument("--rounds", type=int, default=1, help="timed rounds after one unmeasured round")
    ap.add_argument("--interval", type=float, default=3600.0, help="probe interval for the capacity column")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # "N,P": measure one row, print it as JSON
    args = ap.parse_args()
    if args.one:
        n, p = (int(x) for x in args.one.split(","))
        print(json.dumps(asyncio.run(measure(n, p, args))))
        return

    probe_s = probe_seconds(args.workloads, args.tokens, args.decode_tps, args.prefill_tps)
    print(
        f"servers={args.servers} max_tokens={args.tokens} decode={args.decode_tps:g} tok/s "
        f"prefill={args.prefill_tps:g} tok/s workloads={workloads_yaml(args.workloads, args.tokens)} (probe "
        f"time per endpoint {probe_s:.3f} s: warm-up + timed run of each) rounds={args.rounds} "
        f"interval={args.interval:g}s "
        f"loadavg at start={'/'.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    w = args.workloads
    print(
        "| endpoints | parallelism | round s (measured) | servers' s | overhead ms/probe "
        f"| endpoints per replica at {args.interval:g} s (scaled) | CPU ms per endpoint-round | RSS MB "
        "| RSS MB per endpoint | /metrics KB per endpoint | not ok / disturbed |"
        + (PER_SERIES_HEAD if w > 1 else "")
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if w > 1 else ""))
    for n in args.endpoints:
        for p in args.parallelism:
            row = child(n, p, args)
            walls = [float(w) for w in row["round_s"]]  # type: ignore[union-attr]
            wall = sum(walls) / len(walls)
            serial = serial_probes(n, args.servers, p)  # endpoints on the critical path, each W workloads
            servers_s = serial * probe_s
            overhead_ms = (wall - servers_s) / (serial * w) * 1e3
            capacity = n * args.interval / wall
            rounds = " / ".join(f"{w:.1f}" for w in walls)
            print(
                f"| {n} | {p} | {rounds} | {servers_s:.1f} | {overhead_ms:.0f} "
                f"| {capacity:,.0f} | {row['cpu_ms_per_endpoint_round']:.1f} | {row['rss_mb']:.0f} "
                f"| {row['rss_mb_per_endpoint']:.3f} | {row['metrics_kb_per_endpoint']:.1f} "
                f"| {row['not_ok']} / {row['disturbed']} |"
                + (
                    f" {row['cpu_ms_per_series_round']:.1f} | {row['rss_mb_per_series']:.3f} "
                    f"| {row['metrics_kb_per_series']:.1f} |"
                    if w > 1
                    else ""
                ),
                flush=True,
            )
    print(f"loadavg at end={'/'.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
