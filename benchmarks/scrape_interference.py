"""Does the exporter's own work shift its probes' timings? Probes against the simulator, with and without
/metrics scraped back to back, compared run by run with the simulator's truth.

One exporter (the real `App` with SQLite storage, server-counter watchers and its HTTP server, as `tokwatch
serve` runs it) probes N endpoints on a simulator in another process (true decode rate known, no jitter),
`--parallelism` at a time (all on one simulator, so that is `schedule.per_server`). Phase "quiet": rounds
with nobody scraping. Phase "scraped": the same rounds while a separate process GETs /metrics back to
back. For every timed run, the client-stream tok/s and the TTFT are compared with what the simulator really
did for that request (`GET /_sim/requests?model=...`).

    python benchmarks/scrape_interference.py [--endpoints 120] [--parallelism 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import aiohttp

from exporter_rounds import scheduled_rounds
from simproc import simulator, stop
from tokwatch.figures.result import RunResult, TimingSource
from tokwatch.figures.stats import percentile
from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.service.scheduler import run_round
from tokwatch.settings.config import load_config_text

_SCRAPER = """
import json, signal, sys, time, urllib.request
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
durations, size = [], 0
while not stop:
    t0 = time.perf_counter()
    with urllib.request.urlopen(sys.argv[1], timeout=60) as resp:
        size = len(resp.read())
    durations.append(time.perf_counter() - t0)
