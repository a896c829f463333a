"""Pure timing math: apportioning, TTFT/ITL/TPOT/TTOT, tok/s candidates and source selection."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from tokwatch.figures.result import TimingSource, TokenEvent
from tokwatch.figures.timing import (
    apportion,
    client_prefill_tps,
    client_stream_tps,
    client_wall_tps,
    itl,
    ollama_engine_tps,
    ollama_server_wall_tps,
    output_itl,
    select_source,
    token_events,
    total_tokens,
    tpot,
    ttft,
    ttot,
)

S = TimingSource


@dataclass(frozen=True)
class D:
    t: float
    chars: int
    phase: str = "output"
    chunk_tokens: int | None = None
    chunk: int = field(default_factory=itertools.count().__next__)


def test_apportion_keeps_one_per_chunk_and_splits_surplus_by_length() -> None:
    assert apportion(22, [3, 8, 7, 4, 1] + [1] * 16) == [1, 2, 1, 1, 1] + [1] * 16
    assert apportion(10, [1, 1, 8]) == [2, 2, 6]  # surplus 7 -> 0.7, 0.7, 5.6
    assert sum(apportion(100, [5, 3, 2, 7])) == 100
    assert apportion(5, [0, 0]) == [3, 2]
    assert apportion(1, [2, 5]) == [0, 1]  # fewer tokens than chunks: plain largest remainder
    assert apportion(3, []) == []


def test_token_events_sources() -> None:
    deltas = [D(10.1, 3), D(10.2, 6), D(10.3, 3)]
    ev, src = token_events(deltas, 10.0, 6)
    assert src == "usage" and [e.tokens for e in ev] == [2, 2, 2]  # surplus 3 split 0.75/1.5/0.75
    assert ev[0].t == pytest.approx(0.1)
    ev, src = token_events(deltas, 10.0, None)
    assert src == "client_estimate" and [e.tokens for e in ev] == [1, 1, 1]
    ev, src = token_events(deltas, 10.0, 2)  # usage smaller than the chunk count is not trusted per chunk
    assert src == "client_estimate"
    ev, src = token_events([D(1, 1, chunk_tokens=2), D(2, 1, chunk_tokens=0), D(3, 1, chunk_tokens=3)], 0, 99)
    assert src == "chunk_usage" and [(e.t, e.tokens) for e in ev] == [(1, 2), (3, 3)]
    ev, src = token_events([D(1, 4), D(2, 4)], 0.0, 8, "engine")
    assert src == "engine" and total_tokens(ev) == 8
    assert token_events([], 0.0, 5) == ([], None)


def test_chunk_spanning_both_phases_counts_as_one_chunk() -> None:
    # "</think>\n\n" arrives as one chunk: 3 chunks, 3 tokens; the mixed chunk's token goes to its longer part
    deltas = [
        D(1.0, 5, "think", chunk=1),
        D(2.0, 8, "think", chunk=2),
        D(2.0, 2, "output", chunk=2),
        D(3.0, 3, chunk=3),
    ]
    ev, src = token_events(deltas, 0.0, 3)
    assert src == "usage"
    assert [(e.t, e.tokens, e.phase) for e in ev] == [
        (1.0, 1, "think"),
        (2.0, 1, "think"),
        (3.0, 1, "output"),
    ]
    ev, src = token_events(deltas, 0.0, 7)  # surplus 4 over chunk lengths 5/10/3, then by part length
    assert src == "usage" and total_tokens(ev) == 7
    assert apportion(3, [8, 2], at_least_one=False) == [2, 1]
    assert apportion(1, [2, 8], at_least_one=False) == [0, 1]


def _ev(*items: tuple[float, int, str]) -> list[TokenEvent]:
    return [TokenEvent(t=t, tokens=k, phase=p) for t, k, p in items]  # type: ignore[arg-type]


def test_ttft_itl_multi_token_chunks() -> None:
    ev = _ev((0.5, 2, "output"), (0.6, 1, "output"), (0.8, 3, "output"))
    assert ttft(ev) == 0.5
    gaps = itl(ev)
    assert gaps == pytest.approx([0.0, 0.1, 0.2, 0.0, 0.0])
    assert len(gaps) == total_tokens(ev) - 1
    assert sum(gaps) == pytest.approx(0.8 - 0.5)
    assert ttft([]) is None and itl([]) == []


def test_reasoning_ttot_and_output_itl() -> None:
    ev = _ev((0.2, 1, "think"), (0.3, 1, "think"), (0.9, 1, "output"), (1.0, 2, "output"))
    assert ttot(ev) == pytest.approx(0.6)
    assert output_itl(ev) == pytest.approx([0.1, 0.0])
    assert itl(ev) == pytest.approx([0.1, 0.6, 0.1, 0.0])
    assert ttot(_ev((0.1, 1, "output"))) is None
    assert ttot(_ev((0.1, 1, "think"))) is None


def test_tpot_and_rates() -> None:
    assert tpot(2.0, 0.5, 4) == pytest.approx(0.5)
    assert tpot(2.0, 0.5, 1) is None
    ev = _ev((0.5, 2, "output"), (1.0, 1, "output"), (1.5, 3, "output"))
    assert client_stream_tps(ev) == pytest.approx((6 - 2) / 1.0)
    assert client_stream_tps(ev, 10) == pytest.approx((10 - 2) / 1.0)
    assert client_stream_tps(ev[:1]) is None
    assert client_wall_tps(100, 4.0) == 25.0
    assert client_wall_tps(0, 4.0) is None
    assert ollama_engine_tps(100, 2_000_000_000) == 50.0
    assert ollama_server_wall_tps(100, 4_000_000_000) == 25.0
    assert ollama_engine_tps(100, 0) is None


def test_select_follows_the_configured_order() -> None:
    pref = (S.ENGINE, S.VLLM_METRICS, S.SERVER_WALL, S.CLIENT_STREAM, S.CLIENT_WALL)
    sel = select_source({S.CLIENT_STREAM: 50.0, S.CLIENT_WALL: 40.0}, pref)
    assert (sel.source, sel.tokens_per_second) == (S.CLIENT_STREAM, 50.0)
    sel = select_source({S.ENGINE: 60.0, S.CLIENT_STREAM: 50.0}, pref)
    assert sel.source is S.ENGINE
    sel = select_source({S.ENGINE: 60.0, S.CLIENT_STREAM: 50.0}, (S.CLIENT_STREAM, S.ENGINE))
    assert sel.source is S.CLIENT_STREAM  # the user asked for the client's measurement first
    sel = select_source({S.ENGINE: 60.0, S.CLIENT_STREAM: 50.0}, (S.CLIENT_STREAM,))
    assert sel.source is S.CLIENT_STREAM  # `[client_stream]` is honoured even with engine timings
    sel = select_source({S.CLIENT_WALL: 40.0}, (S.CLIENT_STREAM,))
    assert sel.source is None  # not preferred -> not used
    assert select_source({}, pref).source is None


def test_shared_counter_window_policy() -> None:
    pref = (S.VLLM_METRICS, S.CLIENT_STREAM)
    c = {S.VLLM_METRICS: 70.0, S.CLIENT_STREAM: 50.0}
    sel = select_source(c, pref, counters_shared=True, shared_policy="fallback")
    assert sel.source is S.CLIENT_STREAM and not sel.server_shared and S.VLLM_METRICS in sel.skipped
    sel = select_source(c, pref, counters_shared=True, shared_policy="flag")
    assert sel.source is S.VLLM_METRICS and sel.server_shared
    sel = select_source(c, pref, counters_shared=False, shared_policy="fallback")
    assert sel.source is S.VLLM_METRICS and not sel.server_shared


def test_client_prefill_takes_the_network_round_trip_off_the_ttft() -> None:
    """Issue 21: prefill tok/s = computed prompt tokens / (TTFT - network round trip where measured)."""
    assert client_prefill_tps(1100, 100, 0.5) == pytest.approx(2000.0)
    assert client_prefill_tps(1100, 100, 0.5, network_rtt_s=0.1) == pytest.approx(2500.0)
    assert client_prefill_tps(1100, 100, 0.5, network_rtt_s=None) == pytest.approx(2000.0)
    assert client_prefill_tps(1100, 100, 0.1, network_rtt_s=0.1) is None  # no server time left to divide by
    assert client_prefill_tps(100, 100, 0.5) is None  # everything came from the cache
