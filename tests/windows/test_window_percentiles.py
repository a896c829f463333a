"""Percentiles over windows: the minimum sample counts, the gauges per window and percentile, the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tokwatch.figures.result import RunResult, Status, TimingSource
from tokwatch.figures.series import SeriesKey
from tokwatch.figures.stats import percentile
from tokwatch.metrics.window import WindowCollector
from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.storage.report import build_report, render_json, render_markdown, render_table
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore
from tokwatch.storage.window import WindowCache
from tokwatch.windows.window import MemoryWindows
from tokwatch.windows.window_percentiles import MIN_SAMPLES, Percentiles
from tokwatch.windows.window_rule import WindowRule


@pytest.mark.parametrize("n", [0, 1, 9, 10, 99, 100, 250])
def test_each_percentile_is_shown_from_its_minimum_count(n: int) -> None:
    values = [float((i * 31) % 97) for i in range(n)]
    p = Percentiles.of(values)
    assert p.samples == n
    for q, at_least in MIN_SAMPLES.items():
        if n >= at_least:
            assert p.at(q) == pytest.approx(percentile(values, q * 100))  # the one estimator
        else:
            assert p.at(q) is None
    assert Percentiles.computed(n, [1.0, 2.0, 3.0] if n else None) == Percentiles(
        n, tuple(v if n >= m else None for v, m in zip((1.0, 2.0, 3.0), MIN_SAMPLES.values(), strict=True))
    )


def test_a_tail_percentile_needs_one_over_one_minus_q_samples() -> None:
    assert MIN_SAMPLES[0.5] == 1  # as the window median always was
    assert {q: n for q, n in MIN_SAMPLES.items() if q > 0.5} == {0.9: 10, 0.99: 100}


def test_windows_are_configured_as_durations_and_bounded() -> None:
    assert Config().schedule.windows == (1800.0, 86400.0, 259200.0, 604800.0)
    assert Config(schedule={"windows": ["1h", "3d"]}).schedule.windows == (3600.0, 259200.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="windows: 'soon'"):
        Config(schedule={"windows": ["soon"]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 8"):
        Config(schedule={"windows": [f"{h}h" for h in range(1, 10)]})  # type: ignore[arg-type]


def _rows(now: float) -> list[RunRow]:
    """120 ok runs of `a` one minute apart (30 in the last 30 min), then a failed one; 5 long runs of `b`."""
    rows = [
        RunRow(
            run_id=f"a{i}",
            time=now - 30 - i * 60,
            endpoint="a",
            status="ok",
            tokens_per_second=50.0 + i,
            ttft_s=0.1 + i / 1000,
        )
        for i in range(120)
    ]
    rows.append(RunRow(run_id="a-x", time=now - 10, endpoint="a", status="timeout"))
    rows += [
        RunRow(
            run_id=f"b{i}",
            time=now - 600 - i * 3600,
            endpoint="b",
            workload="long",
            status="ok",
            tokens_per_second=30.0,
            ttft_s=5.0,
            prompt_tokens=10000,
            prefill_tokens_per_second=2000.0 + i,
        )
        for i in range(5)
    ]
    return rows


async def test_gauges_per_window_and_percentile_and_the_report(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    now = time.time()
    config = Config.model_validate(
        {
            "endpoints": [
                {"name": n, "kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"}
                for n in ("a", "b")
            ]
        }
    )
    try:
        await store.write_runs(_rows(now))
        cache = WindowCache(store, rule=WindowRule(), windows_s=config.schedule.windows, clock=lambda: now)
        cache.configure(config.endpoints)
        assert await cache.refresh()
        report = await build_report(store, now, 86400, rule=WindowRule(), windows_s=config.schedule.windows)
    finally:
        await store.close()

    registry = CollectorRegistry()
    registry.register(WindowCollector(cache.snapshot))
    text = generate_latest(registry).decode()
    samples = {
        (s.name, s.labels["endpoint"], s.labels["window"], s.labels.get("percentile")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("tokwatch_window_")
    }
    a_tps = [50.0 + i for i in range(120)]
    q = "tokwatch_window_decode_percentile_tokens_per_second"
    # 30 min: 30 samples: p50 and p90, no p99; 24 h: all 120, p99 too
    assert samples[(q, "a", "30m", "50")] == pytest.approx(percentile(a_tps[:30], 50))
    assert samples[(q, "a", "30m", "90")] == pytest.approx(percentile(a_tps[:30], 90))
    assert (q, "a", "30m", "99") not in samples
    assert samples[(q, "a", "24h", "99")] == pytest.approx(percentile(a_tps, 99))
    assert samples[("tokwatch_window_decode_samples", "a", "30m", None)] == 30
    assert samples[("tokwatch_window_uptime_ratio", "a", "30m", None)] == pytest.approx(30 / 31)
    assert samples[("tokwatch_window_uptime_ratio", "a", "7d", None)] == pytest.approx(120 / 121)
    ttft = "tokwatch_window_ttft_percentile_seconds"
    a_ttft = [0.1 + i / 1000 for i in range(120)]
    assert samples[(ttft, "a", "72h", "90")] == pytest.approx(percentile(a_ttft, 90))
    # b's long workload: 5 prefill samples in 24 h, a median but no p90
    pre = "tokwatch_window_prefill_percentile_tokens_per_second"
    assert samples[(pre, "b", "24h", "50")] == pytest.approx(2002.0)
    assert (pre, "b", "24h", "90") not in samples
    assert samples[("tokwatch_window_prefill_samples", "b", "24h", None)] == 5
    windows = {w for (_, _, w, _) in samples}
    assert windows == {"30m", "24h", "72h", "7d"}
    assert cache.snapshot().figures[SeriesKey("a")].window == "24h"  # the primary window

    by = {(r.endpoint, w.window): w for r in report.endpoints for w in r.windows}
    assert by[("a", "30m")].decode_tokens_per_second.samples == 30
    assert by[("a", "30m")].decode_tokens_per_second.p99 is None
    assert by[("a", "24h")].decode_tokens_per_second.p99 == pytest.approx(percentile(a_tps, 99))
    table = render_table(report)
    assert "decode tok/s p50/p90/p99 (n)" in table and "(30)" in table and "p99 from 100" in table
    assert "| window |" in render_markdown(report)
    data = json.loads(render_json(report))
    a = next(e for e in data["endpoints"] if e["endpoint"] == "a")
    assert [w["window"] for w in a["windows"]] == ["30m", "24h", "72h", "7d"]
    assert a["windows"][0]["ttft_seconds"]["samples"] == 30


def test_memory_windows_compute_a_snapshot_once_per_run_or_age() -> None:
    ep = EndpointSettings(name="a", kind="openai", base_url="http://127.0.0.1:1/v1", model="m")
    memory = MemoryWindows()
    memory.configure([ep], 86400.0, WindowRule(), windows=(1800.0,))

    def run(tps: float) -> RunResult:
        return RunResult(
            endpoint="a", started_at=time.time() - 5, status=Status.OK, tokens_per_second=tps,
            source=TimingSource.ENGINE, ttft_s=0.1,
        )  # fmt: skip

    memory.add(run(10.0))
    first = memory.snapshot()
    assert memory.snapshot() is first  # no run since: the same figures, nothing re-sorted
    memory.add(run(30.0))
    second = memory.snapshot()
    assert second is not first and second.windows["30m"][SeriesKey("a")].decode_percentiles.samples == 2
    aging = MemoryWindows(max_age_s=0.0)
    aging.configure([ep], 86400.0, WindowRule())
    assert aging.snapshot() is not aging.snapshot()  # past its age: computed anew as the windows slide
