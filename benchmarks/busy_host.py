"""Figures on a busy host: the exporter probing the simulator while CPU hogs saturate the machine, run by
run against the simulator's truth, side by side with the hogs off.

The real exporter (`App` with SQLite storage, server-counter watchers, scheduled rounds) probes `--servers`
simulated servers, each with an OpenAI-style endpoint (client-timed tok/s), a llama.cpp one (engine
timings) and a vLLM one (counter deltas), in a simulator process of its own. Phases:

- `off`: no hog (the machine may still be loaded by others: `uptime` is printed beside the figures);
- `hogs`: one busy process per core at normal priority, so the exporter competes for every core;
- `quota`: the exporter pinned to one core (taskset-style affinity, every thread) that one busy process
  shares, the simulator on the other: about half a core, as a pod at a Kubernetes CPU limit gets;
- `request=M`: the same shared core, with every exporter thread at the nice level whose scheduler weight
  against the busy process's is that of an M-millicore CPU request against a pod requesting the whole core
  (Kubernetes turns requests into the same CFS weights: 1024 per core): what the exporter gets on a
  saturated node for its request.

Every exporter thread runs at the phase's priority, the receive watcher's included (as root it would raise
its own; a pod without CAP_SYS_NICE cannot). No cgroup is created: affinity and nice only.

Per phase: runs, how many kept their status in the window figures (they all should), how many kept a tok/s
sample (not set aside), the error of every kept tok/s against the truth of its own source's definition
(client stream: (n - 1) / (last - first write); llama.cpp engine timings and vLLM's per-request counter
histograms: (n - 1) / decode time), the error of the set-aside ones, and TTFT kept.

    python benchmarks/busy_host.py [--servers 4] [--rounds 5] [--max-tokens 256] [--decode-tps 100]
        [--phases off,hogs,quota,request=50,request=250]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from exporter_rounds import scheduled_rounds
from simproc import simulators
from tokwatch.figures.result import RunResult, TimingSource
from tokwatch.figures.stats import percentile
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.storage.window import window_figures
from tokwatch.windows.window_rule import WindowRule

HOG = "while True:\n    pass\n"
# The kernel's CFS weight of each nice level 0..19 (kernel/sched/core.c, sched_prio_to_weight).
NICE_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15)
KINDS = {"oa": "openai", "lc": "llamacpp", "vl": "vllm"}  # simulated server name -> endpoint kind


@dataclass
class Phase:
    """Every timed run of one phase, compared with the truth."""

    name: str
    runs: int = 0
    ok: int = 0
    window_runs: int = 0  # runs the store's window figures count
    window_ok: int = 0
    kept_err: list[float] = field(default_factory=list)  # |kept tok/s / truth - 1|
    kept_by_source: dict[str, list[float]] = field(default_factory=dict)  # source -> |error| of each
    aside_err: list[float] = field(default_factory=list)  # |set-aside tok/s / truth - 1|
    aside_bound: list[float] = field(default_factory=list)  # their error bounds
    ttft_kept: int = 0
    ttft_runs: int = 0
    stalls: list[float] = field(default_factory=list)
    unmatched: int = 0
    load: str = ""


def sim_config(decode_tps: float) -> str:
    """The three dialects on one simulated host (one `server` for the scheduler: probed one after another)."""
    model = {"name": "m", "decode_tps": decode_tps, "prefill_tps": 20000}
    servers = [
        {"name": name, "dialect": kind, "max_running": 64, "models": [model]} for name, kind in KINDS.items()
    ]
    return json.dumps({"seed": 1, "truth_capacity": 100000, "servers": servers})


def exporter_config(bases: list[str], max_tokens: int, tmp: str) -> str:
    """Every simulated host's three endpoints; parallelism = hosts, so they are all probed at once."""
    lines = []
    for i, base in enumerate(bases):
        for name, kind in KINDS.items():
            url = f"{base}/{name}" + ("/v1" if kind != "llamacpp" else "")
            lines.append(
                f"  - {{name: {name}{i}, kind: {kind}, base_url: '{url}', model: m, scrape_interval: 5s}}"
            )
    return f"""
probe: {{max_tokens: {max_tokens}}}
schedule: {{interval: 1h, parallelism: {len(bases)}, run_on_start: false}}
storage: {{sqlite_path: '{tmp}/tw.db', outbox_path: '{tmp}/outbox'}}
endpoints:
""" + "\n".join(lines)


