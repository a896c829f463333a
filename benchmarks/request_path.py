"""The Python a benchmark request costs once its bytes are read: HTTP framing, stream parsing, collecting,
per-request figures and the next request's workload — µs per request, without sockets or an event loop.

Replays `benchmarks/refserver.py`'s answer (32 tokens, one HTTP chunk per read, then usage and `[DONE]`)
through the bench's own code (`ChunkedBody`, the OpenAI stream parser, `StreamCollector`, the exchange's
`fill_figures` and the bench's `_fill_figures`, `SyntheticWorkload.request_at`) many times, and prints the
median of several repeats per stage. `--baseline PATH` runs the same in a child process with another
tokwatch tree first on PYTHONPATH and prints both side by side with their ratio (what a change to the
per-request path saves, without the capacity ladder's run-to-run noise; `benchmarks/bench_capacity.py`
then says what it is worth end to end).

    python benchmarks/request_path.py
    python benchmarks/request_path.py --baseline /tmp/base/exporter
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from refserver import Answer
from tokwatch.bench.client import Deadlines, _fill_figures
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.workload import LengthRange, SyntheticWorkload
from tokwatch.probes.openai import OpenAIProbe
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.openai import OpenAIStreamParser
from tokwatch.transport.http_wire import ChunkedBody
from tokwatch.transport.measurement import StallMonitor, StampLateness

try:
    from tokwatch.probes.exchange import Exchange, fill_figures
except ImportError:  # a baseline tree from before the exchange
    Exchange, fill_figures = None, None  # type: ignore[assignment, misc]
try:
    from tokwatch.probes.exchange import latencies_beyond_tolerance

    try:
        from tokwatch.bench.run_bounds import CLIENT_TOLERANCE
    except ImportError:  # a tree from before the bench bounded its published figures
        from tokwatch.bench.client import CLIENT_TOLERANCE  # type: ignore[attr-defined, no-redef]
except ImportError:  # a tree from before the bench judged its requests by the figures' bounds
    CLIENT_TOLERANCE, latencies_beyond_tolerance = None, None  # type: ignore[assignment]

READ_GAP_S = 0.001  # stamps 1 ms apart, as refserver's default schedule


def answer_reads(tokens: int) -> list[bytes]:
    """The reads of one answer's body as the client gets them on a quiet host: one HTTP chunk each."""
    answer = Answer("ref-1", "ref", tokens, 128)
    return [answer.token(k) for k in range(tokens)] + [answer.tail]


def _framed(reads: list[bytes]) -> list[bytes]:
    body = ChunkedBody()
    return [body.feed(r) for r in reads]


def _parsed(pieces: list[bytes]) -> StreamCollector:
    parser = OpenAIStreamParser()
    collector = StreamCollector()
    t = 0.0
    for piece in pieces:
        t += READ_GAP_S
        collector.add(parser.feed(piece, t))
    collector.add(parser.close(t))
    return collector


def _stamps() -> StampLateness:
    """The loop's lateness as a run has it: a stall recorded long before these requests (so every request
    looks its stamps up, and none is covered)."""
    monitor = StallMonitor()
    monitor.record(-100.0, 0.01)
    return StampLateness(monitor)


STAMPS = _stamps()


def _figures(collector: StreamCollector, end: float) -> RequestRecord:
    """Everything the bench works out of a read answer: counts, figures, their stamps' lateness (and, after
    the exchange, the figures' error bounds judged against the tolerance)."""
    record = RequestRecord(0, "chat")
    if fill_figures is None:  # a tree from before the exchange (a `--baseline`): the bench filled them itself
        _fill_figures(record, collector, 0.0, end, Deadlines(1.0, 0.1))  # type: ignore[arg-type, call-arg]
        stamps = [*(d.t for d in collector.deltas), end]
        record.stamp_lateness_s = max(STAMPS.lateness(stamps, watched=False))
        return record
    ex = Exchange(sent_at=0.0, collector=collector)
    fill_figures(ex, OpenAIProbe, end, STAMPS)
    _fill_figures(record, ex, Deadlines(1.0, 0.1))
    if latencies_beyond_tolerance is not None:
        record.beyond_tolerance = latencies_beyond_tolerance(ex, CLIENT_TOLERANCE)
    return record


def measure(tokens: int, requests: int, repeats: int) -> dict[str, float]:
    """Median µs per request of each stage over `repeats` passes of `requests` requests."""
    reads = answer_reads(tokens)
    pieces = _framed(reads)
    collector = _parsed(pieces)
    end = READ_GAP_S * len(reads)
    record = _figures(collector, end)
    if record.output_tokens != tokens or record.ttft_s is None:
        raise SystemExit(f"replay went wrong: {record.output_tokens} tokens, TTFT {record.ttft_s}")
    # A salted run (fresh prompts, the default) as `tokwatch bench` builds it.
    workload = SyntheticWorkload(LengthRange(128, 128), LengthRange(tokens, tokens), seed=1, salt="0123abcd")
    stages: dict[str, Callable[[int], Any]] = {
        "HTTP framing (ChunkedBody)": lambda i: _framed(reads),
        "stream parsing and collecting": lambda i: _parsed(pieces),
        "per-request figures": lambda i: _figures(collector, end),
        "next request (workload)": workload.request_at,
    }
    out: dict[str, float] = {}
    for name, work in stages.items():
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(requests):
                work(i)
            runs.append((time.perf_counter() - t0) / requests * 1e6)
        out[name] = statistics.median(runs)
    out["total"] = sum(out.values())
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure this tree, and the baseline's in a child process when asked; print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2000, help="requests per repeat")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--baseline", type=Path, help="another tokwatch tree (the directory holding tokwatch/)")
    ap.add_argument("--json", action="store_true", help="(internal) print this tree's figures as JSON")
    args = ap.parse_args(argv)
    mine = measure(args.tokens, args.requests, args.repeats)
    if args.json:
        print(json.dumps(mine))
        return 0
    base: dict[str, float] | None = None
    if args.baseline is not None:
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join([str(args.baseline.resolve()), here, env.get("PYTHONPATH", "")])
        cmd = [sys.executable, __file__, "--json", "--tokens", str(args.tokens)]
        cmd += ["--requests", str(args.requests), "--repeats", str(args.repeats)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            print(f"baseline failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
            return 1
        base = json.loads(done.stdout)
    print(f"# request path: {args.tokens} tokens, {args.requests} requests x {args.repeats} repeats (median)")
    print("\n| stage | µs/request | baseline µs/request | ratio |\n|---|---:|---:|---:|")
    for name, us in mine.items():
        b = base.get(name) if base else None
        ratio = f"{us / b:.2f}" if b else ""
        print(f"| {name} | {us:.1f} | {'' if b is None else f'{b:.1f}'} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
