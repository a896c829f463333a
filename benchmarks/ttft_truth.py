"""`tokwatch bench` TTFT against kernel arrival stamps (benchmarks/refserver.py), closed loop.

For each load point a fresh reference server (its own process) and `tokwatch bench` (its own process,
`--no-server-metrics`) run; the bench's request_level_metrics.jsonl is joined with the server's truth log by
request id (`server_request_id` = the server's `x-request-id`). All times are perf_counter seconds of one
machine (CLOCK_MONOTONIC): the bench's `*_at_s` + `client.perf_counter_origin_s` from summary.json, the
server's kernel receive stamps converted from CLOCK_REALTIME. Per point it prints:

- true TTFT: the server's first token write - the kernel arrival of the request's last byte;
- TTFT error: client ttft_s - true TTFT (p1 / p50 / p99 / max, and |error| p99); it is exactly receive lag -
  send-stamp error. The server stamps a write after its send returned, so a server thread preempted around
  the send makes the error look negative: the error against the stamp taken before the send (the other
  bound, printed per point) brackets it;
- send-stamp error: client send stamp - kernel arrival (negative: the clock started before the last byte
  reached the server's socket, by that much);
- receive lag: client first-token stamp - the server's first write;
- send delay (the bench's `send_delay_s`: from starting the request to its send stamp), and the share of
  measured requests that could be joined with a kernel-stamped truth record.

    python benchmarks/ttft_truth.py                   # c=1, 16, 64 and 64 with --workers 2; ~2 minutes
    python benchmarks/ttft_truth.py --points 64,64x2 --waves 8
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokwatch.figures.stats import percentile

REFSERVER = Path(__file__).resolve().parent / "refserver.py"
SERVER_ENGINE_HELP = (
    "the reference server's engine: loop (every connection on one thread; holds 1,600 req/s on 2 cores) or "
    "threads (a thread per connection, as in the figures before issue 22's third session)"
)


@dataclass(frozen=True, slots=True)
class Point:
    """One closed-loop load point."""

    concurrency: int
    workers: int = 1

    @property
    def name(self) -> str:
        """e.g. "c=64, 2 workers"."""
        return f"c={self.concurrency}" + (f", {self.workers} workers" if self.workers > 1 else "")


def parse_points(text: str) -> list[Point]:
    """Points from e.g. "1,16,64,64x2" (`x2`: `--workers 2`)."""
    out = []
    for item in text.split(","):
        c, _, w = item.strip().partition("x")
        out.append(Point(int(c), int(w) if w else 1))
    return out


def load_average() -> str:
    """The 1/5/15-minute load averages."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def start_refserver(args: argparse.Namespace, *extra: str) -> tuple[subprocess.Popen[str], int]:
    """The reference server in its own process (`extra`: more of its arguments); returns it and its port."""
    cmd = [sys.executable, str(REFSERVER), "--port", "0", "--ttft", str(args.ttft), "--gap", str(args.gap)]
    cmd += ["--tokens", str(args.tokens), "--engine", args.server_engine, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the server prints its port once it listens
    if not line.strip().isdigit():
        stop(proc)
        raise SystemExit(f"refserver did not start (got {line!r})")
    return proc, int(line)


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def get(port: int, path: str) -> str:
    """GET a refserver admin route."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
        return str(resp.read().decode())


def run_bench(port: int, point: Point, args: argparse.Namespace, out: Path) -> None:
    """`tokwatch bench` as a subprocess (its own interpreter, as a user runs it)."""
    number = max(args.min_requests, args.waves * point.concurrency)
    cmd = [sys.executable, "-m", "tokwatch", "bench", "--url", f"http://127.0.0.1:{port}/v1"]
    cmd += ["--kind", "openai", "--model", "ref", "--no-server-metrics", "--live-interval", "3600"]
    cmd += ["--concurrency", str(point.concurrency), "--number", str(number), "--workers", str(point.workers)]
    cmd += ["--input-tokens", str(args.input_tokens), "--output-tokens", str(args.tokens)]
    cmd += ["--warmup", str(args.warmup), "--timeout", "120s", "--output-dir", str(out)]
    cmd += shlex.split(args.bench_args)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.bench_timeout, check=False)
    if done.returncode not in (0, 1):  # 1: an SLO missed (none are given, but not a failure to measure)
        raise SystemExit(f"tokwatch bench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def _p(values: list[float], q: float) -> float:
    return percentile(values, q) if values else float("nan")


def join(out: Path, truths: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
    """Ok records joined with kernel-stamped truth (seconds), the measured count, and summary.client."""
    summary = json.loads((out / "summary.json").read_text())
    origin = float(summary["client"]["perf_counter_origin_s"])
    records = [json.loads(line) for line in (out / "request_level_metrics.jsonl").read_text().splitlines()]
    measured = [r for r in records if not r["warmup"]]
    rows = []
    for r in measured:
        t = truths.get(r.get("server_request_id") or "")
        if r["status"] != "ok" or r["ttft_s"] is None or t is None or t["first_write_perf_s"] is None:
            continue
        if t["arrival_source"] != "kernel":
            continue
        sent = origin + r["sent_at_s"]
        true_ttft = t["first_write_perf_s"] - t["arrival_perf_s"]
        rows.append(
            {
                "request_id": t["request_id"],
                "true_ttft": true_ttft,
                "ttft_err": r["ttft_s"] - true_ttft,
                "send_err": sent - t["arrival_perf_s"],
                "recv_lag": sent + r["ttft_s"] - t["first_write_perf_s"],
                "send_delay": r["send_delay_s"],
                "client_stall": r.get("max_stall_s") or 0.0,
                "truth_window": t["first_write_perf_s"] - t["first_write_start_perf_s"],
                "server_read_lag": t["read_perf_s"] - t["arrival_perf_s"],
                "server_late": t["max_write_late_s"],
                "server_late_at": t["max_write_late_at_perf_s"],
            }
        )
    return rows, len(measured), summary["client"]


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Percentiles of one point's joined rows, in ms; and what the requests with |error| > 3 ms had."""

    def col(name: str) -> list[float]:
        return [row[name] * 1000 for row in rows]

    err = col("ttft_err")
    bad = [row for row in rows if abs(row["ttft_err"]) > 0.003]
    out: dict[str, Any] = {"joined": len(rows), "true_ttft_p50": _p(col("true_ttft"), 50)}
    out |= {f"err_p{q}": _p(err, q) for q in (1, 50, 99)}
    out["err_max"] = max(err, default=float("nan"))
    out["abs_err_p99"] = _p([abs(e) for e in err], 99)
    out |= {f"send_err_p{q}": _p(col("send_err"), q) for q in (1, 50, 99)}
    for name in ("recv_lag", "send_delay"):
        out |= {f"{name}_p{q}": _p(col(name), q) for q in (50, 99)}
    out["server_read_lag_p99"] = _p(col("server_read_lag"), 99)
    out["server_late_p99"] = _p(col("server_late"), 99)
    out["truth_window_p99"] = _p(col("truth_window"), 99)
    # The server stamps after its send returned; against the stamp before it, the error's other bound.
    from_start = [(row["ttft_err"] + row["truth_window"]) * 1000 for row in rows]
    out |= {f"err_start_p{q}": _p(from_start, q) for q in (1, 99)}
    # Where errors beyond 3 ms come from (error = receive lag - send-stamp error).
    out["bad"] = len(bad)
    out["bad_recv_lag"] = sum(1 for row in bad if abs(row["recv_lag"]) > 0.003)
    out["bad_send_err"] = sum(1 for row in bad if abs(row["send_err"]) > 0.003)
    out["bad_truth_window"] = sum(1 for row in bad if row["truth_window"] > 0.001)
    out["bad_client_stall"] = sum(1 for row in bad if row["client_stall"] >= 0.005)
    return out


def measure(point: Point, args: argparse.Namespace, tmp: Path, keep: Path | None) -> dict[str, Any]:
    """One load point against a fresh reference server."""
    proc, port = start_refserver(args)
    try:
        out = tmp / f"c{point.concurrency}x{point.workers}"
        run_bench(port, point, args, out)
        truths = {}
        for line in get(port, "/truth").splitlines():
            t = json.loads(line)
            truths[t["request_id"]] = t
        clock = json.loads(get(port, "/clock"))
    finally:
        stop(proc)
    rows, measured, client = join(out, truths)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(row) + "\n" for row in rows)
        (keep / f"c{point.concurrency}x{point.workers}.jsonl").write_text(lines)
    result = figures(rows)
    result |= {"measured": measured, "client": client, "clock_drift_us": clock["drift_ns"] / 1000}
    return result