def truth_tps(source: TimingSource, truth: dict[str, object]) -> float | None:
    """The simulator's truth in the definition of the figure's own source (docs/methodology.md)."""
    generated, emitted = truth.get("generated_at"), truth.get("emitted_at")
    if not isinstance(generated, list) or not isinstance(emitted, list) or len(generated) < 2:
        return None
    n, decode = len(generated), generated[-1] - generated[0]
    if source in (TimingSource.ENGINE, TimingSource.VLLM_METRICS):
        return (n - 1) / decode  # timings.predicted_per_second; vLLM's per-request histograms
    if source is TimingSource.CLIENT_STREAM:
        return (len(emitted) - 1) / (emitted[-1] - emitted[0])
    return None


async def truth_of(http: aiohttp.ClientSession, base: str, server: str) -> dict[str, object] | None:
    """The simulator's record of the server's most recent request (the timed run)."""
    async with http.get(f"{base}/_sim/requests", params={"model": "m", "last": "50"}) as resp:
        found = [r for r in (await resp.json())["requests"] if r["server"] == server]
    return found[-1] if found else None


def compare(r: RunResult, truth: dict[str, object] | None, phase: Phase) -> None:
    """One run's kept or set-aside tok/s against the truth."""
    phase.runs += 1
    phase.ok += r.ok
    phase.stalls.append(r.max_stall_s or 0.0)
    if r.ttft_s is not None:
        phase.ttft_runs += 1
        phase.ttft_kept += "ttft" not in r.set_aside
    if not r.ok or r.source is None or r.tokens_per_second is None or truth is None:
        phase.unmatched += not r.ok or truth is None
        return
    true = truth_tps(r.source, truth)
    if true is None:
        phase.unmatched += 1
        return
    err = abs(r.tokens_per_second / true - 1)
    if r.tps_set_aside:
        phase.aside_err.append(err)
        phase.aside_bound.append(r.tps_error_ratio or 0.0)
    else:
        phase.kept_err.append(err)
        phase.kept_by_source.setdefault(r.source.value, []).append(err)


