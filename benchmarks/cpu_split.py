"""Where a client's CPU per request goes, by layer, beside the raw asyncio floor: the kernel, the Python
interpreter, the event loop's C code, libc — and how many system calls of each kind a request makes.

Each client (`bench_capacity.py`'s floor, optionally the floor that decodes every event's JSON, and
`tokwatch bench`, one or more builds) runs one load point against `benchmarks/refserver.py` in the same
session. In the middle of the run two windows of the same length are observed from outside the process:
`perf record -e cpu-clock` (samples, whatever the code: C, Python, kernel) and then `perf trace -s` (system
calls by name). CPU per request by layer is the record window's samples over the requests the client sent
in that window (from its own records: perf_counter is CLOCK_MONOTONIC, one clock for every process);
system calls per request are the trace window's over its sends (one per request for every client here).
Tracing every system call slows a client down, so only the counts come from that window. Nothing runs
inside the clients, so what they spend is what they spend in a ladder run.

The question it answers: is a client's extra CPU in the kernel (more system calls, more wake-ups) or in
user space, and there in the interpreter or in C. Needs `perf` (Debian's linux-perf) with permission to
attach to a process (root, or `kernel.perf_event_paranoid` <= 1).

    python benchmarks/cpu_split.py --rate 400
    python benchmarks/cpu_split.py --concurrency 1 --floor-json --build now=exporter --build before=/tmp/b
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_capacity import (
    MAX_CONNECTIONS,
    SERVER_ENGINE_HELP,
    Rung,
    floor_command,
    load_average,
    machine,
    parse_builds,
    start_refserver,
    stop,
    tokwatch_command,
)

COMPILED = "compiled (mypyc)"  # benchmarks/compiled_path.py's build: one library for every module
# Shared objects by layer (perf's `dso` column); anything else is "other".
LAYERS = (
    ("kernel", ("[kernel",)),
    ("interpreter", ("libpython", "python3")),
    ("event loop (C)", ("loop.cpython", "_asyncio.cpython", "uvloop")),
    ("libc", ("libc.so", "libm.so", "[vdso]")),
    (COMPILED, ("__mypyc",)),
)
SEND_CALLS = ("write", "sendto", "sendmsg", "send")
_TRACE_ROW = re.compile(r"^\s+([a-z_0-9]+)\s+(\d+)\s+\d+\s+[\d.]+")
_REPORT_ROW = re.compile(r"^\s+[\d.]+%\s+(\d+)\s+(.+?)\s*$")


@dataclass
class Split:
    """One client's observed windows."""

    client: str
    samples: collections.Counter[str] = field(default_factory=collections.Counter)  # layer -> samples
    requests: int = 0  # sent during the record window
    window: tuple[float, float] = (0.0, 0.0)  # the record window, perf_counter seconds
    calls: collections.Counter[str] = field(default_factory=collections.Counter)  # syscall -> calls
    note: str = ""

    @property
    def requests_per_s(self) -> float:
        """The send rate during the record window."""
        span = self.window[1] - self.window[0]
        return self.requests / span if span > 0 else 0.0

    def cpu_us(self, layer: str | None, frequency: float) -> float:
        """CPU per request in µs, of one layer or (None) all."""
        n = sum(self.samples.values()) if layer is None else self.samples[layer]
        return n / frequency / self.requests * 1e6 if self.requests else float("nan")

    def calls_per_request(self, name: str | None) -> float:
        """System calls of one name (None: all) per request, over the trace window's sends."""
        sends = sum(self.calls[c] for c in SEND_CALLS)
        n = sum(self.calls.values()) if name is None else self.calls[name]
        return n / sends if sends else float("nan")


def layer(dso: str) -> str:
    """The layer a shared object belongs to."""
    for name, marks in LAYERS:
        if any(mark in dso for mark in marks):
            return name
    return "other"


