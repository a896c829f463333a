"""Measurement error of tokwatch's client-side TTFT and inter-token latency against the simulator's truth.

Starts the simulator in a separate process (so client and server do not share an event loop), streams from
it at several concurrency levels through the same HttpClient, stream parser and timing math the probe uses,
and compares every token's receive time with the time the simulator wrote it (both `time.perf_counter()`,
CLOCK_MONOTONIC, comparable across processes on one host).

    python benchmarks/measurement_error.py [--levels 1,16,64] [--tokens 64] [--rounds 3] [--decode-tps 50]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

from simproc import simulator
from tokwatch.figures.stats import percentile
from tokwatch.figures.timing import itl, token_events, ttft
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.openai import OpenAIStreamParser
from tokwatch.transport.http import HttpClient


@dataclass
class Level:
    """Errors collected at one concurrency level (seconds)."""

    concurrency: int
    ttft_err: list[float] = field(default_factory=list)
    accept_delay: list[float] = field(default_factory=list)  # send -> simulator handler start (server side)
    itl_err: list[float] = field(default_factory=list)
    tokens: int = 0
    cpu_s: float = 0.0
    failures: int = 0


def sim_config(decode_tps: float, jitter: float) -> str:
    """A one-server simulator config (YAML is a JSON superset)."""
    model = {"name": "m", "decode_tps": decode_tps, "prefill_tps": 20000, "jitter": jitter}
    return json.dumps(
        {
            "seed": 1,
            "truth_capacity": 100000,
            "servers": [{"name": "bench", "dialect": "openai", "max_running": 1024, "models": [model]}],
        }
    )


@dataclass
class Stream:
    """One streamed answer as the client saw it."""

    request_id: str
    sent_at: float
    col: StreamCollector


async def one_stream(http: HttpClient, base: str, tokens: int) -> Stream:
    """Stream one answer through the probe's HTTP client, parser and collector."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "measure me"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    parser, col = OpenAIStreamParser(), StreamCollector()
    async with http.stream("POST", f"{base}/bench/v1/chat/completions", json_body=body, timeout=120) as resp:
        request_id = resp.headers.get("x-sim-request-id", "")
        async for t, data in resp.chunks():
            col.add(parser.feed(data, t))
        col.add(parser.close(resp.last_byte_at or time.perf_counter()))
    return Stream(request_id, resp.sent_at, col)


async def compare(http: HttpClient, base: str, stream: Stream, level: Level) -> None:
    """Compare one stream's token times with the simulator's record of it."""
    truth = json.loads(await http.get_text(f"{base}/_sim/requests/{stream.request_id}", timeout=10))
    col = stream.col
    total = col.usage.completion_tokens if col.usage else None
    events, _ = token_events(col.deltas, stream.sent_at, total)
    emitted = truth["emitted_at"]
    if not events or len(emitted) != sum(e.tokens for e in events):
        level.failures += 1
        return
    measured_ttft = ttft(events)
    assert measured_ttft is not None
    # True TTFT on the shared clock: from our send to the simulator writing the first token.
    level.ttft_err.append(measured_ttft - (emitted[0] - stream.sent_at))
    level.accept_delay.append(truth["arrival"] - stream.sent_at)
    true_itl = [b - a for a, b in itertools.pairwise(emitted)]
    level.itl_err.extend(m - t for m, t in zip(itl(events), true_itl, strict=True))
    level.tokens += len(emitted)


async def run_level(base: str, concurrency: int, tokens: int, rounds: int) -> Level:
    """`rounds` waves of `concurrency` simultaneous streams; CPU is counted while streaming only."""
    level = Level(concurrency)
    async with HttpClient(limit=max(concurrency, 10)) as http:
        await one_stream(http, base, 4)  # warm the connection pool and the parser
        for _ in range(rounds):
            cpu0 = time.process_time()
            streams = await asyncio.gather(*(one_stream(http, base, tokens) for _ in range(concurrency)))
            level.cpu_s += time.process_time() - cpu0
            for s in streams:
                await compare(http, base, s, level)
    return level


def ms(v: float) -> str:
    """Milliseconds with three decimals."""
    return f"{v * 1000:8.3f}"


def report(levels: list[Level]) -> str:
    """The results table (errors in ms; ITL/TTFT p50 signed, p99 of absolute error)."""
    head = (
        "| streams | tokens | server accept p50 ms | TTFT err p50 ms | TTFT |err| p99 ms | ITL err p50 ms "
        "| ITL |err| p99 ms | client CPU µs/token | failed |"
    )
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in levels:
        if not lv.itl_err:
            lines.append(f"| {lv.concurrency} | 0 | - | - | - | - | - | - | {lv.failures} |")
            continue
        lines.append(
            f"| {lv.concurrency} | {lv.tokens} | {ms(percentile(lv.accept_delay, 50))} "
            f"| {ms(percentile(lv.ttft_err, 50))} "
            f"| {ms(percentile([abs(x) for x in lv.ttft_err], 99))} | {ms(percentile(lv.itl_err, 50))} "
            f"| {ms(percentile([abs(x) for x in lv.itl_err], 99))} | {lv.cpu_s / lv.tokens * 1e6:8.1f} "
            f"| {lv.failures} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[Level]:
    """Start the simulator process, run every level, stop the simulator."""
    with simulator(sim_config(args.decode_tps, args.jitter)) as base:
        return [await run_level(base, c, args.tokens, args.rounds) for c in args.levels]


def main() -> None:
    """Parse arguments, run, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tps", type=float, default=50.0)
    ap.add_argument("--jitter", type=float, default=0.2)
    args = ap.parse_args()
    levels = asyncio.run(main_async(args))
    print(
        f"decode_tps={args.decode_tps} jitter={args.jitter} tokens/stream={args.tokens} rounds={args.rounds}"
    )
    print(report(levels))


if __name__ == "__main__":
    main()
