"""Series per endpoint-workload on /metrics at fleet size: 20 endpoints x 3 workloads with a site, against
the simulator, with the default settings, with every series knob opted in (issue 36), and with every endpoint
priced (issue 34: the cost families only an endpoint with prices has).

One exporter (the real `App` with SQLite storage and its HTTP server on 127.0.0.1, as `tokwatch serve`
runs it) probes `--endpoints` endpoints on a simulator in another process (half of them kind vllm, so their
server counters are scraped too), each with three workloads (seed000 and two sized prompts with a short
output). It runs `--rounds` scheduled rounds (100 by default, so every window holds the 100 samples the
p99s need), GETs /metrics, and counts series: all of them, per family, and per endpoint-workload (series
carrying an `endpoint` label, over endpoints x workloads: a per-endpoint family such as the server counters
is shared by the endpoint's workloads). Then the same with `metrics: {windows: <all>, histograms: true}`.

    python benchmarks/series_budget.py [--endpoints 20] [--rounds 100] [--families 15]

blackbox_exporter's figure for comparison: about 21 series per HTTPS probe (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from exporter_rounds import scheduled_rounds
from simproc import simulator
from tokwatch.figures.result import RunResult
from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text

WORKLOADS = (
    "seed000",
    "{name: short, input_tokens: 100, output_tokens: 24}",
    "{name: long, input_tokens: 1500, output_tokens: 24}",
)
OPTED_IN = "metrics: {windows: [30m, 24h, 72h, 7d], histograms: true, diagnostics: true}"
PRICE = "{input_per_mtok: 1.0, output_per_mtok: 4.0, cached_input_per_mtok: 0.5}"


def priced(endpoints: int) -> str:
    """Default settings with every endpoint priced at list price (docs/metrics.md, "Cost and energy")."""
    return "pricing: {models: {" + ", ".join(f"m{i}: {PRICE}" for i in range(endpoints)) + "}}"


def sim_config(endpoints: int) -> str:
    """Two simulated servers (vLLM and OpenAI dialects), one model per endpoint, fast and without jitter."""
    models = [{"name": f"m{i}", "decode_tps": 400, "prefill_tps": 50000} for i in range(endpoints)]
    servers = [
        {"name": "v", "dialect": "vllm", "max_running": 4096, "models": models},
        {"name": "o", "dialect": "openai", "max_running": 4096, "models": models},
    ]
    return json.dumps({"seed": 1, "truth_capacity": 100000, "servers": servers})


def exporter_config(base: str, endpoints: int, tmp: str, extra: str) -> str:
    """Half the endpoints kind vllm (server counters scraped), half OpenAI-style; a site; three workloads."""
    lines = []
    for i in range(endpoints):
        kind, server = ("vllm", "v") if i % 2 == 0 else ("openai", "o")
        lines.append(
            f"  - {{name: ep{i:02d}, kind: {kind}, base_url: '{base}/{server}/v1', model: m{i}, "
            f"labels: {{provider: p{i % 5}}}}}"
        )
    return f"""
site: bench-a
probe: {{max_tokens: 24, warmup: false, workloads: [{", ".join(WORKLOADS)}]}}
schedule: {{interval: 1h, parallelism: 2, per_server: 4, run_on_start: false}}
storage: {{sqlite_path: '{tmp}/tw.db', outbox_path: '{tmp}/outbox'}}
{extra}
endpoints:
""" + "\n".join(lines)


@dataclass
class Count:
    """One /metrics scrape, counted."""

    label: str
    total: int
    endpoint_series: int
    per_family: Counter[str]
    bytes: int
    runs: dict[str, int]


async def measure(base: str, endpoints: int, rounds: int, fill: int, extra: str, label: str) -> Count:
    """Run the rounds on a fresh exporter, fill its windows, and count its /metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        app = App(load_config_text(exporter_config(base, endpoints, tmp, extra)), instance="bench")
        await app.start(schedule=False)
        runner, port = await start_site(app, "127.0.0.1", 0)
        try:
            statuses: Counter[str] = Counter()
            last: list[RunResult] = []
            async for runs in scheduled_rounds(app, rounds):
                statuses.update(
                    f"{r.status.value}{' (disturbed)' if r.timing_disturbed else ''}" for r in runs
                )
                last = runs
            for i in range(fill):
                for r in last:
                    at = r.started_at - 60.0 * (i + 1)
                    copy = dataclasses.replace(r, run_id=f"{r.run_id}-{i}", started_at=at)
                    app.probes.record(dataclasses.replace(copy, set_aside={}, timing_disturbed=False))
            await app.refresh_windows()
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(60)) as resp,
            ):
                body = await resp.read()
        finally:
            await runner.cleanup()
            await app.stop()
    per_family: Counter[str] = Counter()
    total = with_endpoint = 0
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            total += 1
            if "endpoint" in s.labels:
                with_endpoint += 1
                per_family[fam.name] += 1
    return Count(label, total, with_endpoint, per_family, len(body), dict(statuses))


def report(counts: list[Count], series: int, families: int) -> None:
    """The totals, then the biggest families per endpoint-workload side by side."""
    print(f"{'settings':<12}{'series':>9}{'with endpoint':>15}{'per endpoint-workload':>23}{'bytes':>10}")
    for c in counts:
        per = c.endpoint_series / series
        print(f"{c.label:<12}{c.total:>9}{c.endpoint_series:>15}{per:>23.1f}{c.bytes:>10}")
    for c in counts:
        print(f"{c.label}: timed runs by status: {', '.join(f'{k} {v}' for k, v in sorted(c.runs.items()))}")
    names = sorted(
        {n for c in counts for n in c.per_family},
        key=lambda n: -max(c.per_family[n] for c in counts),
    )
    print(f"\nper endpoint-workload, by family ({families} biggest, then the rest):")
    print(f"{'family':<58}" + "".join(f"{c.label:>12}" for c in counts))
    for n in names[:families]:
        print(f"{n:<58}" + "".join(f"{c.per_family[n] / series:>12.2f}" for c in counts))
    rest = names[families:]
    print(
        f"{f'{len(rest)} other families':<58}"
        + "".join(f"{sum(c.per_family[n] for n in rest) / series:>12.2f}" for c in counts)
    )


async def main(args: argparse.Namespace) -> None:
    with simulator(sim_config(args.endpoints)) as base:
        t0 = time.perf_counter()
        counts = [await measure(base, args.endpoints, args.rounds, args.fill, "", "default")]
        if not args.default_only:
            counts.append(await measure(base, args.endpoints, args.rounds, args.fill, OPTED_IN, "opted-in"))
            extra = priced(args.endpoints)
            counts.append(await measure(base, args.endpoints, args.rounds, args.fill, extra, "priced"))
    print(
        f"{args.endpoints} endpoints x {len(WORKLOADS)} workloads, site bench-a, {args.rounds} rounds "
        f"+ {args.fill} stored copies of the last "
        f"({time.perf_counter() - t0:.0f} s); {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}\n"
    )
    report(counts, args.endpoints * len(WORKLOADS), args.families)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fill", type=int, default=100, help="copies of the last round's runs stored")
    parser.add_argument("--families", type=int, default=15)
    parser.add_argument("--default-only", action="store_true", help="skip the opted-in run")
    asyncio.run(main(parser.parse_args()))
