"""How far the client's own lateness can have moved each client-timed figure of a run, and which of them a
run therefore sets aside (docs/methodology.md, "Disturbance").

A stamp taken on a loop that ran late carries that lateness: it is up to λ seconds after the bytes arrived,
never before (`tokwatch.transport.measurement.StallMonitor.lateness` gives λ per stamp). A figure moves by at
most what
the lateness of the stamps it is made of allows, so each figure's bound is worked out from its own stamps: a
stall in the middle of a long decode moves neither the TTFT nor the ends of the client tok/s window, and
a server-sourced figure (engine timings, counter deltas, server wall time) is not moved at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokwatch.figures.result import SERVER_SOURCES, RunResult, TimingSource, TokenEvent
from tokwatch.figures.stats import percentiles
from tokwatch.figures.timing import itl
from tokwatch.settings.config import Tolerance

ITL_PERCENTILES = (50.0, 95.0, 99.0)  # the ITL percentiles a run stores (itl_p50_s, itl_p95_s, itl_p99_s)
CLIENT_STALL = "client_stall"  # the reason a figure is set aside: the client's own lateness (a busy host)
# The reason a client tok/s is set aside when every token after the first arrived in one read: a buffered
# answer's window is how fast the network delivered it, not a decode speed (issue 37: 13,417-16,026 tok/s).
ONE_READ = "one_read"
# The figures a run can set aside, as `set_aside` keys and the `figure` label of
# tokwatch_probe_figures_set_aside_total.
# `prefill` is the prefill tok/s taken from TTFT (source client_ttft): set aside with the TTFT it divides by.
FIGURES = ("tokens_per_second", "ttft", "itl", "tpot", "ttot", "e2e", "prefill")


@dataclass(frozen=True, slots=True)
class FigureBounds:
    """The largest error each client-timed figure of one run can carry from the client's lateness.

    Latency bounds are in seconds; tok/s bounds are relative to the figure (0.01 = 1 %)."""

    ttft_s: float | None = None
    itl_s: tuple[float, ...] = ()  # one per ITL_PERCENTILES
    tpot_s: float | None = None
    ttot_s: float | None = None
    e2e_s: float | None = None
    client_stream: float | None = None
    client_wall: float | None = None
    # Each per-token gap (in `timing.itl`'s order) lies in [gap - gap_down_s[i], gap + gap_up_s[i]]; both
    # empty when no stamp is late (every gap exact). A bench run bounds its pooled gaps' percentiles by them.
    gap_down_s: tuple[float, ...] = ()
    gap_up_s: tuple[float, ...] = ()

    def tps(self) -> dict[TimingSource, float]:
        """Relative bounds of the client tok/s candidates; server sources are never moved (0)."""
        out = dict.fromkeys(SERVER_SOURCES, 0.0)
        if self.client_stream is not None:
            out[TimingSource.CLIENT_STREAM] = self.client_stream
        if self.client_wall is not None:
            out[TimingSource.CLIENT_WALL] = self.client_wall
        return out


def figure_bounds(
    events: Sequence[TokenEvent], e2e_s: float | None, n_tokens: int, late: Sequence[float], late_end: float
) -> FigureBounds:
    """Bounds of a run's figures from the lateness of each event's stamp (`late[i]`) and of the last byte's
    (`late_end`), all in seconds; `n_tokens` is the completion-token count the figures divide by."""
    if not events:
        wall = late_end / e2e_s if e2e_s else None
        return FigureBounds(e2e_s=late_end if e2e_s is not None else None, client_wall=wall)
    if not late_end and not any(late):  # the common case: no stamp late, every bound 0 where it exists
        return _zero_bounds(events, e2e_s, n_tokens)
    first, last = late[0], late[-1]
    window = events[-1].t - events[0].t
    down, up = gap_bounds(events, late)
    # TPOT and client_stream's window run between two stamps: each end moves one way only, so the error is at
    # most the larger of the two ends' lateness (the width of the interval the true value lies in).
    return FigureBounds(
        ttft_s=first,
        itl_s=_itl_bounds(events, down, up),
        tpot_s=max(first, late_end) / (n_tokens - 1) if n_tokens >= 2 else None,
        ttot_s=_ttot_bound(events, late),
        e2e_s=late_end if e2e_s is not None else None,
        client_stream=max(first, last) / window if len(events) >= 2 and window > 0 else None,
        client_wall=late_end / e2e_s if e2e_s else None,
        gap_down_s=tuple(down),
        gap_up_s=tuple(up),
    )


def _zero_bounds(events: Sequence[TokenEvent], e2e_s: float | None, n_tokens: int) -> FigureBounds:
    """`figure_bounds` when no stamp is late: 0 for each figure the run has, None for the others."""
    has_gaps = len(events) > 1 or any(e.tokens > 1 for e in events)
    think = next((i for i, e in enumerate(events) if e.phase == "think"), None)
    return FigureBounds(
        ttft_s=0.0,
        itl_s=tuple(0.0 for _ in ITL_PERCENTILES) if has_gaps else (),
        tpot_s=0.0 if n_tokens >= 2 else None,
        ttot_s=0.0 if think is not None and any(e.phase != "think" for e in events[think:]) else None,
        e2e_s=0.0 if e2e_s is not None else None,
        client_stream=0.0 if len(events) >= 2 and events[-1].t > events[0].t else None,
        client_wall=0.0 if e2e_s else None,
    )


def gap_bounds(events: Sequence[TokenEvent], late: Sequence[float]) -> tuple[list[float], list[float]]:
    """How far each per-token gap (in `timing.itl`'s order) can be below and above its value: a gap lies in
    [gap - λ(its end), gap + λ(its start)] and is never negative; a chunk's extra tokens arrived with it, so
    their zero gaps are the server's chunking, not a stamp (0 both ways)."""
    down: list[float] = []
    up: list[float] = []
    for i, e in enumerate(events):
        if i:
            down.append(min(e.t - events[i - 1].t, late[i]))
            up.append(late[i - 1])
        down.extend([0.0] * (e.tokens - 1))
        up.extend([0.0] * (e.tokens - 1))
    return down, up


def shifted_percentiles(
    values: Sequence[float], down: Sequence[float], up: Sequence[float], qs: Sequence[float]
) -> list[float]:
    """The bound of each percentile `qs` of `values` when each value lies in [value - down, value + up]: a
    percentile is monotone in every value, so the true one lies between those of the two shifted lists."""
    mid = percentiles(values, qs)
    lows = percentiles([v - d for v, d in zip(values, down, strict=True)], qs)
    highs = percentiles([v + u for v, u in zip(values, up, strict=True)], qs)
    return [max(m - lo, hi - m) for m, lo, hi in zip(mid, lows, highs, strict=True)]


def _itl_bounds(
    events: Sequence[TokenEvent], down: Sequence[float], up: Sequence[float]
) -> tuple[float, ...]:
    """Bounds of the ITL percentiles: `shifted_percentiles` of the gaps within their `gap_bounds`."""
    if not down:
        return ()
    return tuple(shifted_percentiles(itl(events), down, up, ITL_PERCENTILES))


def _ttot_bound(events: Sequence[TokenEvent], late: Sequence[float]) -> float | None:
    """TTOT runs from the last reasoning stamp to the first output stamp (as
    `tokwatch.figures.timing.ttot`)."""
    last_think: int | None = None
    for i, e in enumerate(events):
        if e.phase == "think":
            last_think = i
        elif last_think is not None:
            return max(late[last_think], late[i])
    return None


def latency_checks(
    bounds: FigureBounds,
    *,
    ttft_s: float | None,
    itl_s: Sequence[float],
    tpot_s: float | None,
    ttot_s: float | None,
    e2e_s: float | None,
) -> list[tuple[str, float | None, float | None]]:
    """(figure, value, error bound) of each latency figure of one run or request: TTFT, the ITL
    percentiles, TPOT, TTOT, E2E (a bound is None where its figure is)."""
    itl_values = percentiles(itl_s, ITL_PERCENTILES) if itl_s and bounds.itl_s else []
    return [
        ("ttft", ttft_s, bounds.ttft_s if ttft_s is not None else None),
        *(("itl", v, b) for v, b in zip(itl_values, bounds.itl_s, strict=False)),
        ("tpot", tpot_s, bounds.tpot_s if tpot_s is not None else None),
        ("ttot", ttot_s, bounds.ttot_s if ttot_s is not None else None),
        ("e2e", e2e_s, bounds.e2e_s if e2e_s is not None else None),
    ]


def beyond_tolerance(
    checks: Sequence[tuple[str, float | None, float | None]], tolerance: Tolerance
) -> list[str]:
    """The figures whose bound exceeds their tolerance: the larger of `tolerance.latency_floor` and
    `tolerance.latency` of the figure (each named once, in the order of `checks`)."""
    out: list[str] = []
    for figure, value, bound in checks:
        if (
            value is not None
            and bound is not None
            and bound > tolerance.latency_limit(value)
            and figure not in out
        ):
            out.append(figure)
    return out


def judge_latencies(result: RunResult, bounds: FigureBounds, tolerance: Tolerance) -> None:
    """Store each latency figure's bound on the run and set aside those beyond their tolerance
    (`beyond_tolerance`)."""
    checks = latency_checks(
        bounds, ttft_s=result.ttft_s, itl_s=result.itl_s, tpot_s=result.tpot_s, ttot_s=result.ttot_s,
        e2e_s=result.e2e_s,
    )  # fmt: skip
    result.ttft_error_s = bounds.ttft_s if result.ttft_s is not None else None
    result.tpot_error_s = bounds.tpot_s if result.tpot_s is not None else None
    result.ttot_error_s = bounds.ttot_s if result.ttot_s is not None else None
    result.e2e_error_s = bounds.e2e_s if result.e2e_s is not None else None
    result.itl_error_s = max(bounds.itl_s) if any(f == "itl" for f, _, _ in checks) else None
    for figure in beyond_tolerance(checks, tolerance):
        result.set_aside[figure] = CLIENT_STALL
