"""`--workers`: the counters the live view reads while the workers measure (nothing else crosses then)."""

import multiprocessing as mp

from tokwatch.bench.live import LiveStats
from tokwatch.bench.workers import LiveCounters
from tokwatch.result import Status


def test_each_worker_counts_its_own_row_and_the_parent_sums_them(make_record):
    counters = LiveCounters.create(mp.get_context("spawn"), 2)
    started = [counters.on_start(k) for k in range(2)]
    finished = [counters.on_record(k) for k in range(2)]
    warm = make_record(0, warmup=True, tokens=5)
    ok = [make_record(i, tokens=5) for i in range(1, 4)]
    failed = make_record(4, status=Status.TIMEOUT)
    for k, r in [(0, warm), (0, ok[0]), (1, ok[1]), (1, ok[2]), (1, failed)]:
        started[k](r)
    for k, r in [(0, warm), (0, ok[0]), (1, ok[1])]:
        finished[k](r)
    totals = counters.totals()
    assert totals.in_flight == 2 and totals.completed == 2 and totals.tokens == 10  # warm-up not counted
    for k, r in [(1, ok[2]), (1, failed)]:
        finished[k](r)
    totals = counters.totals()
    assert (totals.in_flight, totals.completed, totals.tokens) == (0, 4, 15)
    assert totals.by_status["ok"] == 3 and totals.by_status["timeout"] == 1
    stats = LiveStats()
    stats.absorb(totals.by_status, totals.in_flight, totals.tokens)
    assert stats.completed == 4 and "Errors: 1" in stats.line() and "TTFT p99: -" in stats.line()
