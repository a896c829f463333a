"""The bench's end-of-run statistics at 100,000 requests: numpy against the pure-Python code it replaced.

Builds N finished requests (T tokens each, their per-token TBT, inter-chunk and output-ITL lists included, as
the capacity ladder leaves them) and times, median of `--repeat` calls:

- **summaries**: every metric's count/mean/std/min/max/percentiles (`aggregate.all_summaries`), against the
  pure-Python version (lists gathered per request, `sorted`, `math.fsum`);
- **throughput windows**: tokens received in the overall, last-30-s and steady-state windows
  (`aggregate.throughput`), against the per-window Python count;
- **SLO percentiles**: `slo.evaluate` of `ttft:p99` and `tbt:p90`, against `stats.percentile` on a list;
- **bench compare**: two such runs compared with 400 bootstrap resamples (`compare.compare`), against the
  pure-Python bootstrap (`random.choices` of the requests, flatten, sort, per resample and statistic). The
  old bootstrap takes hours at this size, so it is timed over `--old-resamples` resamples per statistic and
  scaled to 400 (the work is the same for every resample; the line says so).

Both sides give the same figures (tests/bench/test_arrays.py checks it); the script checks the summaries too.

    python benchmarks/bench_summaries.py [--requests 100000] [--tokens 32] [--repeat 3] [--old-resamples 3]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench_teardown import records

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/support
from tests.support.replaced_stats import old_summarize
from tokwatch.bench.aggregate import Window, all_summaries, throughput
from tokwatch.bench.compare import FIGURES, STATS, Run, compare
from tokwatch.bench.request_metrics import LIST_METRICS, SCALAR_METRICS, RequestRecord
from tokwatch.bench.slo import evaluate, parse_slo
from tokwatch.figures.stats import percentile

# --- the pure-Python code numpy replaced (issue 23), as it was ---------------------------------------------


def old_all_summaries(recs: Sequence[RequestRecord]) -> dict[str, dict[str, float | int | None]]:
    measured = [r for r in recs if r.ok and not r.warmup]
    out = {}
    for name in SCALAR_METRICS:
        pool = recs if name in ("scheduling_lag", "queue_time", "connect") else measured
        out[name] = old_summarize([v for r in pool if not r.warmup and (v := r.scalar(name)) is not None])
    for name in LIST_METRICS:
        out[name] = old_summarize([v for r in measured for v in r.series(name)])
    return out


def old_window_tokens(recs: Sequence[RequestRecord], wall_s: float) -> list[int]:
    measured = [r for r in recs if not r.warmup]
    start = min(r.sent_at_s for r in measured)
    length = wall_s - start
    windows = [
        Window(start, wall_s),
        Window(max(start, wall_s - 30.0), wall_s),
        Window(start + 0.2 * length, wall_s),
    ]
    return [sum(1 for r in measured for t in r.token_times_s() if w.start <= t <= w.end) for w in windows]


def old_slo_percentiles(recs: Sequence[RequestRecord]) -> list[float]:
    measured = [r for r in recs if r.ok and not r.warmup]
    ttft = [v for r in measured if (v := r.scalar("ttft")) is not None]
    tbt = [v for r in measured for v in r.series("tbt")]
    return [percentile(ttft, 99), percentile(tbt, 90)]


def old_bootstrap(a: Run, b: Run, resamples: int, seed: int = 0) -> None:
    """compare.compare's bootstrap before numpy: one resample of A and of B per statistic."""
    rng = random.Random(seed)

    def stat(groups: Sequence[Sequence[float]], q: float) -> float | None:
        flat = [v for g in groups for v in g]
        return percentile(flat, q) if flat else None

    for figure in FIGURES:
        ga, gb = a.values[figure], b.values[figure]
        for q in STATS.values():
            for _ in range(resamples):
                stat(rng.choices(ga, k=len(ga)), q)
                stat(rng.choices(gb, k=len(gb)), q)


# --- timing ---------------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of `repeat` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def as_run(name: str, recs: Sequence[RequestRecord]) -> Run:
    """A run as `bench compare` reads it (one list of values per request and figure)."""
    values: dict[str, list[list[float]]] = {f: [] for f in FIGURES}
    for r in recs:
        d = r.to_dict()
        for figure, (key, is_list, _) in FIGURES.items():
            raw = d.get(key)
            if is_list and isinstance(raw, list):
                values[figure].append([float(v) for v in raw])
            elif not is_list and isinstance(raw, int | float):
                values[figure].append([float(raw)])
    return Run(name, values, None)


def main() -> int:
    """Time both sides and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--resamples", type=int, default=400)
    ap.add_argument(
        "--old-resamples", type=int, default=3, help="old bootstrap: resamples timed, then scaled"
    )
    args = ap.parse_args()
    print(f"# {args.requests:,} requests x {args.tokens} tokens; load average {os.getloadavg()[0]:.2f} "
          f"({os.cpu_count()} CPUs, Python {sys.version.split()[0]})", flush=True)  # fmt: skip
    recs = records(args.requests, args.tokens)
    wall = args.requests / 1000.0 + 1.0
    new_summary, old_summary = all_summaries(recs), old_all_summaries(recs)
    for name, old in old_summary.items():
        new = new_summary[name]
        same = all(new[k] == old[k] for k in old if k != "std") and math.isclose(
            new["std"] or 0.0, old["std"] or 0.0, rel_tol=1e-12
        )
        if not same:
            raise SystemExit(f"{name}: numpy {new} != pure Python {old}")
    slos = [parse_slo("ttft:p99<=0.5"), parse_slo("tbt:p90<=50ms")]
    rows = [
        ("summaries (all_summaries)", lambda: all_summaries(recs), lambda: old_all_summaries(recs), 1.0),
        ("throughput windows", lambda: throughput(recs, wall), lambda: old_window_tokens(recs, wall), 1.0),
        ("SLO percentiles (ttft p99, tbt p90)", lambda: evaluate(slos, recs),
         lambda: old_slo_percentiles(recs), 1.0),
    ]  # fmt: skip
    print("| work | numpy s | pure Python s | speed-up |\n|---|---:|---:|---:|")
    for label, new_fn, old_fn, scale in rows:
        new_s, old_s = timed(new_fn, args.repeat), timed(old_fn, args.repeat) * scale
        print(f"| {label} | {new_s:.3f} | {old_s:.3f} | {old_s / new_s:.1f}x |", flush=True)
    run_a, run_b = as_run("a", recs), as_run("b", records(args.requests, args.tokens, seed=1))
    new_s = timed(lambda: compare(run_a, run_b, resamples=args.resamples), 1)
    old_part = timed(lambda: old_bootstrap(run_a, run_b, args.old_resamples), 1)
    old_s = old_part * args.resamples / args.old_resamples
    print(f"| bench compare, {args.resamples} resamples | {new_s:.2f} | {old_s:.0f} (scaled from "
          f"{args.old_resamples}: {old_part:.1f} s) | {old_s / new_s:.0f}x |")  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