def observe(client: str, perf: str, pid: int, tmp: Path, seconds: float, frequency: float) -> Split:
    """Samples by layer over one window of a running process, then its system calls by name over the next
    (its requests are counted by the caller, from the client's records)."""
    split = Split(client)
    data = tmp / "perf.data"
    # Samples stamped with CLOCK_MONOTONIC (-k mono): the window is from the first sample to the last, on the
    # clients' perf_counter clock.
    record = [perf, "record", "-k", "mono", "-e", "cpu-clock", "-F", f"{frequency:g}", "-p", str(pid)]
    subprocess.run(
        ["timeout", "-s", "INT", f"{seconds:g}", *record, "-o", str(data)], capture_output=True, check=False
    )
    times = subprocess.run(
        [perf, "script", "-F", "time", "-i", str(data)], capture_output=True, text=True, check=False
    ).stdout.split()
    if times:
        split.window = (float(times[0].rstrip(":")), float(times[-1].rstrip(":")))
    trace_out = tmp / "trace.txt"
    trace = [perf, "trace", "-s", "-p", str(pid), "-o", str(trace_out)]
    subprocess.run(["timeout", "-s", "INT", f"{seconds:g}", *trace], capture_output=True, check=False)
    report = subprocess.run(
        [perf, "report", "-i", str(data), "--no-children", "--sort", "dso", "-g", "none", "-n", "--stdio"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in report.stdout.splitlines():
        m = _REPORT_ROW.match(line)
        if m and not line.lstrip().startswith("#"):
            split.samples[layer(m.group(2))] += int(m.group(1))
    if trace_out.is_file():
        for line in trace_out.read_text().splitlines():
            m = _TRACE_ROW.match(line)
            if m:
                split.calls[m.group(1)] += int(m.group(2))
    return split


def send_times(out: Path) -> list[float]:
    """perf_counter of every request a client sent, from its output: the floor's JSON or the bench's
    directory."""
    if out.is_file():
        return [float(r["sent"]) for r in json.loads(out.read_text())["records"]]
    summary = json.loads((out / "summary.json").read_text())
    origin = float(summary["client"]["perf_counter_origin_s"])
    rows = (json.loads(line) for line in (out / "request_level_metrics.jsonl").read_text().splitlines())
    return [origin + float(r["sent_at_s"]) for r in rows if r.get("sent_at_s") is not None]


def measure(
    client: str, cmd: list[str], env: dict[str, str] | None, out: Path, perf: str, args: argparse.Namespace
) -> Split:
    """Run one client (writing its records to `out`), observe it `args.start` seconds into its run, wait for
    it to finish and count the requests it sent in the record window."""
    split = Split(client)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(args.start)
        if proc.poll() is not None:
            split.note = f"exited early ({proc.returncode})"
            return split
        split = observe(client, perf, proc.pid, out.parent, args.window, args.frequency)
        _, err = proc.communicate(timeout=600)
        if proc.returncode not in (0, 1):
            split.note = f"failed ({proc.returncode}): {err.strip()[-200:]}"
            return split
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    begin, end = split.window
    try:
        split.requests = sum(begin <= t < end for t in send_times(out))
    except (OSError, KeyError, ValueError) as exc:
        split.note = f"no request records in {out}: {exc}"
        return split
    if not split.samples or not split.requests:
        split.note = "perf saw nothing (permission? see kernel.perf_event_paranoid)"
    return split


def render(splits: list[Split], frequency: float) -> str:
    """Markdown tables: CPU per request by layer (and its ratio to the floor); system calls per request."""
    floor = next((s for s in splits if s.client == "floor" and not s.note), None)
    seen = {name for s in splits for name in s.samples}
    layers = [name for name, _ in LAYERS if name in seen or name != COMPILED] + ["other"]
    head = "| client | req/s | " + " | ".join(layers) + " | total µs/req | x floor |"
    lines = [head, "|---|---:|" + "---:|" * (len(layers) + 2)]
    for s in splits:
        if s.note:
            lines.append(f"| {s.client} | {s.note} |")
            continue
        cells = [f"{s.cpu_us(name, frequency):.0f}" for name in layers]
        total = s.cpu_us(None, frequency)
        ratio = f"{total / floor.cpu_us(None, frequency):.2f}" if floor is not None and s is not floor else ""
        lines.append(
            f"| {s.client} | {s.requests_per_s:.0f} | " + " | ".join(cells) + f" | {total:.0f} | {ratio} |"
        )
    names = collections.Counter[str]()
    for s in splits:
        names.update(s.calls)
    top = [name for name, _ in names.most_common(8)]
    lines += ["", "| client | " + " | ".join(top) + " | all |", "|---|" + "---:|" * (len(top) + 1)]
    for s in splits:
        if s.note:
            continue
        cells = [f"{s.calls_per_request(n):.1f}" for n in top]
        lines.append(f"| {s.client} | " + " | ".join(cells) + f" | {s.calls_per_request(None):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=400.0, help="open-loop rate, req/s")
    ap.add_argument("--arrivals", default="poisson", choices=("poisson", "constant"))
    ap.add_argument("--concurrency", type=int, help="closed loop with N streams instead of an open loop")
    ap.add_argument("--window", type=float, default=5.0, help="seconds of each observed window")
    ap.add_argument("--start", type=float, default=3.0, help="seconds into the run before the first window")
    ap.add_argument("--frequency", type=float, default=2000.0, help="perf samples per second")
    ap.add_argument("--floor-json", action="store_true", help="also the raw client that decodes every event")
    ap.add_argument(
        "--build",
        action="append",
        help="NAME=PATH[::ARGS]: a tokwatch tree (its exporter/ dir) and extra bench arguments; default: "
        "as installed",
    )
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--gap", type=float, default=0.001)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--server-engine", choices=("loop", "threads"), default="loop", help=SERVER_ENGINE_HELP)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    perf = shutil.which("perf")
    if perf is None:
        print("cpu_split: perf is not installed (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    args.duration = args.start + 2 * args.window + 2.0
    rung = (
        Rung(concurrency=args.concurrency)
        if args.concurrency
        else Rung(rate=args.rate, arrivals=args.arrivals)
    )
    print(f"# CPU per request by layer: {rung.name}, {args.duration:g} s runs, windows {args.window:g} s")
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}", flush=True)
    splits: list[Split] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        runs: list[tuple[str, str | None, list[str]]] = [
            ("floor", None, []),
            *([("floor+json", None, [])] if args.floor_json else []),
            *parse_builds(args.build),
        ]
        for name, path, extra in runs:
            proc, port = start_refserver(args, "--max-connections", str(MAX_CONNECTIONS))
            try:
                if path is None:
                    out = tmp / f"{name}.json"
                    cmd, env = floor_command(name, rung, args, port, out), None
                else:
                    out = tmp / f"bench-{name}"
                    cmd, env = tokwatch_command(path, extra, rung, args, port, out)
                split = measure(name, cmd, env, out, perf, args)
            finally:
                stop(proc)
            splits.append(split)
            total = "-" if split.note else f"{split.cpu_us(None, args.frequency):.0f} µs/req"
            print(f"{name:<12} {total} {split.note}", flush=True)
    print()
    print("CPU per request by layer (µs; samples of `perf record -e cpu-clock`):\n")
    print(render(splits, args.frequency))
    print(f"\nload average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
