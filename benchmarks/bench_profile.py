"""Where does `tokwatch bench` spend its CPU per request? A sampling profile of one run against refserver.

Starts a reference server (`benchmarks/refserver.py`, TTFT 0, 1 ms between tokens, 32 tokens by default) and
runs `python -m tokwatch bench` against it under py-spy (`pip install py-spy`; sampling, so the profile does
not slow the code it measures), or in this process under cProfile (`--profiler cprofile`: deterministic, but
its per-call overhead inflates small functions). Prints the run's own CPU per request (`summary.json`), the
share of samples per stage of a request (dispatch, send, receive and stamp, stream parsing,
per-request figures, end-of-run work, start-up), and the functions with the most samples of their own.

py-spy counts a thread waiting in epoll as running, and without native frames (`--native`) it cannot tell
that wait from the event loop's C code: the "event loop" share then includes idle time. `--native` sorts
them apart (samples whose innermost frame is a wait are left out) but stops the process for every sample,
which slows it several-fold, and it has been seen to attribute samples to the garbage collector that a
`gc.callbacks` count did not find: read its shares as hints, and check a suspect with an A/B run of
`benchmarks/bench_capacity.py`.

    python benchmarks/bench_profile.py                            # open loop, Poisson 800 req/s, 10 s
    python benchmarks/bench_profile.py --rate 400 --arrivals constant
    python benchmarks/bench_profile.py --concurrency 16           # closed loop
    python benchmarks/bench_profile.py --profiler cprofile --top 40
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_capacity import SERVER_ENGINE_HELP, load_average, start_refserver, stop
from tokwatch.cli import main as tokwatch_main

START_UP = "start-up (imports)"
END_OF_RUN = "end of run: figures and files"
OUTSIDE_RUN = (START_UP, END_OF_RUN)  # stages outside summary.json's in-run CPU figure
# A sample's stage: the first pattern below found in its stack (inner stages are listed before their callers).
STAGES = (
    (START_UP, "_find_and_load"),
    (END_OF_RUN, "write_run ("),
    (END_OF_RUN, "BenchOutcome."),
    ("per-request figures", "fill_figures"),  # the exchange's and the bench's _fill_figures
    ("stream parsing (SSE, JSON, think tags)", "StreamParser.feed"),
    ("stream parsing (SSE, JSON, think tags)", "StreamParser.close"),
    ("stream parsing (SSE, JSON, think tags)", "tokwatch.streams"),
    ("collecting events", "StreamCollector."),
    ("stall heartbeat", "StallMonitor"),
    ("open-loop dispatch", "PreciseTimer."),
    ("receive watcher thread", "ReceiveWatcher._run"),
    ("receive: connection protocol (stamps, HTTP framing)", "_Connection."),
    ("receive: handing pieces to the reader", "StreamResponse."),
    # What is left of a kernel-stamped read once its framing is counted above: the `recvmsg` system call, its
    # buffer and the kernel's time (uvloop's C transport does the same read for the floor).
    ("receive: the socket read (recvmsg, kernel stamp)", "KernelStampedTransport._on_readable"),
    ("send: the socket write", "KernelStampedTransport.write"),
    ("send: opening connections", "_Pool."),
    ("send: tokwatch.transport.http", "HttpClient."),
    ("request bookkeeping (execute, runner)", "execute ("),
    ("request bookkeeping (execute, runner)", "BenchRunner._send"),
    ("open-loop dispatch", "BenchRunner._open_loop"),
    ("closed-loop dispatch", "BenchRunner._closed_loop"),
)
LOOP = "event loop and sockets (C: uvloop/asyncio, system calls; without --native also waiting in epoll)"
GC = "garbage collector"
# Native leaf frames of a thread that waits: py-spy samples it as active (the kernel says "running" while it
# enters or leaves the call), so these samples are counted apart and left out of the shares.
IDLE_CALLS = ("epoll_wait", "epoll_pwait", "poll (", "select (", "clock_nanosleep", "nanosleep", "futex")


def stage(stack: str) -> str:
    """The stage a sampled stack belongs to."""
    if "gc_collect" in stack:
        return GC
    for name, pattern in STAGES:
        if pattern in stack:
            return name
    frames = [f for f in stack.split(";") if ".py:" in f or "<frozen" in f]  # the Python frames
    leaf = frames[-1] if frames else ""
    if not leaf or leaf.startswith(("Runner.run", "run_until_complete", "BaseEventLoop.")):
        return LOOP
    return "other"


def bench_command(port: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The `tokwatch bench` arguments of the profiled run."""
    cmd = ["bench", "--url", f"http://127.0.0.1:{port}/v1", "--kind", "openai", "--model", "ref"]
    cmd += ["--no-server-metrics", "--no-store", "--live-interval", "3600", "--warmup", "0"]
    cmd += ["--input-tokens", "128", "--output-tokens", str(args.tokens), "--duration", f"{args.duration:g}"]
    cmd += ["--receive-watcher", args.receive_watcher, "--output-dir", str(out)]
    if args.concurrency:
        cmd += ["--concurrency", str(args.concurrency)]
    else:
        cmd += ["--rate", f"{args.rate:g}", "--arrivals", args.arrivals]
    return cmd


