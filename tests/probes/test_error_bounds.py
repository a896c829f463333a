"""Disturbance by impact, worked out by hand: each client-timed figure's error bound from the lateness of the
stamps it uses, which figures a run sets aside at the tolerance, and the tok/s source choice around it."""

from __future__ import annotations

import pytest

from tokwatch.figures.result import RunResult, Status, TimingSource, TokenEvent
from tokwatch.figures.timing import itl, select_within_tolerance
from tokwatch.probes.error_bounds import figure_bounds, judge_latencies
from tokwatch.settings.config import Tolerance, load_config_text
from tokwatch.settings.strict_yaml import ConfigError

CS, CW, ENGINE, COUNTERS = (
    TimingSource.CLIENT_STREAM,
    TimingSource.CLIENT_WALL,
    TimingSource.ENGINE,
    TimingSource.VLLM_METRICS,
)
PREFERENCE = (ENGINE, COUNTERS, TimingSource.SERVER_WALL, CS, CW)


def _events(*times: float, tokens: int = 1) -> list[TokenEvent]:
    return [TokenEvent(t=t, tokens=tokens, phase="output") for t in times]


# Five one-token chunks 10 ms apart from 100 ms on, the last byte at 145 ms; the first token's stamp may be
# 4 ms late, the last one's 2 ms, the last byte's 3 ms (the loop stalled around them).
EVENTS = _events(0.100, 0.110, 0.120, 0.130, 0.140)
LATE = [0.004, 0.0, 0.0, 0.0, 0.002]


def test_each_figure_is_bounded_by_the_lateness_of_its_own_stamps() -> None:
    b = figure_bounds(EVENTS, 0.145, 5, LATE, 0.003)
    assert b.ttft_s == 0.004  # the first token's stamp
    assert b.e2e_s == 0.003  # the last byte's stamp
    assert b.client_stream == pytest.approx(0.004 / 0.040)  # the larger end over the 40 ms window: 10 %
    assert b.client_wall == pytest.approx(0.003 / 0.145)
    assert b.tpot_s == pytest.approx(max(0.004, 0.003) / 4)  # (E2E - TTFT) over n - 1 tokens
    # gaps 10 ms each; the first may be 14 ms (its start stamped 4 ms late), the last 8 ms: p50 cannot move,
    # p95 and p99 interpolate towards the 14 ms one (positions 2.85 and 2.97 of 0..3)
    assert b.itl_s == pytest.approx((0.0, 0.004 * 0.85, 0.004 * 0.97))
    servers = {ENGINE: 0.0, COUNTERS: 0.0, TimingSource.SERVER_WALL: 0.0}
    assert b.tps() == {**servers, CS: b.client_stream, CW: b.client_wall}


def test_a_stall_between_the_ends_moves_neither_the_ttft_nor_the_tps_window() -> None:
    b = figure_bounds(EVENTS, 0.145, 5, [0.0, 0.0, 0.030, 0.0, 0.0], 0.0)
    assert (b.ttft_s, b.client_stream, b.client_wall, b.tpot_s, b.e2e_s) == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert max(b.itl_s) > 0.0  # the gaps on either side of the late stamp can be off by 30 ms


def test_a_multi_token_chunk_keeps_its_zero_gaps_exact() -> None:
    events = [TokenEvent(0.1, 2, "output"), TokenEvent(0.2, 1, "output")]
    assert itl(events) == [0.0, pytest.approx(0.1)]  # the order the bounds follow
    b = figure_bounds(events, 0.2, 3, [0.05, 0.0], 0.0)
    # p50 of [0, 0.1] is 0.05; with the gap up to 0.15 it is 0.075; the zero is the server's chunking
    assert b.itl_s[0] == pytest.approx(0.025)


def test_ttot_is_bounded_by_its_two_stamps() -> None:
    events = [TokenEvent(0.1, 1, "think"), TokenEvent(0.2, 1, "think"), TokenEvent(0.3, 1, "output")]
    assert figure_bounds(events, 0.3, 3, [0.0, 0.003, 0.002], 0.0).ttot_s == 0.003
    assert figure_bounds(EVENTS, 0.145, 5, LATE, 0.003).ttot_s is None  # no reasoning phase


def test_latencies_are_set_aside_only_beyond_their_tolerance() -> None:
    run = RunResult(endpoint="a", started_at=0.0, status=Status.OK, streamed=True)
    run.ttft_s, run.itl_s, run.e2e_s = 0.100, itl(EVENTS), 0.145
    run.tpot_s = (0.145 - 0.100) / 4
    judge_latencies(run, figure_bounds(EVENTS, 0.145, 5, LATE, 0.003), Tolerance())
    # TTFT: 4 ms against max(1 ms, 5 % of 100 ms) = 5 ms: kept; E2E: 3 ms against 7.25 ms: kept;
    # TPOT: 1 ms against max(1 ms, 0.56 ms): kept (not above); ITL p95: 3.4 ms against 1 ms: set aside
    assert run.set_aside == {"itl": "client_stall"}
    assert (run.ttft_error_s, run.e2e_error_s) == (0.004, 0.003)
    assert run.itl_error_s == pytest.approx(0.004 * 0.97) and run.tpot_error_s == pytest.approx(0.001)
    strict = Tolerance(latency=0.01, latency_floor=0.0005)  # TTFT limit 1 ms, E2E 1.45 ms
    judge_latencies(run, figure_bounds(EVENTS, 0.145, 5, LATE, 0.003), strict)
    assert set(run.set_aside) == {"itl", "ttft", "tpot", "e2e"}


