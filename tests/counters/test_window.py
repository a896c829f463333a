"""The counter-delta timing source: one run's decode tok/s, contamination flags, resets."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tokwatch.counters.parse import parse_metrics
from tokwatch.counters.reading import CounterReading
from tokwatch.counters.vllm import read_vllm
from tokwatch.counters.window import ServerCounterWindow, WindowSnapshot, measure_readings

# One finished request of 257 tokens (256 decode gaps) decoded in 2.56 s -> 100 tok/s.
BEFORE = {"gen_sum": 1000, "gen_count": 10, "decode_s": 30.0, "generation": 1000, "success": 10}
AFTER = {"gen_sum": 1257, "gen_count": 11, "decode_s": 32.56, "generation": 1257, "success": 11}


def reading(vllm_text: Callable[..., str], **figures: float) -> CounterReading:
    return read_vllm(parse_metrics(vllm_text(**figures)), "m")


def test_clean_window_gives_decode_rate_over_n_minus_1_tokens(vllm_text: Callable[..., str]) -> None:
    m = measure_readings(reading(vllm_text, **BEFORE), reading(vllm_text, **AFTER))
    assert m.tokens_per_second == pytest.approx(100.0)
    assert not m.shared and m.reason is None


def test_after_snapshot_may_still_count_the_run_itself(vllm_text: Callable[..., str]) -> None:
    m = measure_readings(reading(vllm_text, **BEFORE), reading(vllm_text, **AFTER, running=1))
    assert not m.shared and m.tokens_per_second == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("before_extra", "after_extra", "why"),
    [
        ({}, {"success": 12, "gen_count": 12, "gen_sum": 1300}, "2 requests finished"),
        ({"running": 1}, {}, "1 request running before"),
        ({}, {"running": 2}, "2 requests running after"),
        ({}, {"waiting": 3}, "3 requests waiting after"),
        ({}, {"preemptions": 1}, "1 preemptions"),
    ],
)
def test_contamination_is_flagged_with_a_reason(
    vllm_text: Callable[..., str], before_extra: dict[str, float], after_extra: dict[str, float], why: str
) -> None:
    m = measure_readings(
        reading(vllm_text, **{**BEFORE, **before_extra}), reading(vllm_text, **{**AFTER, **after_extra})
    )
    assert m.shared
    assert m.reason is not None and why in m.reason
    assert m.tokens_per_second is not None and m.tokens_per_second > 0


def test_run_not_yet_recorded_gives_no_figure(vllm_text: Callable[..., str]) -> None:
    m = measure_readings(reading(vllm_text, **BEFORE), reading(vllm_text, **BEFORE))
    assert m.tokens_per_second is None
    assert m.reason is not None and "not in the server's finished-request counters" in m.reason


@pytest.mark.parametrize(
    "after",
    [
        {"gen_sum": 257, "gen_count": 1, "decode_s": 2.56, "generation": 257, "success": 1},  # restart
        {**AFTER, "created": 1800000000.0},  # restart, and counters already past their old values
    ],
)
def test_counter_reset_gives_no_figure(vllm_text: Callable[..., str], after: dict[str, float]) -> None:
    m = measure_readings(reading(vllm_text, **BEFORE), reading(vllm_text, **after))
    assert m.tokens_per_second is None
    assert m.reason is not None and "reset" in m.reason


def test_missing_snapshots_and_missing_decode_counters() -> None:
    empty = CounterReading(server="llamacpp")
    assert measure_readings(None, empty).reason == "server /metrics unreadable before the run"
    assert measure_readings(empty, None).reason == "server /metrics unreadable after the run"
    assert measure_readings(empty, empty).reason == "llamacpp exposes no decode-time counters"


def test_llamacpp_batched_decode_is_shared() -> None:
    def llama(tokens: float, seconds: float, calls: float) -> CounterReading:
        return CounterReading(
            server="llamacpp",
            basis="tokens_predicted_seconds",
            generation_tokens=tokens,
            decode_tokens=tokens,
            decode_seconds=seconds,
            decode_calls=calls,
            running=0,
            raw={"t": tokens, "s": seconds, "c": calls},
        )

    alone = measure_readings(llama(0, 0, 0), llama(256, 2.56, 256))
    assert alone.tokens_per_second == pytest.approx(100) and not alone.shared
    batched = measure_readings(llama(0, 0, 0), llama(512, 5.12, 300))
    assert batched.shared and batched.reason is not None and "batched" in batched.reason


async def test_window_protocol_round_trip(vllm_text: Callable[..., str]) -> None:
    readings = iter([reading(vllm_text, **BEFORE), reading(vllm_text, **AFTER), None])

    async def fetch() -> CounterReading | None:
        return next(readings)

    window = ServerCounterWindow(fetch)
    before = await window.snapshot()
    after = await window.snapshot()
    assert isinstance(before, WindowSnapshot) and isinstance(after, WindowSnapshot)
    assert window.measure(before, after).tokens_per_second == pytest.approx(100.0)
    assert await window.snapshot() is None
    assert window.measure(before, object()).tokens_per_second is None


def test_series_created_during_the_window_count_from_zero() -> None:
    def sglang(
        preemptions: float | None, finished: float | None, tokens: float, seconds: float
    ) -> CounterReading:
        return CounterReading(
            server="sglang",
            basis="inter_token_latency",
            finished_requests=finished,
            preemptions=preemptions,
            decode_tokens=tokens,
            decode_seconds=seconds,
            raw={"t": tokens, "s": seconds},
        )

    # SGLang creates its retraction counter at the first retraction and its request counter at the first
    # finished request: absent before, present after.
    m = measure_readings(sglang(None, None, 0, 0), sglang(1, 1, 100, 1.0))
    assert m.tokens_per_second == pytest.approx(100) and m.shared
    assert m.reason == "1 preemptions in the window"


def test_llamacpp_speculative_decoding_is_not_mistaken_for_batching(
    sample_text: Callable[[str], str],
) -> None:
    from tokwatch.counters.llamacpp import read_llamacpp

    text = sample_text("llamacpp_metrics_after.txt")
    after = read_llamacpp(parse_metrics(text), None)
    spec = text.replace(
        "llamacpp:spec_decode_num_accepted_tokens_total 0",
        "llamacpp:spec_decode_num_accepted_tokens_total 400",
    ).replace("llamacpp:n_decode_total 893", "llamacpp:n_decode_total 493")
    assert read_llamacpp(parse_metrics(spec), None).decode_calls == after.decode_calls == 893
