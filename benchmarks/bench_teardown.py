"""What a `tokwatch bench` run costs after its last request: every figure and file from N records.

Builds N finished 128-token requests (TBT lists included), then times the summary, throughput, SLO and
prefill figures and the whole results directory (plots off), at several N. Side by side: the same
percentile figures computed the old way (a sort per percentile call, as `stats.percentile` did before
issue 14), so the ratio shows what the single sort saves. Linear work keeps `per request` flat as N grows.

    python benchmarks/bench_teardown.py [--requests 1000,4000,16000] [--tokens 128]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from tokwatch.bench.aggregate import PERCENTILES
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.outputs import write_run
from tokwatch.bench.request_metrics import LIST_METRICS, SCALAR_METRICS, RequestRecord
from tokwatch.bench.slo import parse_slo
from tokwatch.figures.stats import percentile_sorted


def records(n: int, tokens: int, seed: int = 0) -> list[RequestRecord]:
    """N ok requests as a 1,000 req/s open loop would leave them."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sent = i / 1000.0
        r = RequestRecord(i, "chat", sent_at_s=sent, started_at_s=sent, dispatched_at_s=sent)
        r.intended_at_s = sent
        r.ttft_s = 0.05 + rng.random() * 0.05
        r.tbt_s = [0.01 + rng.random() * 0.002 for _ in range(tokens - 1)]
        r.inter_chunk_s = list(r.tbt_s)
        r.output_itl_s = list(r.tbt_s)
        r.e2e_s = r.ttft_s + sum(r.tbt_s)
        r.tpot_s = (r.e2e_s - r.ttft_s) / (tokens - 1)
        r.output_tokens, r.think_tokens, r.prompt_tokens, r.prompt_tokens_target = tokens, 0, 128, 128
        r.max_tokens, r.tokens_source, r.fluidity_index = tokens, "usage", 1.0
        r.completed_at_s = sent + r.e2e_s
        r.decode_tokens_per_s = (tokens - 1) / sum(r.tbt_s)
        out.append(r)
    return out


def old_way(recs: list[RequestRecord]) -> None:
    """Percentiles as before: one sort per percentile per metric (what grew to 5 s at 16,000 requests)."""
    for name in SCALAR_METRICS:
        values = [v for r in recs if (v := r.scalar(name)) is not None]
        for q in PERCENTILES if values else ():
            percentile_sorted(sorted(values), q)
    for name in LIST_METRICS:
        values = [v for r in recs for v in getattr(r, f"{name}_s")]
        for q in PERCENTILES if values else ():
            percentile_sorted(sorted(values), q)


def timed(fn: object, repeat: int) -> float:
    """Median seconds of `repeat` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="1000,4000,16000")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    slos = [parse_slo("ttft:p99<=0.5"), parse_slo("tbt:p90<=50ms")]
    print(f"{'requests':>9} {'figures s':>10} {'files s':>8} {'µs/request':>11} "
          f"{'old percentiles s':>18} {'ratio':>6}")  # fmt: skip
    for n in (int(x) for x in args.requests.split(",")):
        recs = records(n, args.tokens)
        outcome = BenchOutcome(
            options={}, records=recs, started_at_unix=0.0, wall_s=n / 1000.0 + 1.0, complete=True,
            stop_reason="finished", slos=slos, requested_rate=1000.0,
        )  # fmt: skip

        def figures(o: BenchOutcome = outcome) -> None:
            o.summary(), o.throughput(), o.slo_results(), o.prefill()

        with tempfile.TemporaryDirectory() as tmp:
            files_s = timed(lambda o=outcome, d=Path(tmp): write_run(o, d, plots_enabled=False), args.repeat)
        figures_s = timed(figures, args.repeat)
        old_s = timed(lambda r=recs: old_way(r), 1)
        print(f"{n:>9} {figures_s:>10.3f} {files_s:>8.3f} {files_s / n * 1e6:>11.1f} {old_s:>18.3f} "
              f"{old_s / figures_s:>6.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
