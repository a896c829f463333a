"""/metrics render time and size at fleet scale: the pre-rendered exposition against a full render.

Builds the exporter's collectors for N endpoints, each with a completed 256-token run, window figures and
vLLM server figures (from the simulator's own vLLM /metrics), then times:
- full render: prometheus_client's `generate_latest` over the registry (what every scrape cost before);
- cold scrape: the exposition with every endpoint's part still to render (first scrape after start/reload);
- steady scrape: nothing changed since the last scrape (the common case at an hourly cadence);
- one changed: one endpoint completed a run since the last scrape;
- counters moved: every endpoint's server counters were scraped since the last /metrics scrape (a vLLM
  fleet at the default 15 s), rendered by the scrape itself, and after the app's background pass
  (`Exposition.prerender`, every second) had rendered them: what the scrape then costs, and what the
  background pass cost.

A second table times the OpenMetrics output (what Prometheus asks for): prometheus_client's full
OpenMetrics render against the exposition's, whose parts carry both formats from one render.

Every endpoint has `--workloads` workloads (issue 21: each a series of its own, with its own runs and
window figures; server counters stay per endpoint) and window figures over `--windows` windows (the
default four: 30m, 24h, 72h, 7d), each with p50/p90/p99 of decode, prefill and TTFT shown: the most
/metrics one series can carry. Rows are by endpoint-workloads (endpoints x workloads).

    python benchmarks/metrics_render.py [--endpoints 100,1000] [--workloads 1] [--windows 4] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from tokwatch.counters import ServerCollector
from tokwatch.counters.adapters import read_counters
from tokwatch.counters.parse import parse_metrics
from tokwatch.counters.state import ServerState
from tokwatch.figures.result import RunResult, Status, TimingSource
from tokwatch.figures.series import SeriesKey
from tokwatch.metrics.exposition import Exposition
from tokwatch.metrics.probe import ProbeMetrics, SeriesOptions
from tokwatch.metrics.window import WindowCollector
from tokwatch.settings.config import EndpointSettings, load_config_text
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.runtime import SimState
from tokwatch.windows.window import WindowFigures, WindowSnapshot, window_label
from tokwatch.windows.window_percentiles import Percentiles

WORKLOADS = ("seed000", "short", "medium", "long")
WINDOWS_S = (1800.0, 86400.0, 259200.0, 604800.0)


def endpoints(n: int) -> list[EndpointSettings]:
    """N vLLM endpoints with two static labels."""
    lines = "\n".join(
        f"  - {{name: ep{i}, kind: vllm, base_url: 'http://127.0.0.1:1/v1', model: m, "
        f"labels: {{gpu: a100, site: s{i % 4}}}}}"
        for i in range(n)
    )
    return list(load_config_text(f"endpoints:\n{lines}\n").endpoints)


def run(endpoint: str, t: float, workload: str = "seed000") -> RunResult:
    """A completed 256-token streamed run."""
    return RunResult(
        endpoint=endpoint,
        workload=workload,
        started_at=t,
        status=Status.OK,
        tokens_per_second=50.0,
        source=TimingSource.VLLM_METRICS,
        output_tokens=256,
        ttft_s=0.2,
        tpot_s=0.02,
        e2e_s=5.3,
        duration_s=5.31,
        itl_s=[0.02] * 255,
        streamed=True,
        max_stall_s=0.0,
        prompt_tokens=1000,
        prefill_tokens_per_second=5000.0,
    )


def vllm_text() -> str:
    """The simulator's vLLM /metrics body (text format)."""
    state = SimState.build(
        load_sim_config_text("servers:\n  - {name: v, dialect: vllm, models: [{name: m, decode_tps: 100}]}\n")
    )
    rendered = state.servers["v"].metrics.render()
    assert rendered is not None
    return rendered[0].decode() if isinstance(rendered[0], bytes) else str(rendered[0])


def figures(key: SeriesKey, window: str) -> WindowFigures:
    """One series' window figures with every percentile shown (168 samples: p99 too)."""
    pct = Percentiles(168, (50.0, 55.0, 58.0))
    return WindowFigures(
        key.endpoint, window, 168, 168, 50.0, 1.0, 0.02, 1.0, workload=key.workload,
        prefill_median=5000.0, prefill_runs=168, decode_percentiles=pct, prefill_percentiles=pct,
        ttft_percentiles=Percentiles(168, (0.2, 0.25, 0.3)),
    )  # fmt: skip


