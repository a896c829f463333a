"""Does exporting spans move a timing figure? `tokwatch bench` against the simulator (its own process), each
load level run with OTLP export off and on (alternating, so drift hits both), every request's TTFT and
per-token gaps compared with the simulator's truth as `bench_fidelity.py` and `measurement_error.py` do:

- TTFT error: client TTFT - (the sim's first-token write - the client's send stamp), |error| p50/p99;
- TBT error: |client per-token gap - true per-token gap| over every token, p50/p99;
- with export on, the simulator also sends its server span of every request (it reads the traceparent), and
  a receiver in a third process decodes every span (ExportTraceServiceRequest) and counts them.

    python benchmarks/tracing_overhead.py              # --rounds 3 --levels 1,16,64, about 2 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from bench_fidelity import fetch_truths
from simproc import _readline, simulator, stop
from tokwatch.bench.config import build_options
from tokwatch.bench.session import run_bench
from tokwatch.figures.stats import percentile

SIM_YAML = """
truth_capacity: 200000
otlp_endpoint: "{otlp}"
servers:
  - name: vllm-a
    dialect: vllm
    max_running: 100000
    models:
      - name: steady
        decode_tps: 50
        prefill_tps: 100000
        jitter: 0.2
"""

_RECEIVER = textwrap.dedent(
    """
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest, ExportTraceServiceResponse)
    counts = {"client": 0, "server": 0}
    lock = threading.Lock()
    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            req = ExportTraceServiceRequest()
            req.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            counts["server" if s.kind == 2 else "client"] += 1
            body = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
        def do_GET(self):
            with lock:
                body = ("%d %d" % (counts["client"], counts["server"])).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(server.server_address[1], flush=True)
    server.serve_forever()
    """
)


@contextlib.contextmanager
def receiver() -> Iterator[str]:
    """An OTLP/HTTP receiver in its own process (its decoding never competes with the client); its URL."""
    proc = subprocess.Popen([sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        port = _readline(proc, 30).strip()
        if not port.isdigit():
            raise SystemExit("the OTLP receiver did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def received(url: str) -> tuple[int, int]:
    """(client spans, server spans) the receiver decoded so far."""
    with urllib.request.urlopen(url, timeout=10) as r:
        client, server = r.read().decode().split()
    return int(client), int(server)


async def errors(
    url: str, tmp: Path, name: str, concurrency: int, otlp: str | None
) -> dict[str, list[float]]:
    """One closed-loop bench run; the |TTFT error| of every request and |TBT error| of every token."""
    opts = build_options({
        "url": f"{url}/vllm-a/v1", "kind": "vllm", "model": "steady", "input_tokens": "32",
        "output_tokens": "64", "concurrency": concurrency, "number": max(8, 3 * concurrency),
        "live_interval": 3600, "plots": False, "server_metrics": False, "timeout": 120,
        **({"otlp_endpoint": otlp} if otlp else {}),
    })  # fmt: skip
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp / name)
    truths = await fetch_truths(url, [r.server_request_id for r in outcome.records if r.server_request_id])
    ttft: list[float] = []
    tbt: list[float] = []
    for r in outcome.records:
        t = truths.get(r.server_request_id or "")
        if not r.ok or t is None or r.ttft_s is None or not t["emitted_at"]:
            continue
        emitted = t["emitted_at"]
        ttft.append(abs(r.ttft_s - (emitted[0] - (outcome.perf_t0 + r.sent_at_s))))
        gaps = [b - a for a, b in itertools.pairwise(emitted)]
        tbt.extend(abs(c - g) for c, g in zip(r.tbt_s, gaps, strict=False))
    return {"ttft": ttft, "tbt": tbt, "requests": [float(len(outcome.records))]}


def _ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1e3 if values else float("nan")


async def main(rounds: int, levels: list[int]) -> None:
    pooled: dict[tuple[int, str], dict[str, list[float]]] = {}
    with receiver() as rx, simulator(SIM_YAML.format(otlp=rx)) as url, tempfile.TemporaryDirectory() as tmp:
        load = os.getloadavg()[0]
        print(f"# tracing export off vs on ({os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
              f"load average {load:.2f})")  # fmt: skip
        t0 = time.monotonic()
        for n in range(rounds):
            for c in levels:
                modes = ("off", "on") if n % 2 == 0 else ("on", "off")
                for mode in modes:
                    got = await errors(url, Path(tmp), f"r{n}c{c}{mode}", c, rx if mode == "on" else None)
                    into = pooled.setdefault((c, mode), {"ttft": [], "tbt": [], "requests": []})
                    for k, v in got.items():
                        into[k].extend(v)
        await asyncio.sleep(2)  # the simulator's batch processor sends within a second
        client_spans, server_spans = received(rx)
        took = time.monotonic() - t0
        print(f"# {took:.0f} s; spans received: {client_spans} client, {server_spans} server")
        print("| streams | export | requests | TTFT \\|err\\| p50 ms | TTFT \\|err\\| p99 ms "
              "| TBT \\|err\\| p50 ms | TBT \\|err\\| p99 ms |")  # fmt: skip
        print("|---:|---|---:|---:|---:|---:|---:|")
        rows = {}
        for c in levels:
            for mode in ("off", "on"):
                e = pooled[(c, mode)]
                rows[f"{c}/{mode}"] = row = {
                    "requests": int(sum(e["requests"])),
                    "ttft_p50": _ms(e["ttft"], 50), "ttft_p99": _ms(e["ttft"], 99),
                    "tbt_p50": _ms(e["tbt"], 50), "tbt_p99": _ms(e["tbt"], 99),
                }  # fmt: skip
                print(f"| {c} | {mode} | {row['requests']} | {row['ttft_p50']:.3f} | {row['ttft_p99']:.3f} "
                      f"| {row['tbt_p50']:.3f} | {row['tbt_p99']:.3f} |")  # fmt: skip
        print(json.dumps(rows), file=sys.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", default="1,16,64", help="closed-loop concurrencies")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, [int(x) for x in args.levels.split(",")]))