@contextlib.contextmanager
def hogs(cores: list[set[int] | None]) -> Iterator[None]:
    """One busy process per entry, pinned to those cores (None: anywhere), at normal priority."""
    procs = []
    for cpus in cores:
        p = subprocess.Popen([sys.executable, "-c", HOG])
        if cpus is not None:
            os.sched_setaffinity(p.pid, cpus)
        procs.append(p)
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def pin_process(cpus: set[int], nice: int) -> None:
    """Every thread of this process (and those it starts later) onto `cpus`, at priority `nice`."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def nice_for(millicores: int) -> int:
    """The nice level whose weight against nice 0 is closest to an M-millicore request against 1000."""
    want = millicores * 1024 / 1000
    return min(range(len(NICE_WEIGHTS)), key=lambda n: abs(NICE_WEIGHTS[n] - want))


async def run_phase(name: str, bases: list[str], sim_pid: int, args: argparse.Namespace) -> Phase:
    """A fresh exporter and store, `rounds` scheduled rounds, every timed run compared with its truth."""
    phase = Phase(name)
    every = set(range(os.cpu_count() or 1))
    shared = (name == "quota" or name.startswith("request=")) and len(every) >= 2
    nice = nice_for(int(name.split("=", 1)[1])) if name.startswith("request=") else 0
    cpus = {0} if shared else every
    cores: list[set[int] | None] = [{0}] if shared else [None] * len(every) if name == "hogs" else []
    with tempfile.TemporaryDirectory() as tmp:
        if shared:
            os.sched_setaffinity(sim_pid, every - {0})
        try:
            with hogs(cores):
                pin_process(cpus, nice)
                await asyncio.sleep(1.0)  # let the hogs take the cores
                await probe_rounds(phase, bases, tmp, args, lambda: pin_process(cpus, nice))
                phase.load = f"{os.getloadavg()[0]:.2f}"  # the last minute: most of the phase
        finally:
            pin_process(every, 0)
            if shared:
                os.sched_setaffinity(sim_pid, every)
    return phase


async def probe_rounds(
    phase: Phase, bases: list[str], tmp: str, args: argparse.Namespace, settle: Callable[[], None]
) -> None:
    """The exporter as `tokwatch serve` runs it, without the HTTP server: rounds, store, window figures;
    `settle` puts the threads it started (the measurement loop, the receive watcher) where the phase wants."""
    app = App(load_config_text(exporter_config(bases, args.max_tokens, tmp)), instance="busy-host")
    await app.start(schedule=False)
    settle()
    try:
        async with aiohttp.ClientSession() as http:
            started = time.time()
            async for collected in scheduled_rounds(app, args.rounds):
                for r in collected:
                    ep = app.config.endpoint(r.endpoint)
                    assert ep is not None
                    server = r.endpoint.rstrip("0123456789")
                    base = ep.base_url.split(f"/{server}")[0]
                    compare(r, await truth_of(http, base, server), phase)
            assert app.store is not None
            span = time.time() - started + 60  # this phase's runs (the store is the phase's own)
            figures = await window_figures(app.store, time.time() + 1, rule=WindowRule(), window_s=span)
            phase.window_runs = sum(f.runs for f in figures.values())
            phase.window_ok = sum(f.ok_runs for f in figures.values())
    finally:
        await app.stop()


def row(p: Phase) -> str:
    """One table row."""
    kept = len(p.kept_err)
    ok_tps = kept + len(p.aside_err)
    worst = max(p.kept_err, default=0.0) * 100
    within = sum(e <= 0.02 for e in p.kept_err)
    aside = "-"
    if p.aside_err:
        aside = (
            f"{len(p.aside_err)}: err p50 {percentile(p.aside_err, 50) * 100:.1f} %, bound p50 "
            f"{percentile(p.aside_bound, 50) * 100:.1f} %"
        )
    sources = ", ".join(
        f"{k} {len(v)} (worst {max(v) * 100:.2f} %)" for k, v in sorted(p.kept_by_source.items())
    )
    stall = (
        f"{percentile(p.stalls, 99) * 1e3:.0f} / {max(p.stalls, default=0.0) * 1e3:.0f}" if p.stalls else "-"
    )
    client_kept = len(p.kept_by_source.get(TimingSource.CLIENT_STREAM.value, []))
    client = client_kept + len(p.aside_err)
    cells = [
        p.name,
        p.load,
        str(p.runs),
        f"{p.window_runs}/{p.runs} ({p.window_ok} ok)",
        f"{kept}/{ok_tps} ({kept / ok_tps * 100 if ok_tps else 0:.1f} %)",
        f"{client_kept}/{client} ({client_kept / client * 100 if client else 0:.1f} %)",
        f"{client_kept + sum(b <= 0.02 for b in p.aside_bound)}/{client}",
        f"{within}/{kept}, worst {worst:.2f} %",
        sources,
        aside,
        f"{p.ttft_kept}/{p.ttft_runs}",
        stall,
        str(p.unmatched),
    ]
    return "| " + " | ".join(cells) + " |"


async def main_async(args: argparse.Namespace) -> list[Phase]:
    """The simulator process, then every phase with a fresh exporter in this process."""
    phases = []
    with simulators(sim_config(args.decode_tps), args.servers) as bases:
        sim_pid = _only_child()
        for name in args.phases.split(","):
            phases.append(await run_phase(name, bases, sim_pid, args))
    return phases


def _only_child() -> int:
    """The simulator's pid: the one child this process has before any hog starts."""
    children = Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()
    if len(children) != 1:
        raise SystemExit(f"expected the simulator as the only child process, found {children}")
    return int(children[0])


def main() -> None:
    """Parse arguments, run, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--decode-tps", type=float, default=100.0)
    ap.add_argument("--phases", default="off,hogs,quota")
    args = ap.parse_args()
    t0 = time.monotonic()
    phases = asyncio.run(main_async(args))
    print(
        f"servers={args.servers} x (openai, llamacpp, vllm) rounds={args.rounds} "
        f"max_tokens={args.max_tokens} "
        f"true decode={args.decode_tps} tok/s cores={os.cpu_count()} ({time.monotonic() - t0:.0f} s)"
    )
    print(
        "| phase | load (1 min, at the end) | runs | status counted in window | tok/s kept"
        " | client tok/s kept | at a 2 % tolerance | kept within 2 % of truth | kept by source (worst error)"
        " | tok/s set aside | TTFT kept | max stall p99/max ms | unmatched |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for p in phases:
        print(row(p))


if __name__ == "__main__":
    main()
