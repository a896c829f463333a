from tokwatch.bench.live import LiveCollector, LiveStats
from tokwatch.figures.result import Status


def test_live_line_and_collector(make_record):
    stats = LiveStats()
    stats.started -= 10.0  # ten seconds into the run
    for i in range(4):
        stats.add(make_record(i, ttft=0.05 * (i + 1), sent=9.0))
    stats.add(make_record(4, status=Status.TIMEOUT))
    stats.add(make_record(5, warmup=True, ttft=9.0))
    line = stats.line()
    assert "Completed: 5 | Errors: 1" in line
    assert "TTFT p99: 198ms" in line and "TBT p99: 10.0ms" in line
    families = {m.name: m for m in LiveCollector(stats).collect()}
    ok = next(s for s in families["tokwatch_bench_requests"].samples if s.labels.get("status") == "ok")
    assert ok.value == 4
    assert families["tokwatch_bench_tokens"].samples[0].value == 44