print(json.dumps({"scrapes": len(durations), "bytes": size, "durations": durations}), flush=True)
"""


@dataclass
class Phase:
    """Every timed run of one phase, compared with the truth."""

    name: str
    tps_ratio: list[float] = field(default_factory=list)  # measured client-stream tok/s / true tok/s
    ttft_err: list[float] = field(default_factory=list)  # measured TTFT - true TTFT (s)
    disturbed: int = 0
    stalls: list[float] = field(default_factory=list)
    unmatched: int = 0
    scrape: dict[str, object] = field(default_factory=dict)
    gc_pauses: list[float] = field(default_factory=list)  # collections (any thread) of 5 ms or more


class GcPauses:
    """Records every garbage collection of 5 ms or more while active (a pause stalls every thread)."""

    def __init__(self) -> None:
        self.into: list[float] | None = None
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self.into is not None and (d := time.perf_counter() - self._t0) >= 0.005:
            self.into.append(d)


def sim_config(dialect: str, first: int, last: int, decode_tps: float) -> str:
    """One simulated server with one model per endpoint (each run's truth is then found by model)."""
    models = [{"name": f"m{i}", "decode_tps": decode_tps, "prefill_tps": 20000} for i in range(first, last)]
    server = {"name": "s", "dialect": dialect, "max_running": 4096, "models": models}
    return json.dumps({"seed": 1, "truth_capacity": 100000, "servers": [server]})


def exporter_config(
    bases: list[str], endpoints: int, parallelism: int, tokens: int, tmp: str, vllm: int
) -> str:
    """The first `vllm` endpoints are kind vllm on `bases[0]` (their counters are scraped and parsed on the
    main loop); the rest are OpenAI-style on `bases[1]`. Two simulator processes, because the simulator
    renders its vLLM /metrics on its own loop, which would delay the other endpoints' answers."""
    lines = []
    for i in range(endpoints):
        kind, base = ("vllm", bases[0]) if i < vllm else ("openai", bases[1])
        url = f"{base}/s/v1"
        lines.append(
            f"  - {{name: ep{i}, kind: {kind}, base_url: '{url}', model: m{i}, scrape_interval: 5s}}"
        )
    return f"""
probe: {{max_tokens: {tokens}}}
schedule: {{interval: 1h, parallelism: 2, per_server: {parallelism}, run_on_start: false}}
storage: {{sqlite_path: '{tmp}/tw.db', outbox_path: '{tmp}/outbox'}}
endpoints:
""" + "\n".join(lines)


async def truth_of(http: aiohttp.ClientSession, base: str, model: str) -> dict[str, object] | None:
    """The simulator's record of the most recent request for `model` (the timed run)."""
    async with http.get(f"{base}/_sim/requests", params={"model": model, "last": "1"}) as resp:
        found = (await resp.json())["requests"]
    return found[0] if found else None


async def run_phase(app: App, phase: Phase, rounds: int, pauses: GcPauses) -> None:
    """`rounds` rounds; every timed run compared with its truth right after its round."""
    pauses.into = phase.gc_pauses
    try:
        async with aiohttp.ClientSession() as http:
            async for collected in scheduled_rounds(app, rounds):
                for r in collected:
                    ep = app.config.endpoint(r.endpoint)
                    assert ep is not None
                    base = ep.base_url.removesuffix("/s/v1")
                    compare(r, await truth_of(http, base, ep.model), phase, with_ttft=ep.kind == "openai")
    finally:
        pauses.into = None


def compare(r: RunResult, truth: dict[str, object] | None, phase: Phase, *, with_ttft: bool) -> None:
    """Client-stream tok/s and TTFT of one run against the simulator's truth.

    TTFT is compared for the OpenAI-style endpoints only: the vLLM simulator's arrival stamp is taken when
    its handler starts, which its own /metrics rendering can delay (server-side, not a client error)."""
    measured = r.candidates.get(TimingSource.CLIENT_STREAM)
    emitted = truth.get("emitted_at") if truth else None
    if not r.ok or measured is None or r.ttft_s is None or not isinstance(emitted, list) or len(emitted) < 2:
        phase.unmatched += 1
        return
    true_tps = (len(emitted) - 1) / (emitted[-1] - emitted[0])
    phase.tps_ratio.append(measured / true_tps)
    arrival = truth["arrival"] if truth else None
    assert isinstance(arrival, float)
    if with_ttft:
        # Our clock starts before the request reaches the simulator; the transit (~0.1 ms on loopback)
        # is part of the error figure.
        phase.ttft_err.append(r.ttft_s - (emitted[0] - arrival))
    phase.disturbed += r.timing_disturbed
    phase.stalls.append(r.max_stall_s or 0.0)


def start_scraper(url: str) -> subprocess.Popen[str]:
    """A separate process scraping `url` back to back until SIGTERM."""
    return subprocess.Popen([sys.executable, "-c", _SCRAPER, url], stdout=subprocess.PIPE, text=True)


def stop_scraper(proc: subprocess.Popen[str]) -> dict[str, object]:
    """Stop the scraper; its counts and durations."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        stop(proc)
        return {}
    return json.loads(out) if out.strip() else {}


async def main_async(args: argparse.Namespace) -> list[Phase]:
    """Simulator process, exporter in this process, the two phases."""
    n, v = args.endpoints, args.vllm
    with (
        simulator(sim_config("vllm", 0, v, args.decode_tps)) as vllm_base,
        simulator(sim_config("openai", v, n, args.decode_tps)) as openai_base,
        tempfile.TemporaryDirectory() as tmp,
    ):
        bases = [vllm_base, openai_base]
        cfg = load_config_text(exporter_config(bases, n, args.parallelism, args.max_tokens, tmp, v))
        app = App(cfg, instance="bench")
        await app.start(schedule=False)
        runner, port = await start_site(app, "127.0.0.1", 0)
        phases = [Phase("quiet"), Phase("scraped")]
        pauses = GcPauses()
        try:
            # warm every connection and watcher
            await run_round(app._schedule_settings()[2], app.probes.probe_target)
            await run_phase(app, phases[0], args.rounds, pauses)
            scraper = await asyncio.to_thread(start_scraper, f"http://127.0.0.1:{port}/metrics")
            try:
                await asyncio.sleep(1.0)  # let back-to-back scraping start
                await run_phase(app, phases[1], args.rounds, pauses)
            finally:
                phases[1].scrape = await asyncio.to_thread(stop_scraper, scraper)
        finally:
            await runner.cleanup()
            await app.stop()
        return phases


def row(p: Phase) -> str:
    """One table row."""
    n = len(p.tps_ratio)
    if n == 0:
        return f"| {p.name} | 0 | - | - | - | - | - | - | - | - | {p.unmatched} |"
    within = sum(abs(x - 1) <= 0.10 for x in p.tps_ratio) / n * 100
    beyond = sum(x > 1.5 or x < 1 / 1.5 for x in p.tps_ratio)
    err = [abs(x - 1) * 100 for x in p.tps_ratio]
    ttft = [abs(x) * 1e3 for x in p.ttft_err]
    return (
        f"| {p.name} | {n} | {within:.1f} % | {beyond} "
        f"| {percentile(err, 50):.2f} / {percentile(err, 99):.2f} "
        f"| {percentile(ttft, 50):.2f} / {percentile(ttft, 99):.2f} | {p.disturbed} "
        f"| {percentile(p.stalls, 99) * 1e3:.1f} / {max(p.stalls) * 1e3:.1f} | {_scrapes(p)} "
        f"| {len(p.gc_pauses)} / {max(p.gc_pauses, default=0) * 1e3:.0f} | {p.unmatched} |"
    )


def _scrapes(p: Phase) -> str:
    durations = p.scrape.get("durations")
    if not isinstance(durations, list) or not durations:
        return "-"
    return (
        f"{len(durations)} x {int(p.scrape.get('bytes', 0)) / 1e6:.2f} MB, "  # type: ignore[call-overload]
        f"p50 {percentile(durations, 50) * 1e3:.1f} ms"
    )


def main() -> None:
    """Parse arguments, run, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", type=int, default=120)
    ap.add_argument("--vllm", type=int, default=2, help="how many endpoints are kind vllm (counters)")
    ap.add_argument("--parallelism", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tps", type=float, default=200.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    t0 = time.monotonic()
    phases = asyncio.run(main_async(args))
    print(
        f"endpoints={args.endpoints} (vllm {args.vllm}) parallelism={args.parallelism} rounds={args.rounds} "
        f"true decode={args.decode_tps} tok/s max_tokens={args.max_tokens} ({time.monotonic() - t0:.0f} s)"
    )
    print(
        "| phase | runs | within 10 % of truth | beyond 1.5x | tok/s |err| p50/p99 % | TTFT |err| p50/p99 ms "
        "| timing_disturbed | max stall p99/max ms | /metrics scrapes | GC pauses >= 5 ms: n / max ms "
        "| unmatched |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for p in phases:
        print(row(p))


if __name__ == "__main__":
    main()
