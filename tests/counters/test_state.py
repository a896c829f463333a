"""Continuous server figures: rates over the scrape interval, monotonic totals across restarts, mirroring."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tokwatch.counters.parse import parse_metrics
from tokwatch.counters.state import MonotonicTotal, ServerState
from tokwatch.counters.vllm import read_vllm


def scrape(state: ServerState, text: str, at: float) -> None:
    snap = parse_metrics(text)
    state.record(read_vllm(snap, "m"), snap, at, 0.01)


def test_monotonic_total_survives_resets() -> None:
    t = MonotonicTotal()
    for value in (5, 7, 7, 2, 4):  # restart between 7 and 2
        t.observe(value)
    assert t.total == 2 + 0 + 2 + 2
    t.observe(10, created=1.0)
    t.observe(11, created=2.0)  # _created moved: restarted and already counted 11 again
    assert t.total == 6 + 6 + 11


def test_rates_gauges_and_preemptions(vllm_text: Callable[..., str]) -> None:
    state = ServerState("ep", mirror=())
    scrape(state, vllm_text(generation=1000, prompt=500, hits=10, queries=100, preemptions=2), at=100.0)
    assert state.view.up and state.view.decode_tps is None  # no rate from a single scrape
    scrape(
        state,
        vllm_text(
            generation=1600, prompt=800, hits=70, queries=200, preemptions=5, running=3, waiting=1, kv=0.7
        ),
        at=115.0,
    )
    v = state.view
    assert v.decode_tps == pytest.approx(600 / 15)
    assert v.prefill_tps == pytest.approx(300 / 15)
    assert v.prefix_hit_ratio == pytest.approx(60 / 100)
    assert (v.running, v.waiting, v.kv_cache_usage) == (3, 1, pytest.approx(0.7))
    assert state.preemptions.total == 3
    # A server restart: no rate for that interval, the preemption total keeps growing.
    scrape(state, vllm_text(generation=50, prompt=20, preemptions=1, created=1800000000.0), at=130.0)
    assert state.view.decode_tps is None
    assert state.preemptions.total == 4
    # The hit ratio is over the last 5 minutes, so an interval without prompt queries keeps it.
    assert state.view.prefix_hit_ratio == pytest.approx(0.6)


def _llamacpp(prompt: int, cached: int) -> str:
    return (
        f"llamacpp:prompt_tokens_total {prompt}\nllamacpp:prompt_tokens_cached_total {cached}\n"
        "llamacpp:tokens_predicted_total 10\nllamacpp:tokens_predicted_seconds_total 1\n"
    )


def test_llamacpp_prefix_ratio_is_windowed_and_goes_away_when_idle() -> None:
    from tokwatch.counters.llamacpp import read_llamacpp
    from tokwatch.counters.state import PREFIX_WINDOW_S

    state = ServerState("lc")

    def at(t: float, prompt: int, cached: int) -> float | None:
        snap = parse_metrics(_llamacpp(prompt, cached))
        state.record(read_llamacpp(snap, None), snap, t, 0.01)
        return state.view.prefix_hit_ratio

    at(0, 0, 0)
    # One probe per scrape, each all-miss (40 prompt tokens) or all-hit (40 cached): per scrape 0 or 1.
    assert at(15, 40, 0) == 0.0
    assert at(30, 40, 40) == pytest.approx(40 / 80)
    assert at(45, 80, 40) == pytest.approx(40 / 120)
    assert at(60, 80, 80) == pytest.approx(80 / 160)  # not the 1.0 of the last interval alone
    assert at(15 + PREFIX_WINDOW_S - 1, 80, 80) == pytest.approx(0.5)  # idle: still the window's figure
    assert at(60 + PREFIX_WINDOW_S + 1, 80, 80) is None  # idle for a whole window: no figure, not a stale 1


def test_down_server_drops_gauges_and_keeps_counters(vllm_text: Callable[..., str]) -> None:
    state = ServerState("ep")
    scrape(state, vllm_text(preemptions=1, running=2), at=0.0)
    scrape(state, vllm_text(preemptions=3, running=2), at=15.0)
    state.record_error(0.5, "http://user:hunter22@host/metrics: TransportError: refused")
    assert not state.view.up and state.view.running is None
    assert state.scrape_errors == 1 and state.preemptions.total == 2


def test_mirrored_counters_and_gauges(vllm_text: Callable[..., str]) -> None:
    state = ServerState("ep", mirror=("output_critical_eviction_events", "queue_depth", "absent_metric"))
    extra = (
        "# TYPE output_critical_eviction_events_total counter\noutput_critical_eviction_events_total {n}\n"
    )
    scrape(state, vllm_text() + extra.format(n=4) + "queue_depth 7\n", at=0.0)
    scrape(state, vllm_text() + extra.format(n=9) + "queue_depth 2\n", at=15.0)
    assert state.mirrored_totals["output_critical_eviction_events"].total == 5
    assert dict(state.view.mirrored) == {"queue_depth": 2}
    scrape(state, vllm_text() + extra.format(n=1), at=30.0)  # restarted, gauge gone
    assert state.mirrored_totals["output_critical_eviction_events"].total == 6
    assert "queue_depth" not in state.view.mirrored
    assert "absent_metric" not in state.mirrored_totals


def test_counters_that_appear_later_count_from_zero(vllm_text: Callable[..., str]) -> None:
    state = ServerState("ep", mirror=("output_critical_eviction_events",))
    scrape(state, vllm_text(), at=0.0)  # the labelled counter has no series before its first increment
    extra = 'output_critical_eviction_events_total{tier="output_critical"} 2\n'
    scrape(state, vllm_text() + extra, at=15.0)
    assert state.mirrored_totals["output_critical_eviction_events"].total == 2
    # Present from tokwatch's first scrape on: that value is history, not an increase.
    fresh = ServerState("ep2", mirror=("output_critical_eviction_events",))
    scrape(fresh, vllm_text() + extra, at=0.0)
    assert fresh.mirrored_totals["output_critical_eviction_events"].total == 0


def test_a_mirrored_counter_has_one_name_with_or_without_total(vllm_text: Callable[..., str]) -> None:
    state = ServerState("ep", mirror=("output_critical_eviction_events_total",))  # as configuration.md shows
    name = "output_critical_eviction_events_total"
    extra = f"# TYPE {name} counter\n{name} {{n}}\n"
    scrape(state, vllm_text() + extra.format(n=1), at=0.0)
    scrape(state, vllm_text() + extra.format(n=4), at=15.0)
    # the `metric` label docs/metrics.md's example alert and TokwatchServerEvictions match
    assert list(state.mirrored_totals) == ["output_critical_eviction_events"]
    assert state.mirrored_totals["output_critical_eviction_events"].total == 3


def test_repeated_identical_failures_log_once_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    state = ServerState("ep")
    with caplog.at_level(logging.DEBUG, logger="tokwatch.counters"):
        for _ in range(3):
            state.record_error(0.1, "connection refused")
        state.record_error(0.1, "timed out")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [("refused" in r.getMessage(), "timed out" in r.getMessage()) for r in warnings] == [
        (True, False),
        (False, True),
    ]
    assert state.scrape_errors == 4
