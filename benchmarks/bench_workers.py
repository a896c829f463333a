"""N processes, one schedule: the open-loop ladder with 1 process, `--workers 2` and 2 `--segment` processes.

Each rung is one `tokwatch bench` run (its own processes, as a user runs them) against a fresh reference
server (benchmarks/refserver.py: kernel arrival stamps, a fixed token schedule), all in one session:

- `one`: one process;
- `workers2`: `--workers 2` (one parent, two worker processes on this host);
- `segments2`: two independent `tokwatch bench --segment K/2 --start-at T --run-id R` processes sharing
  nothing but the start time (the way pods of a Kubernetes Indexed Job run), merged here from their result
  directories.

Per rung it prints the TTFT error against the server's truth (client TTFT - (first write - kernel arrival);
`clean` = |error| p99 < 5 ms and the rate held), the rate the server saw against the planned schedule's
(`held` = at least 97 % of it and no failed request), the client's CPU per request (every process of it),
its scheduling lag p99, and whether the server's arrivals of the measured requests are the requested
process: for Poisson the Kolmogorov-Smirnov distance D of their gaps from the exponential of the requested
rate (and the D of the planned schedule itself: the seed's own sample, the best a client can do), for
constant the p99 of |gap - 1/R|; and the gaps' lag-1 autocorrelation (segments whose starts disagree make
it negative). Then, per client and arrival process, the highest clean and held rates. A client not held at
two rungs in a row is not run at higher rates; a rung whose client fails (a segment not started in time, a
crash) is printed as failed and counts as neither clean nor held.

    python benchmarks/bench_workers.py          # 400..1600 req/s, Poisson and constant, 10 s a rung (~15 min)
    python benchmarks/bench_workers.py --quick  # 400, 800, 1200 Poisson, 4 s a rung (~2 min)
    python benchmarks/bench_workers.py --clients one,workers2 --rates 600 --arrivals poisson
    # a same-session A/B against another checkout's code (its exporter/ directory on PYTHONPATH):
    python benchmarks/bench_workers.py --clients workers2,workers2@../main/exporter --rates 400,600,800

Run it on a quiet machine (`flock /tmp/tokwatch-bench.lock ...` on a shared one); the load average before
and after each rung is printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokwatch.bench.arrival_check import ArrivalCheck, check_arrivals
from tokwatch.figures.stats import percentile
from ttft_truth import SERVER_ENGINE_HELP, get, join, load_average, start_refserver, stop

CLIENTS = ("one", "workers2", "segments2")
CLEAN_ERR_MS = 5.0
HELD_SHARE = 0.97
SKIP_AFTER = 2  # a client not held at this many rungs in a row is not run at higher rates (bounded runtime)
SEGMENT_LEAD_S = 10.0  # the segments' common start after launch: start-up and warm-up on a busy 2-core box


class RungFailed(Exception):
    """A rung whose client did not produce a run (printed as such; the ladder goes on)."""


@dataclass(frozen=True, slots=True)
class Rung:
    """One run: a client at a rate with an arrival process."""

    client: str
    rate: float
    arrivals: str


def _bench_cmd(port: int, rung: Rung, args: argparse.Namespace, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "tokwatch", "bench", "--url", f"http://127.0.0.1:{port}/v1"]
    cmd += ["--kind", "openai", "--model", "ref", "--no-server-metrics", "--live-interval", "3600"]
    cmd += ["--rate", f"{rung.rate:g}", "--arrivals", rung.arrivals, "--duration", f"{args.duration:g}s"]
    cmd += ["--input-tokens", str(args.input_tokens), "--output-tokens", str(args.tokens)]
    cmd += ["--warmup", str(args.warmup), "--seed", str(args.seed), "--timeout", "60s"]
    return [*cmd, "--output-dir", str(out)]


def run_clients(port: int, rung: Rung, args: argparse.Namespace, tmp: Path) -> list[Path]:
    """Run the rung's client process(es); returns their result directories."""
    limit = args.duration + 120
    env = {**os.environ, "MPLBACKEND": "Agg"}
    name, _, code = rung.client.partition("@")
    if code:  # another checkout's tokwatch for this client
        env["PYTHONPATH"] = str(Path(code).resolve())
    if name != "segments2":
        out = tmp / "run"
        cmd = _bench_cmd(port, rung, args, out)
        if name == "workers2":
            cmd += ["--workers", "2"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False, env=env)
        if done.returncode not in (0, 1):
            raise RungFailed(f"tokwatch bench exited {done.returncode}: {_last_lines(done.stderr)}")
        return [out]
    start = time.time() + SEGMENT_LEAD_S
    run_id = uuid.uuid4().hex
    outs = [tmp / f"segment{k}" for k in range(2)]
    procs = [
        subprocess.Popen(
            [
                *_bench_cmd(port, rung, args, out),
                "--segment",
                f"{k}/2",
                "--start-at",
                f"{start:.6f}",
                "--run-id",
                run_id,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k, out in enumerate(outs)
    ]
    for k, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=limit + SEGMENT_LEAD_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RungFailed(f"segment {k} did not finish in {limit:.0f} s") from None
        if proc.returncode not in (0, 1):
            raise RungFailed(f"segment {k} exited {proc.returncode}: {_last_lines(err)}")
    return outs


def _last_lines(text: str) -> str:
    """The gist of a failed run's stderr (its summary lines), on one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " / ".join(lines[-6:])


def _records(out: Path) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
    summary = json.loads((out / "summary.json").read_text())
    lines = (out / "request_level_metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], float(summary["client"]["perf_counter_origin_s"]), summary


def measure(rung: Rung, args: argparse.Namespace) -> dict[str, Any]:
    """One rung against a fresh reference server."""
    before = load_average()
    proc, port = start_refserver(args)
    try:
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            outs = run_clients(port, rung, args, tmp)
            truths = {t["request_id"]: t for t in map(json.loads, get(port, "/truth").splitlines())}
            rows: list[dict[str, Any]] = []
            measured: list[dict[str, Any]] = []
            planned: list[float] = []
            cpu = 0.0
            for out in outs:
                joined, _, client = join(out, truths)
                rows += joined
                cpu += float(client["cpu_s"])
                records, origin, _ = _records(out)
                mine = [r for r in records if not r["warmup"]]
                measured += mine
                planned += [origin + r["intended_at_s"] for r in mine if r["intended_at_s"] is not None]
    finally:
        stop(proc)
    seen = [truths.get(r.get("server_request_id") or "") for r in measured]
    arrived = [t["arrival_perf_s"] for t in seen if t is not None and t["arrival_source"] == "kernel"]
    server = check_arrivals(arrived, rung.arrivals, rung.rate)
    plan = check_arrivals(planned, rung.arrivals, rung.rate)
    errs = [abs(row["ttft_err"]) * 1000 for row in rows]
    lag = [r["scheduling_lag_s"] * 1000 for r in measured if r.get("scheduling_lag_s") is not None]
    failed = sum(1 for r in measured if r["status"] != "ok")
    held = (
        failed == 0
        and server.achieved_rate is not None
        and plan.achieved_rate is not None
        and server.achieved_rate >= HELD_SHARE * plan.achieved_rate
    )
    err_p99 = percentile(errs, 99) if errs else float("nan")
    return {
        "rung": rung,
        "measured": len(measured),
        "joined": len(rows),
        "failed": failed,
        "err_p99_ms": err_p99,
        "err_p50_ms": percentile(errs, 50) if errs else float("nan"),
        "lag_p99_ms": percentile(lag, 99) if lag else float("nan"),
        "cpu_ms_per_request": cpu / len(measured) * 1000 if measured else float("nan"),
        "server": server,
        "plan": plan,
        "held": held,
        "clean": held and err_p99 < CLEAN_ERR_MS,
        "load_before": before,
        "load_after": load_average(),
    }


def _process_cell(server: ArrivalCheck, plan: ArrivalCheck) -> str:
    lag1 = "-" if server.lag1_autocorrelation is None else f"{server.lag1_autocorrelation:+.3f}"
    if server.kind == "poisson" and server.ks_d is not None and plan.ks_d is not None:
        return f"KS D {server.ks_d:.4f} (plan {plan.ks_d:.4f}, p {server.ks_p:.2f}), lag-1 {lag1}"
    if server.kind == "constant" and server.gap_error_p99_s is not None:
        return f"|gap - 1/R| p99 {server.gap_error_p99_s * 1000:.3f} ms, lag-1 {lag1}"
    return f"lag-1 {lag1}"


def _line(r: dict[str, Any]) -> str:
    rung: Rung = r["rung"]
    achieved = r["server"].achieved_rate or float("nan")
    planned = r["plan"].achieved_rate or float("nan")
    verdict = "clean" if r["clean"] else ("held" if r["held"] else "NOT held")
    return (
        f"| {rung.client} | {rung.arrivals} | {rung.rate:g} | {achieved:.0f} / {planned:.0f} "
        f"| {r['err_p50_ms']:.2f} / {r['err_p99_ms']:.2f} | {r['lag_p99_ms']:.2f} "
        f"| {r['cpu_ms_per_request']:.2f} | {_process_cell(r['server'], r['plan'])} "
        f"| {r['joined']}/{r['measured']}, {r['failed']} failed | {verdict} "
        f"| {r['load_before']} -> {r['load_after']} |"
    )


def _highest(results: list[dict[str, Any]], key: str) -> str:
    """The highest rate up to which every rung passed `key` (clean or held), and the first that did not."""
    ok = None
    for r in sorted(results, key=lambda r: r["rung"].rate):
        if not r[key]:
            return f"{ok:g}" if ok is not None else f"< {r['rung'].rate:g}"
        ok = r["rung"].rate
    return f">= {ok:g}" if ok is not None else "-"


def main() -> int:
    """Run the ladder and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rates", default="400,600,800,1000,1200,1400,1600", help="req/s, comma-separated")
    ap.add_argument("--arrivals", default="poisson,constant")
    ap.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"any of {', '.join(CLIENTS)}; NAME@DIR runs it with DIR (an exporter/ directory) on PYTHONPATH",
    )
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per rung")
    ap.add_argument("--quick", action="store_true", help="400, 800, 1200 req/s, Poisson, 4 s a rung")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--gap", type=float, default=0.001)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--server-engine", choices=("loop", "threads"), default="loop", help=SERVER_ENGINE_HELP)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, help="also write every rung's figures here")
    args = ap.parse_args()
    if args.quick:
        args.rates, args.arrivals, args.duration = "400,800,1200", "poisson", 4.0
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = {c.partition("@")[0] for c in clients} - set(CLIENTS)
    if unknown:
        ap.error(f"--clients: unknown {', '.join(sorted(unknown))} (known: {', '.join(CLIENTS)})")
    rates = [float(r) for r in args.rates.split(",")]
    arrivals = [a.strip() for a in args.arrivals.split(",")]
    print(
        f"load average before: {load_average()}  ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}); "
        f"refserver TTFT {args.ttft * 1000:g} ms, gap {args.gap * 1000:g} ms, {args.tokens} tokens; "
        f"{args.duration:g} s a rung after {args.warmup} warm-up requests",
        flush=True,
    )
    head = (
        "| client | arrivals | req/s | server saw / planned req/s | TTFT err p50 / p99 ms | sched lag p99 ms "
        "| CPU ms/req | arrival process at the server | joined | verdict | load avg |"
    )
    print(head + "\n|" + "---|" * 11, flush=True)
    results: list[dict[str, Any]] = []
    dropped: dict[tuple[str, str], int] = {}  # rungs in a row not held, per client and arrival process
    for kind in arrivals:
        for rate in rates:
            for client in clients:
                rung = Rung(client, rate, kind)
                if dropped.get((client, kind), 0) >= SKIP_AFTER:
                    print(f"| {client} | {kind} | {rate:g} | skipped: not held at {SKIP_AFTER} rungs below |")
                    results.append(
                        {"rung": rung, "clean": False, "held": False, "cpu_ms_per_request": float("nan")}
                    )
                    continue
                try:
                    r = measure(rung, args)
                except RungFailed as exc:  # counted as neither clean nor held
                    print(f"| {client} | {kind} | {rate:g} | failed: {exc} |", flush=True)
                    r = {"rung": rung, "failed": str(exc), "clean": False, "held": False}
                    r["cpu_ms_per_request"] = float("nan")
                results.append(r)
                dropped[(client, kind)] = 0 if r["held"] else dropped.get((client, kind), 0) + 1
                print(_line(r), flush=True)
    print("\nSummary (clean: |TTFT err| p99 < 5 ms and held; held: the server saw >= 97 % of the planned")
    print("rate and no request failed):\n")
    print("| client | arrivals | clean up to req/s | held up to req/s | CPU ms/request at each rate |")
    print("|---|---|---|---|---|")
    for kind in arrivals:
        for client in clients:
            mine = [r for r in results if r["rung"].client == client and r["rung"].arrivals == kind]
            cpu = ", ".join(
                f"{r['rung'].rate:g}: {r['cpu_ms_per_request']:.2f}" for r in mine if "server" in r
            )
            print(f"| {client} | {kind} | {_highest(mine, 'clean')} | {_highest(mine, 'held')} | {cpu} |")
    print(f"\nload average after: {load_average()}")
    if args.json is not None:
        doc = [
            {k: v.to_dict() if isinstance(v, ArrivalCheck) else v for k, v in r.items()}
            | {"rung": asdict(r["rung"])}
            for r in results
        ]
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