def build(
    n: int, workloads: int = 1, windows: int = 4
) -> tuple[Exposition, ProbeMetrics, Callable[[], None]]:
    """The exposition (the registry) over the app's collectors, filled for n endpoints x `workloads`."""
    eps = endpoints(n)
    names = WORKLOADS[:workloads]
    probe = ProbeMetrics()
    # Every opt-in series (histograms, diagnostics) and every window: the most /metrics one series can carry.
    every = SeriesOptions(histograms=True, diagnostics=True)
    probe.set_endpoints(eps, {ep.name: names for ep in eps}, options=every)
    for ep in eps:
        for w in names:
            probe.record(run(ep.name, 1000.0, w))
    snap = parse_metrics(vllm_text())
    reading = read_counters(snap, "vllm", "m")
    servers = ServerCollector()
    states = []
    for ep in eps:
        state = ServerState(ep.name, ep.labels)
        state.record(reading, snap, 1.0, 0.01)
        state.record(reading, snap, 16.0, 0.01)
        servers.add(state)
        states.append(state)
    clock = [16.0]

    def counters_scraped() -> None:
        """Every endpoint's server counters scraped once more (every 15 s by default)."""
        clock[0] += 15.0
        for state in states:
            state.record(reading, snap, clock[0], 0.01)

    keys = [SeriesKey(ep.name, w) for ep in eps for w in names]
    labels = [window_label(s) for s in WINDOWS_S[:windows]]
    by_window = {label: {k: figures(k, label) for k in keys} for label in labels}
    primary = by_window.get("24h") or by_window[labels[0]]
    static = {ep.name: dict(ep.labels) for ep in eps}
    window = WindowSnapshot(primary, None, 0.0, static, windows=by_window)
    windows = WindowCollector(lambda: window, diagnostics=True)
    exposition = Exposition()  # also the registry `generate_latest` renders whole
    for c in (probe, servers, windows):
        exposition.register(c)
    return exposition, probe, counters_scraped


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds over `repeat` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    """Print one row per fleet size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--workloads", type=int, choices=range(1, len(WORKLOADS) + 1), default=1)
    ap.add_argument("--windows", type=int, choices=range(1, len(WINDOWS_S) + 1), default=4)
    args = ap.parse_args()
    print(f"workloads per endpoint: {args.workloads}, windows: {args.windows}")
    print(
        "| endpoint-workloads | endpoints | body MB | bytes/endpoint | full render ms | cold scrape ms "
        "| steady scrape ms "
        "| one changed ms | counters moved ms | same, prerendered: scrape ms | background pass ms "
        "| full / steady |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    openmetrics_rows = []
    for n in args.endpoints:
        exposition, probe, counters_scraped = build(n, args.workloads, args.windows)
        full = timed(lambda: generate_latest(exposition), max(3, args.repeat // 5))  # noqa: B023
        t0 = time.perf_counter()
        body = exposition.render()
        cold = time.perf_counter() - t0
        steady = timed(exposition.render, args.repeat)
        k = [0]

        def one_changed() -> None:
            k[0] += 1  # noqa: B023
            probe.record(run(f"ep{k[0] % n}", 1000.0 + k[0], WORKLOADS[k[0] % args.workloads]))  # noqa: B023
            exposition.render()  # noqa: B023

        changed = timed(one_changed, args.repeat)
        moved, ready, background = [], [], []
        for _ in range(max(3, args.repeat // 5)):
            counters_scraped()
            t0 = time.perf_counter()
            exposition.render()
            moved.append(time.perf_counter() - t0)
            counters_scraped()
            t0 = time.perf_counter()
            exposition.prerender()
            t1 = time.perf_counter()
            exposition.render()
            background.append(t1 - t0)
            ready.append(time.perf_counter() - t1)
        print(
            f"| {n * args.workloads} | {n} | {len(body) / 1e6:.2f} | {len(body) // n} | {full * 1e3:.1f} "
            f"| {cold * 1e3:.1f} "
            f"| {steady * 1e3:.2f} | {changed * 1e3:.2f} | {statistics.median(moved) * 1e3:.1f} "
            f"| {statistics.median(ready) * 1e3:.2f} | {statistics.median(background) * 1e3:.1f} "
            f"| {full / steady:.0f}x |"
        )
        om_full = timed(lambda: generate_openmetrics(exposition), max(3, args.repeat // 5))  # noqa: B023
        om_body = exposition.render("openmetrics")
        om_steady = timed(lambda: exposition.render("openmetrics"), args.repeat)  # noqa: B023
        counters_scraped()
        exposition.prerender()
        om_ready = timed(lambda: exposition.render("openmetrics"), args.repeat)  # noqa: B023
        openmetrics_rows.append(
            f"| {n * args.workloads} | {n} | {len(om_body) / 1e6:.2f} | {om_full * 1e3:.1f} "
            f"| {om_steady * 1e3:.2f} "
            f"| {om_ready * 1e3:.2f} | {om_full / om_steady:.0f}x |"
        )
    print()
    print(
        "| endpoint-workloads | endpoints | OpenMetrics body MB | full OpenMetrics render ms "
        "| steady scrape ms "
        "| after counters moved, prerendered: scrape ms | full / steady |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(openmetrics_rows))


if __name__ == "__main__":
    main()