def main() -> int:
    """Run every point and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--points", default="1,16,64,64x2", help="concurrencies; NxW runs N with --workers W")
    ap.add_argument("--waves", type=int, default=5, help="requests per point = waves x concurrency")
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--ttft", type=float, default=0.1)
    ap.add_argument("--gap", type=float, default=0.02)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--server-engine", choices=("loop", "threads"), default="loop", help=SERVER_ENGINE_HELP)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--bench-timeout", type=float, default=600.0, help="seconds per bench run")
    ap.add_argument("--keep", type=Path, help="write each point's joined rows (seconds) here as JSONL")
    ap.add_argument(
        "--bench-args", default="", help="more `tokwatch bench` arguments, e.g. '--receive-watcher off'"
    )
    args = ap.parse_args()
    print(f"load average before: {load_average()}  ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
    head = (
        "| point | joined | true TTFT p50 | TTFT err p1 / p50 / p99 / max | \\|err\\| p99 "
        "| send-stamp err p1 / p50 / p99 | recv lag p50 / p99 | send delay p50 / p99 | client CPU ms/req "
        "| client |"
    )
    lines = [head, "|" + "---|" * 10]
    with tempfile.TemporaryDirectory() as tmp:
        for point in parse_points(args.points):
            started = time.monotonic()
            r = measure(point, args, Path(tmp), args.keep)
            c = r["client"]
            lines.append(
                f"| {point.name} | {r['joined']}/{r['measured']} | {r['true_ttft_p50']:.2f} "
                f"| {r['err_p1']:.2f} / {r['err_p50']:.2f} / {r['err_p99']:.2f} / {r['err_max']:.2f} "
                f"| {r['abs_err_p99']:.2f} "
                f"| {r['send_err_p1']:.3f} / {r['send_err_p50']:.3f} / {r['send_err_p99']:.3f} "
                f"| {r['recv_lag_p50']:.2f} / {r['recv_lag_p99']:.2f} "
                f"| {r['send_delay_p50']:.2f} / {r['send_delay_p99']:.2f} "
                f"| {(c.get('cpu_per_request_s') or float('nan')) * 1e3:.2f} "
                f"| {c.get('event_loop')}, {c.get('receive_stamps')} |"
            )
            print(
                f"{point.name}: {time.monotonic() - started:.0f} s; |err| > 3 ms: {r['bad']} requests "
                f"(recv lag > 3 ms {r['bad_recv_lag']}, |send err| > 3 ms {r['bad_send_err']}, "
                f"server write window > 1 ms {r['bad_truth_window']}, "
                f"client stall >= 5 ms {r['bad_client_stall']}); "
                f"TTFT err against the write's start p1 / p99 {r['err_start_p1']:.2f} / "
                f"{r['err_start_p99']:.2f} ms; "
                f"server read lag p99 {r['server_read_lag_p99']:.2f} ms, write window p99 "
                f"{r['truth_window_p99']:.3f} ms, write lateness p99 {r['server_late_p99']:.2f} ms; "
                f"clock drift {r['clock_drift_us']:.1f} us; load {load_average()}",
                flush=True,
            )
    print("\nAll figures in ms.")
    print("\n".join(lines))
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
