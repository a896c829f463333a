"""Which client receive stamps survive a late event loop, and at what CPU cost: the loop's own, the receive
watcher thread's (epoll + FIONREAD, `tokwatch.transport.rxwatch`), the kernel's (`SO_TIMESTAMPNS` on the
loop's own
reads, `tokwatch.transport.kernel_stamps`), or the kernel's split by the watcher.

A few streams at a time (a probe's parallelism) from the simulator in another process, through the probe's
HttpClient and stream parser. Scenarios: `quiet`; `busy_loop` (the client's loop runs pure-Python work for
`--block-ms` every `--every-ms`, as other probes' parsing would); `hogs` (two busy processes at normal
priority saturate both cores). Per token: the stamp minus the time the simulator wrote the token (both
`time.perf_counter()`, CLOCK_MONOTONIC), the client's CPU per token (every thread of the process, the
heartbeats included), and how often the error exceeded the bound `StampLateness` gives by more than the
heartbeat's grain (one period and the floor, 3 ms): it should not.

    python benchmarks/receive_stamps.py [--streams 4] [--tokens 128] [--rounds 5]
        [--scenarios quiet,busy_loop,hogs] [--modes loop,watcher,kernel,kernel+watcher]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from simproc import simulator
from tokwatch.figures.stats import percentile
from tokwatch.figures.timing import token_events
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.openai import OpenAIStreamParser
from tokwatch.transport import kernel_stamps, rxwatch
from tokwatch.transport.http import HttpClient
from tokwatch.transport.measurement import StallMonitor, StampLateness, ThreadHeartbeat, new_loop

MODES = ("loop", "watcher", "kernel", "kernel+watcher")
HOG = "while True:\n    pass\n"


@dataclass
class Result:
    """One mode in one scenario."""

    mode: str
    scenario: str
    errors: list[float] = field(default_factory=list)  # stamp - write time, per token (s)
    beyond_bound: int = 0  # tokens whose error exceeded the lateness bound by more than the heartbeat's grain
    tokens: int = 0
    cpu_s: float = 0.0
    largest_stall: float = 0.0  # the client loop's largest stall (s)
    failures: int = 0


def sim_config(decode_tps: float) -> str:
    """One server, jittered decode (YAML is a JSON superset)."""
    model = {"name": "m", "decode_tps": decode_tps, "prefill_tps": 20000, "jitter": 0.2}
    server = {"name": "s", "dialect": "openai", "max_running": 256, "models": [model]}
    return json.dumps({"seed": 1, "truth_capacity": 100000, "servers": [server]})


async def one_stream(http: HttpClient, base: str, tokens: int) -> tuple[str, float, StreamCollector]:
    """Stream one answer through the probe's client and parser."""
    body = {"model": "m", "messages": [{"role": "user", "content": "stamp me"}], "max_tokens": tokens,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    parser, col = OpenAIStreamParser(), StreamCollector()
    async with http.stream("POST", f"{base}/s/v1/chat/completions", json_body=body, timeout=120) as resp:
        async for t, data in resp.chunks():
            col.add(parser.feed(data, t))
        col.add(parser.close(resp.last_byte_at or time.perf_counter()))
        return resp.headers.get("x-sim-request-id", ""), resp.sent_at, col


async def busy(every_s: float, block_s: float) -> None:
    """Pure-Python work on the client's loop, as other probes' parsing would be (holds the interpreter lock,
    handed over every switch interval)."""
    while True:
        await asyncio.sleep(every_s)
        end = time.perf_counter() + block_s
        while time.perf_counter() < end:
            pass


async def run_mode(mode: str, scenario: str, base: str, args: argparse.Namespace) -> Result:
    """Warm-up stream, then `rounds` waves of `streams` concurrent streams, compared token by token."""
    result = Result(mode, scenario)
    watch = mode.endswith("watcher")
    http = HttpClient(limit=32, watch_receives=watch, kernel_stamps=mode.startswith("kernel"))
    heartbeat = ThreadHeartbeat() if watch else None
    monitor = StallMonitor()
    stamps = StampLateness(monitor, heartbeat)
    async with http:
        await one_stream(http, base, 4)
        side = (
            asyncio.create_task(busy(args.every_ms / 1e3, args.block_ms / 1e3))
            if scenario in ("busy_loop",)
            else None
        )
        try:
            with stamps.watching():
                for _ in range(args.rounds):
                    cpu0 = time.process_time()
                    streams = await asyncio.gather(
                        *(one_stream(http, base, args.tokens) for _ in range(args.streams))
                    )
                    result.cpu_s += time.process_time() - cpu0
                    for request_id, sent_at, col in streams:
                        truth = json.loads(
                            await http.get_text(f"{base}/_sim/requests/{request_id}", timeout=10)
                        )
                        compare(truth, sent_at, col, stamps, result)
                result.largest_stall = monitor.largest_s
        finally:
            if side is not None:
                side.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await side
    return result


def compare(
    truth: dict[str, object], sent_at: float, col: StreamCollector, stamps: StampLateness, r: Result
) -> None:
    """Every token's stamp against the time the simulator wrote it, and against its lateness bound."""
    total = col.usage.completion_tokens if col.usage else None
    events, _ = token_events(col.deltas, sent_at, total)
    emitted = truth["emitted_at"]
    assert isinstance(emitted, list)
    measured = [sent_at + e.t for e in events for _ in range(e.tokens)]
    if not events or len(measured) != len(emitted):
        r.failures += 1
        return
    bounds = stamps.lateness(measured)
    grain = stamps.loop.catch_up_s  # what a heartbeat cannot see: one period and the floor (3 ms)
    for m, w, b in zip(measured, emitted, bounds, strict=True):
        r.errors.append(m - w)
        r.beyond_bound += (m - w) > b + grain
    r.tokens += len(emitted)


@contextlib.contextmanager
def hogs(n: int) -> Iterator[None]:
    """`n` busy processes at normal priority."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def ms(v: float) -> str:
    """Milliseconds, two decimals."""
    return f"{v * 1e3:.2f}"


def row(r: Result) -> str:
    """One table row."""
    if not r.errors:
        return f"| {r.scenario} | {r.mode} | 0 | - | - | - | - | - | - | - | {r.failures} |"
    over1 = sum(e > 0.001 for e in r.errors) / len(r.errors) * 100
    cells = [
        r.scenario,
        r.mode,
        str(r.tokens),
        ms(percentile(r.errors, 50)),
        ms(percentile(r.errors, 99)),
        ms(max(r.errors)),
        f"{over1:.1f} %",
        str(r.beyond_bound),
        f"{r.cpu_s / r.tokens * 1e6:.0f}",
        ms(r.largest_stall),
        str(r.failures),
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    """Parse arguments, run every scenario and mode, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode-tps", type=float, default=100.0)
    ap.add_argument("--every-ms", type=float, default=50.0)
    ap.add_argument("--block-ms", type=float, default=10.0)
    ap.add_argument("--scenarios", default="quiet,busy_loop,hogs")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    if not (rxwatch.available() and kernel_stamps.available()):
        raise SystemExit("the receive watcher and the kernel's stamps need Linux")
    results: list[Result] = []
    with simulator(sim_config(args.decode_tps)) as base:
        for scenario in args.scenarios.split(","):
            with hogs(2 if scenario == "hogs" else 0):
                for mode in args.modes.split(","):
                    with asyncio.Runner(loop_factory=new_loop) as runner:
                        results.append(runner.run(run_mode(mode, scenario, base, args)))
    print(
        f"streams={args.streams} tokens={args.tokens} rounds={args.rounds} decode={args.decode_tps} tok/s "
        f"busy loop: {args.block_ms:g} ms every {args.every_ms:g} ms; load before: {os.getloadavg()[0]:.2f}"
    )
    print(
        "| scenario | stamps | tokens | error p50 ms | error p99 ms | error max ms | error > 1 ms "
        "| beyond bound | client CPU µs/token | largest loop stall ms | failed |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(row(r))


if __name__ == "__main__":
    main()