def py_spy(port: int, args: argparse.Namespace, out: Path, raw: Path) -> None:
    """Run the bench under `py-spy record` (raw collapsed stacks, every thread, native frames off)."""
    exe = shutil.which("py-spy")
    if exe is None:
        raise SystemExit("py-spy is not installed (pip install py-spy), or use --profiler cprofile")
    cmd = [exe, "record", "--rate", str(args.sample_rate), "--format", "raw", "--output", str(raw)]
    cmd += ["--native"] if args.native else []
    cmd += ["--threads", "--", sys.executable, "-m", "tokwatch", *bench_command(port, args, out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration * 10 + 120, check=False)
    if done.returncode not in (0, 1) or not raw.is_file():
        raise SystemExit(f"py-spy failed ({done.returncode}): {done.stderr[-2000:]}")


def report_samples(raw: Path, top: int, cpu_per_request_us: float) -> None:
    """Shares per stage, the run's CPU per request split by stage, and the functions with the most own
    samples."""
    stages: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        # py-spy --threads puts "thread (0x...)" first: keep the stack below it
        frames = stack.split(";")
        if frames and frames[0].startswith("thread ("):
            frames = frames[1:]
        if frames and frames[-1].startswith(IDLE_CALLS):
            idle += n
            continue
        total += n
        stages[stage(";".join(frames))] += n
        own[frames[-1] if frames else "?"] += n
    if not total:
        print("no samples")
        return
    print(
        f"\n{total} samples on a CPU (every thread; {idle} more waiting in epoll/sleep/locks, left out)\n\n"
        "| stage | share |\n|---|---:|"
    )
    for name, n in stages.most_common():
        print(f"| {name} | {100 * n / total:.1f} % |")
    # summary.json's CPU per request covers the run alone: share it out by the samples taken during the run.
    in_run = total - sum(stages[name] for name in OUTSIDE_RUN)
    if in_run:
        print(
            f"\nDuring the run ({in_run} samples): its {cpu_per_request_us:.0f} µs of CPU per request by "
            "stage\n\n| stage | µs per request |\n|---|---:|"
        )
        for name, n in stages.most_common():
            if name not in OUTSIDE_RUN:
                print(f"| {name} | {cpu_per_request_us * n / in_run:.0f} |")
    print(f"\nTop {top} functions by own samples:\n")
    for name, n in own.most_common(top):
        print(f"{100 * n / total:5.1f} %  {name}")


def cprofile_run(port: int, args: argparse.Namespace, out: Path, top: int) -> None:
    """Run the bench in this process under cProfile; print the top functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        tokwatch_main(bench_command(port, args, out))
    except SystemExit:
        pass
    finally:
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print(buf.getvalue())


def main() -> int:
    """Profile one run and print where its CPU went."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rate", type=float, default=800.0)
    ap.add_argument("--arrivals", default="poisson", choices=("poisson", "constant"))
    ap.add_argument("--concurrency", type=int, help="closed loop with N streams instead of an open loop")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--receive-watcher", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--profiler", default="py-spy", choices=("py-spy", "cprofile"))
    ap.add_argument("--sample-rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--native", action="store_true", help="py-spy: native frames (slow; see above)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--gap", type=float, default=0.001)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--server-engine", choices=("loop", "threads"), default="loop", help=SERVER_ENGINE_HELP)
    args = ap.parse_args()
    load = f"closed loop c={args.concurrency}" if args.concurrency else f"{args.arrivals} {args.rate:g}/s"
    print(f"# profile: tokwatch bench, {load}, {args.duration:g} s, {args.profiler}; load {load_average()}")
    proc, port = start_refserver(args)
    try:
        with tempfile.TemporaryDirectory() as tmpdir:
            out = Path(tmpdir) / "run"
            raw = args.raw or Path(tmpdir) / "stacks.txt"
            if args.profiler == "py-spy":
                py_spy(port, args, out, raw)
            else:
                asyncio.set_event_loop(None)
                cprofile_run(port, args, out, args.top)
            summary = json.loads((out / "summary.json").read_text())
            client = summary["client"]
            sent = summary.get("achieved_send_rate_per_s") or 0.0
            per_request = client["cpu_per_request_s"] * 1e3
            print(
                f"run: {json.dumps(summary['requests'])[:300]}, achieved send rate {sent:.1f}/s\n"
                f"client: CPU {per_request:.3f} ms per request ({client['cpu_s']:.2f} s), "
                + ", ".join(f"{k} {v}" for k, v in client.items() if isinstance(v, str))
            )
            if args.profiler == "py-spy":
                report_samples(raw, args.top, per_request * 1e3)
    finally:
        stop(proc)
    print(f"load average after: {load_average()} ({os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