def test_a_client_tps_beyond_the_tolerance_gives_way_to_a_server_figure() -> None:
    bounds = {CS: 0.02, CW: 0.0, ENGINE: 0.0}
    # the client figure is within 3 %: kept, even on a stalled run
    chosen, aside = select_within_tolerance({CS: 50.0}, PREFERENCE, bounds, 0.03)
    assert (chosen.source, chosen.tokens_per_second, aside) == (CS, 50.0, False)
    # beyond 1 %, with no server figure: kept on the run, set aside; client_wall (another measure) is no
    # fallback even though its own bound is 0
    chosen, aside = select_within_tolerance({CS: 50.0, CW: 40.0}, PREFERENCE, bounds, 0.01)
    assert (chosen.source, aside) == (CS, True)
    # a preference that puts the client first falls back on the server's figure
    chosen, aside = select_within_tolerance({CS: 50.0, ENGINE: 48.0}, (CS, ENGINE), bounds, 0.01)
    assert (chosen.source, chosen.tokens_per_second, aside) == (ENGINE, 48.0, False)
    # ... but only on a source the preference lists
    chosen, aside = select_within_tolerance({CS: 50.0, ENGINE: 48.0}, (CS,), bounds, 0.01)
    assert (chosen.source, aside) == (CS, True)
    # a server figure is never set aside, whatever the client's lateness
    chosen, aside = select_within_tolerance({CS: 50.0, ENGINE: 48.0}, PREFERENCE, {CS: 1.0}, 0.01)
    assert (chosen.source, aside) == (ENGINE, False)
    # a shared counter window stays skipped under "fallback"
    shared = {CS: 50.0, COUNTERS: 45.0}
    chosen, aside = select_within_tolerance(shared, PREFERENCE, bounds, 0.01, counters_shared=True)
    assert (chosen.source, aside, chosen.skipped) == (CS, True, {COUNTERS: "shared window"})


BASE = """
endpoints:
  - {name: a, kind: openai, base_url: 'http://127.0.0.1:8000/v1', model: m}
"""


def test_tolerances_are_configured_as_ratios_and_a_duration() -> None:
    assert load_config_text(BASE).probe.tolerance == Tolerance(tokens_per_second=0.01, latency=0.05)
    text = "probe: {tolerance: {tokens_per_second: 2%, latency: 0.1, latency_floor: 2ms}}"
    cfg = load_config_text(text + BASE)
    assert cfg.probe.tolerance == Tolerance(tokens_per_second=0.02, latency=0.1, latency_floor=0.002)
    assert cfg.probe.tolerance.latency_limit(0.01) == 0.002 and cfg.probe.tolerance.latency_limit(1.0) == 0.1
    with pytest.raises(ConfigError, match=r"t.yml:1: probe.tolerance.tokens_per_second: .*above 0 and below"):
        load_config_text("probe: {tolerance: {tokens_per_second: 150%}}" + BASE, "t.yml")


def test_the_replaced_threshold_says_what_replaced_it() -> None:
    with pytest.raises(ConfigError, match=r"t.yml:3: probe.disturbance_threshold: .*replaced by probe.toler"):
        load_config_text("probe:\n  max_tokens: 10\n  disturbance_threshold: 5ms\n" + BASE, "t.yml")


@pytest.mark.parametrize(
    "events",
    [
        EVENTS,
        _events(0.1),  # one token: no gap
        _events(0.1, tokens=3),  # one chunk of three: zero gaps
        [TokenEvent(0.1, 1, "think"), TokenEvent(0.2, 1, "think"), TokenEvent(0.3, 2, "output")],
        [TokenEvent(0.1, 1, "output"), TokenEvent(0.1, 1, "output")],  # one read: no window
    ],
)
def test_no_late_stamp_gives_the_general_bounds_at_zero(events: list[TokenEvent]) -> None:
    """The shortcut for a request no stall touched gives what the general bounds give at (nearly) zero."""
    zero = figure_bounds(events, 0.5, 5, [0.0] * len(events), 0.0)
    tiny = figure_bounds(events, 0.5, 5, [1e-300] * len(events), 1e-300)  # the general path
    for name in ("ttft_s", "tpot_s", "ttot_s", "e2e_s", "client_stream", "client_wall"):
        a, b = getattr(zero, name), getattr(tiny, name)
        assert (a is None) is (b is None) and (a is None or a == pytest.approx(b, abs=1e-200)), name
    assert len(zero.itl_s) == len(tiny.itl_s) and not any(zero.itl_s)
