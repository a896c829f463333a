"""Window cache and collectors: store-backed gauges, fleet comparison, storage self-metrics."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tokwatch.figures.series import SeriesKey
from tokwatch.metrics.window import WindowCollector
from tokwatch.settings.config import EndpointSettings
from tokwatch.storage import RunWriter, StorageCollector, WindowCache
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore
from tokwatch.windows.window import compare_fleet, cv_band, window_label
from tokwatch.windows.window_rule import WindowRule


def _ep(name: str, **labels: str) -> EndpointSettings:
    return EndpointSettings(
        name=name, kind="openai", base_url="http://127.0.0.1:1/v1", model="m", labels=labels
    )


def _rows(endpoint: str, values: list[float], now: float, step: float = 3600.0) -> list[RunRow]:
    return [
        RunRow(
            run_id=f"{endpoint}{i}",
            time=now - 60 - i * step,
            endpoint=endpoint,
            status="ok",
            tokens_per_second=v,
        )
        for i, v in enumerate(values)
    ]


async def test_cache_and_collector_export_store_figures(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    now = time.time()
    try:
        await store.write_runs(_rows("fast", [100.0, 110.0, 90.0], now) + _rows("slow", [50.0, 50.0], now))
        await store.write_runs(_rows("gone", [1.0, 2.0], now))  # no longer configured
        cache = WindowCache(store, rule=WindowRule(), clock=lambda: now)
        cache.configure([_ep("fast", region="eu"), _ep("slow")])
        registry = CollectorRegistry()
        registry.register(WindowCollector(cache.snapshot))
        assert (
            registry.get_sample_value(
                "tokwatch_window_runs",
                {"endpoint": "fast", "workload": "seed000", "window": "24h", "region": "eu"},
            )
            is None
        )  # nothing before the first refresh: collect() never queries
        assert await cache.refresh()
        labels = {"endpoint": "fast", "workload": "seed000", "window": "24h", "region": "eu"}
        assert registry.get_sample_value("tokwatch_window_decode_tokens_per_second_median", labels) == 100.0
        assert registry.get_sample_value("tokwatch_window_decode_tokens_per_second_stddev", labels) == 10.0
        assert registry.get_sample_value(
            "tokwatch_window_decode_tokens_per_second_cv_ratio", labels
        ) == pytest.approx(0.1)
        assert registry.get_sample_value("tokwatch_window_uptime_ratio", labels) == 1.0
        slow = {"endpoint": "slow", "workload": "seed000", "window": "24h", "region": ""}
        assert registry.get_sample_value("tokwatch_window_ok_runs", slow) == 2.0
        assert (
            registry.get_sample_value("tokwatch_window_runs", {"endpoint": "gone", "window": "24h"}) is None
        )
        ratio = registry.get_sample_value(
            "tokwatch_fleet_fastest_vs_slowest_ratio",
            {"workload": "seed000", "window": "7d"},
        )
        assert ratio == pytest.approx(2.0)
    finally:
        await store.close()


async def test_cache_keeps_last_figures_when_store_fails(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    now = time.time()
    await store.write_runs(_rows("a", [10.0, 12.0], now))
    cache = WindowCache(store, rule=WindowRule(), clock=lambda: now)
    assert await cache.refresh()
    (tmp_path / "blocker").mkdir()
    broken = SQLiteStore(tmp_path / "blocker")  # a directory: cannot be opened as a database
    cache._store = broken  # simulate the database going away
    assert not await cache.refresh()
    assert cache.snapshot().figures[SeriesKey("a")].median == 11.0
    assert cache.refresh_errors == 1
    await store.close()
    await broken.close()


async def test_storage_collector(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    writer = RunWriter(store, outbox_path=tmp_path / "o.jsonl", queue_size=2)
    registry = CollectorRegistry()
    registry.register(StorageCollector(writer))
    for i in range(3):
        writer.submit_row(RunRow(run_id=f"r{i}", time=time.time(), endpoint="a", status="ok"))
    assert registry.get_sample_value("tokwatch_storage_outbox_runs") == 3.0  # overflow spilled
    assert registry.get_sample_value("tokwatch_storage_queue_depth") == 0.0
    assert registry.get_sample_value("tokwatch_storage_up", {"backend": "sqlite"}) == 0.0
    await writer.start()
    try:
        assert await writer.flush(10)
    finally:
        await writer.close()
    assert registry.get_sample_value("tokwatch_storage_writes_total") == 3.0
    assert registry.get_sample_value("tokwatch_storage_write_errors_total") == 0.0
    assert registry.get_sample_value("tokwatch_storage_up", {"backend": "sqlite"}) == 1.0
    assert registry.get_sample_value("tokwatch_storage_oldest_unwritten_age_seconds") == 0.0
    await store.close()


def test_helpers() -> None:
    assert window_label(86400) == "24h" and window_label(7 * 86400) == "7d" and window_label(900) == "15m"
    assert (cv_band(0.01), cv_band(0.05), cv_band(0.15), cv_band(0.2), cv_band(None)) == (
        "tight",
        "typical",
        "typical",
        "jittery",
        None,
    )
    cmp = compare_fleet({"a": 30.0, "b": 45.0, "c": None, "d": 40.0}, "7d")
    assert cmp is not None and (cmp.fastest, cmp.slowest) == ("b", "a")
    assert cmp.text().startswith("b is 50% faster than a")
    assert compare_fleet({"a": 30.0}, "7d") is None


def test_ranking_is_exported_once_with_neighbour_ratios() -> None:
    from tokwatch.windows.window import WindowSnapshot, rank_fleet

    ranking = rank_fleet({"a": 30.0, "b": 45.0, "c": None, "d": 40.0}, "7d")
    snap = WindowSnapshot(fleet=ranking.extremes, ranking=ranking)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WindowCollector(lambda: snap))
    get = registry.get_sample_value
    series = {"workload": "seed000", "window": "7d"}
    assert [get("tokwatch_fleet_rank", {"endpoint": n, **series}) for n in "bda"] == [1.0, 2.0, 3.0]
    assert get("tokwatch_fleet_rank", {"endpoint": "c", **series}) is None
    assert get("tokwatch_fleet_median_tokens_per_second", {"endpoint": "d", **series}) == 40.0
    # each endpoint's own ratio to the next slower (rank + 1), no endpoint name as a label value
    ratio = get("tokwatch_fleet_faster_than_next_ratio", {"endpoint": "b", **series})
    assert ratio == pytest.approx(45.0 / 40.0)
    assert get("tokwatch_fleet_faster_than_next_ratio", {"endpoint": "d", **series}) == pytest.approx(40 / 30)
    assert get("tokwatch_fleet_faster_than_next_ratio", {"endpoint": "a", **series}) is None  # the slowest
    assert get("tokwatch_fleet_fastest_vs_slowest_ratio", series) == pytest.approx(45 / 30)

    other = CollectorRegistry(auto_describe=False)
    other.register(WindowCollector(lambda: snap, export_fleet=False))  # a non-primary shard
    assert other.get_sample_value("tokwatch_fleet_rank", {"endpoint": "b", **series}) is None
