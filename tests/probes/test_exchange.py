"""The probe and the bench are two faces of one exchange (tokwatch.probes.exchange): the same server answer
gives both the same counts, figures and verdicts. One test per divergence issue 35 found (Ollama's cached
prompt tokens, the think/output split, failure verdicts, kind knowledge in the bench)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tokwatch.bench.client import Deadlines, Target, _fill_figures, execute
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures.result import RunResult, Status, TimingSource
from tokwatch.probes import get_probe, probe_class
from tokwatch.probes.base import run_probe
from tokwatch.probes.exchange import (
    WHOLE_READ_BYTES,
    Exchange,
    Request,
    _read_kernel_stamped,
    answer_verdict,
    fill_figures,
    run_exchange,
)
from tokwatch.probes.http import HttpProbe, plan_for
from tokwatch.settings.redact import Redactor
from tokwatch.transport import kernel_stamps
from tokwatch.transport.http import HttpClient
from tokwatch.transport.measurement import StallMonitor, StampLateness

PROMPT = "Say something about the sea."
BENCH_DIR = Path(__file__).resolve().parents[2] / "exporter" / "tokwatch" / "bench"


async def _bench(http: HttpClient, base_url: str, kind: str, max_tokens: int) -> RequestRecord:
    """One bench request with the probe's prompt, as `tokwatch bench` sends it."""
    record = RequestRecord(request_id=0, category="chat", max_tokens=max_tokens)
    await execute(
        http,
        Target(kind, base_url, "m", None, timeout_s=10),
        [{"role": "user", "content": PROMPT}],
        record,
        run_t0=time.perf_counter(),
        deadlines=Deadlines(1.0, 0.05),
        redactor=Redactor([]),
    )
    return record


async def _probe(make_ctx: Any, base_url: str, kind: str, max_tokens: int) -> RunResult:
    """One timed probe run with the same prompt (no warm-up, the prompt as configured)."""
    ctx = make_ctx(
        base_url, kind, max_tokens=max_tokens, prompt=PROMPT, warmup=False, timed_prompt="same",
        short_output="ok",
    )  # fmt: skip
    return await run_probe(get_probe(kind), ctx)


def _counts(r: RunResult | RequestRecord) -> dict[str, Any]:
    return {
        "status": r.status,
        "error_class": r.error_class,
        "output_tokens": r.output_tokens,
        "think_tokens": r.think_tokens,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "tokens_source": r.tokens_source,
        "finish_reason": r.finish_reason,
    }


def _ndjson_line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


async def _ollama_cached(request: web.Request) -> web.StreamResponse:
    """An Ollama version that reports the prompt tokens it served from its cache."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    for word in ("The ", "sea ", "is ", "wide."):
        await resp.write(_ndjson_line({"model": "m", "message": {"role": "assistant", "content": word}}))
        await asyncio.sleep(0.005)
    final = {
        "model": "m", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop",
        "total_duration": 90_000_000, "load_duration": 2_000_000, "prompt_eval_count": 40,
        "prompt_eval_cached_count": 32, "prompt_eval_duration": 8_000_000, "eval_count": 4,
        "eval_duration": 40_000_000,
    }  # fmt: skip
    await resp.write(_ndjson_line(final))
    return resp


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _reasoning_usage_disagrees(request: web.Request) -> web.StreamResponse:
    """A server whose `usage.completion_tokens_details.reasoning_tokens` (10) is not what its stream carried
    in the reasoning phase (2 of 5 tokens): methodology counts the phases from the stream."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    deltas = [{"reasoning_content": "hmm"}, {"reasoning_content": " so"}, *({"content": w} for w in "abc")]
    for delta in deltas:
        await resp.write(_sse({"model": "m", "choices": [{"index": 0, "delta": delta}]}))
        await asyncio.sleep(0.005)
    usage = {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "completion_tokens_details": {"reasoning_tokens": 10},
    }
    await resp.write(_sse({"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    await resp.write(_sse({"model": "m", "choices": [], "usage": usage}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def test_ollama_cached_prompt_tokens_are_the_same_for_probe_and_bench(serve, make_ctx, http) -> None:
    base = await serve({"/api/chat": _ollama_cached})
    probe = await _probe(make_ctx, base, "ollama", 4)
    bench = await _bench(http, base, "ollama", 4)
    assert probe.status is Status.OK, probe.error_message
    assert _counts(probe) == _counts(bench)
    assert (bench.prompt_tokens, bench.cached_tokens) == (40, 32)


async def test_think_output_split_is_counted_from_the_stream_by_both_faces(serve, make_ctx, http) -> None:
    base = await serve({"/v1/chat/completions": _reasoning_usage_disagrees})
    probe = await _probe(make_ctx, base, "vllm", 5)
    bench = await _bench(http, base, "vllm", 5)
    assert probe.status is Status.OK, probe.error_message
    assert _counts(probe) == _counts(bench)
    assert (bench.think_tokens, bench.output_tokens) == (2, 3)  # not usage's 10 reasoning tokens


async def test_think_output_split_from_the_simulator(start_sim, server, make_ctx, http) -> None:
    # Two identical servers, one per face: a prefix cache warmed by one face's request cannot change the
    # other's cached count.
    model = {"decode_tps": 400, "think_tokens": 5}
    sim = await start_sim(server("p", "vllm", **model), server("b", "vllm", **model))
    probe = await _probe(make_ctx, sim.base_url("p"), "vllm", 12)
    bench = await _bench(http, sim.base_url("b"), "vllm", 12)
    assert probe.status is Status.OK, probe.error_message
    assert _counts(probe) == _counts(bench)
    assert (bench.think_tokens, bench.output_tokens) == (5, 7)


@pytest.mark.parametrize(
    ("fault", "status", "error_class"),
    [
        ("http_429", Status.RATE_LIMITED, "http_429"),
        ("http_5xx", Status.PROVIDER_ERROR, "http_5xx"),
        ("http_401", Status.AUTH_FAILURE, "http_401"),
        ("error_mid_stream", Status.PROVIDER_ERROR, "stream_error"),
        ("malformed_json", Status.PROVIDER_ERROR, "malformed_json"),
    ],
)
async def test_failure_verdicts_are_the_same_for_probe_and_bench(
    start_sim, server, make_ctx, http, fault: str, status: Status, error_class: str
) -> None:
    sim = await start_sim(server("o", "openai", fault_after_tokens=2))
    sim.set_faults("o", "m", **{fault: 1.0})
    probe = await _probe(make_ctx, sim.base_url("o"), "openai", 8)
    bench = await _bench(http, sim.base_url("o"), "openai", 8)
    assert (probe.status, probe.error_class) == (status, error_class), probe.error_message
    assert (bench.status, bench.error_class) == (status, error_class), bench.error_message


@pytest.mark.parametrize(
    ("mode", "error_class"),
    [
        ("wrong_model", "model_mismatch"),
        ("too_many_tokens", "implausible_tokens"),
        ("runaway", "max_tokens_ignored"),
    ],
)
async def test_answer_verdicts_are_the_same_for_probe_and_bench(
    serve, make_ctx, http, mode: str, error_class: str
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        name = "other-model" if mode == "wrong_model" else "m"
        words = [f" w{i}" for i in range(40)] if mode == "runaway" else ["one ", "two"]
        for word in words:
            await resp.write(_sse({"model": name, "choices": [{"index": 0, "delta": {"content": word}}]}))
        if mode != "wrong_model":  # the server's own count: 500 for two words, or every word it sent
            usage = {"completion_tokens": 500 if mode == "too_many_tokens" else len(words)}
            await resp.write(_sse({"model": name, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    base = await serve({"/v1/chat/completions": handler})
    probe = await _probe(make_ctx, base, "openai", 2)
    bench = await _bench(http, base, "openai", 2)
    assert probe.error_class == bench.error_class == error_class
    assert probe.status is bench.status


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "ollama", "anthropic"])
async def test_one_exchange_gives_both_faces_the_same_figures(
    start_sim, server, make_ctx, http, kind
) -> None:
    """The same answer (one exchange) through the probe's and the bench's fill: identical counts and
    figures, to the bit."""
    sim = await start_sim(server("s", kind, decode_tps=300, think_tokens=3, jitter=0.2))
    ctx = make_ctx(sim.base_url("s"), kind, max_tokens=10, prompt=PROMPT, timed_prompt="same")
    probe = get_probe(kind)
    assert isinstance(probe, HttpProbe)
    plan = plan_for(ctx)
    url, body = probe.request(ctx, plan)
    ex = await run_exchange(http, probe_class(kind), Request(url, body, probe.headers(None), 10.0))
    assert ex.ok, ex.failure
    result = RunResult(endpoint="ep", started_at=0.0, status=Status.OK, streamed=ex.streamed)
    probe._fill(ctx, plan, result, ex, None)
    record = RequestRecord(request_id=0, category="chat", max_tokens=10)
    _fill_figures(record, ex, Deadlines(1.0, 0.05))
    assert _counts(result) == _counts(record)
    assert (result.think_tokens, result.output_tokens) == (3, 7)
    assert result.ttft_s == record.ttft_s and result.ttft_s is not None
    assert result.itl_s == record.tbt_s and len(record.tbt_s) == 9
    assert result.output_itl_s == record.output_itl_s
    assert (result.tpot_s, result.ttot_s, result.e2e_s) == (record.tpot_s, record.ttot_s, record.e2e_s)
    assert result.candidates.get(TimingSource.CLIENT_STREAM) == record.decode_tokens_per_s


def test_exchange_record_verdict_rules_in_order() -> None:
    ex = Exchange(sent_at=0.0, completion_tokens=0, text_bytes=0)

    def verdict() -> str | None:
        v = answer_verdict(ex, max_tokens=4, configured_model="m")
        return None if v is None else v.error_class

    assert verdict() == "no_tokens"
    ex.completion_tokens, ex.tokens_source = 9, "usage"
    assert verdict() == "implausible_tokens"
    ex.text_bytes = 40
    assert verdict() == "max_tokens_ignored"
    ex.tokens_source = "client_estimate"  # a client count above max_tokens may be the client's chunking
    assert verdict() is None


# What only a kind's module may name: the wire fields of llama.cpp's `timings`, Ollama's final object and
# OpenAI's usage details.
KIND_WIRE_FIELDS = re.compile(
    r"\b(predicted_n|predicted_ms|prompt_n|cache_n|eval_count|prompt_eval_count|prompt_eval_cached_count|"
    r"eval_duration|load_duration|prompt_tokens_details|completion_tokens_details)\b"
    r"|\b(usage|timings)\.\w|\.(timings|ollama|usage)\b"
)


def test_no_bench_module_names_a_kinds_wire_fields() -> None:
    hits = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(BENCH_DIR.glob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if KIND_WIRE_FIELDS.search(line)
    ]
    assert not hits, (
        "bench/ reads a kind's wire fields (read them through the kind's readers):\n" + "\n".join(hits)
    )


@pytest.mark.skipif(not kernel_stamps.available(), reason="kernel receive stamps need Linux")
@pytest.mark.parametrize("kernel", [True, False])
async def test_a_kernel_stamp_of_a_read_that_ended_one_event_is_exact(serve, kernel: bool) -> None:
    """Under a stall covering the whole request, the loop's stamps are all late; the kernel's stamp of a read
    in which exactly one event ended (and of the last byte) is the event's arrival, with no error."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("one ", "two ", "three ", "four"):
            await resp.write(_sse({"model": "m", "choices": [{"index": 0, "delta": {"content": word}}]}))
            await asyncio.sleep(0.02)  # one event a write, apart: one a read unless the client ran late
        await resp.write(
            _sse({"model": "m", "choices": [], "usage": {"completion_tokens": 4}}) + b"data: [DONE]\n\n"
        )
        return resp

    base = await serve({"/v1/chat/completions": handler})
    monitor = StallMonitor()
    monitor.record(time.perf_counter() + 10.0, 20.0)  # the loop "stalled" from 10 s ago to 10 s from now
    request = Request(f"{base}/v1/chat/completions", {"stream": True}, {}, 10.0)
    async with HttpClient(kernel_stamps=kernel) as http:
        ex = await run_exchange(http, probe_class("openai"), request, stamps=StampLateness(monitor))
    assert ex.ok and ex.bounds is not None and ex.bounds.ttft_s is not None and len(ex.events) == 4
    assert ex.kernel_stamped is kernel and not ex.watched
    if not kernel:  # the loop's 10 s, capped by the time since the send: no byte arrived before it
        assert not ex.exact_stamps and ex.bounds.ttft_s == ex.ttft_s and ex.bounds.e2e_s == ex.e2e_s
        return
    assert ex.bounds.e2e_s == 0.0  # the last byte arrived in the newest segment of the last read
    first_exact = ex.events[0].t in ex.exact_stamps
    assert (ex.bounds.ttft_s == 0.0) is first_exact and (ex.bounds.ttft_s == ex.ttft_s) is not first_exact
    # What a merged or partial read holds arrived after the read before it: not the loop's 10 s.
    assert ex.stamp_lateness_s is not None and ex.stamp_lateness_s < 1.0


def _chunk(word: str) -> bytes:
    return _sse({"model": "m", "choices": [{"index": 0, "delta": {"content": word}}]})


def _kernel_stamped(
    reads: list[tuple[float, bytes]], *, head: float = 0.0, stalled: bool = True, sent_at: float = 1000.0
) -> Exchange:
    """An exchange whose answer came in `reads` (seconds after `sent_at`, payload) after its head (read
    `head` s after the send, apart), stamped by the kernel alone; `stalled`: under a loop stall covering all
    of it (the loop's bound: over 5 s for every stamp), else with a loop its heartbeat saw on time."""
    ex = Exchange(sent_at=sent_at, kernel_stamped=True)
    parser = probe_class("openai").parser()
    after: float | None = head
    for rel, data in reads:
        after = _read_kernel_stamped(ex, parser, b"\n\n", sent_at + rel, data, after)
    monitor = StallMonitor()
    if stalled:
        monitor.record(sent_at + 10.0, 20.0)  # the loop "stalled" from 10 s before the send to 10 s after it
    end = sent_at + reads[-1][0]
    fill_figures(ex, probe_class("openai"), end, StampLateness(monitor))
    return ex


def test_a_merged_reads_last_event_is_exact_and_the_others_arrived_after_the_read_before() -> None:
    """A read that took two events (the loop came late) is stamped with its newest segment's arrival: exact
    for the second, and the first arrived after the read before it, not any time in the loop's stall."""
    ex = _kernel_stamped(
        [
            (0.010, _chunk("one ")),
            (0.030, _chunk("two ") + _chunk("three ")),  # "two" arrived in (10, 30] ms
            (0.040, _chunk("four")),
            (
                0.050,
                _sse({"model": "m", "choices": [], "usage": {"completion_tokens": 4}}) + b"data: [DONE]\n\n",
            ),
        ]
    )
    assert [round(e.t, 3) for e in ex.events] == [0.010, 0.030, 0.030, 0.040]
    assert ex.bounds is not None and ex.bounds.ttft_s == 0.0 and ex.bounds.e2e_s == 0.0
    # Only "two" is late, by at most 20 ms: its gap from "one" lies in [0, 20] ms, to "three" in [0, 20] ms.
    assert ex.stamp_lateness_s == pytest.approx(0.020)
    assert ex.bounds.tpot_s == 0.0


def test_a_last_token_read_with_the_answers_end_is_bounded_by_the_read_before() -> None:
    """The last token read together with usage and [DONE]: not the read's last event, so not exact, but it
    arrived after the token before it was read."""
    ex = _kernel_stamped(
        [
            (0.010, _chunk("one ")),
            (0.011, _chunk("two ")),
            (
                0.0125,
                _chunk("three ") + _sse({"model": "m", "choices": [], "usage": {"completion_tokens": 3}}),
            ),
        ]
    )
    assert ex.stamp_lateness_s == pytest.approx(0.0015)
    assert ex.bounds is not None and ex.bounds.itl_s and max(ex.bounds.itl_s) <= 0.0015 + 1e-9


def test_a_read_the_socket_may_not_have_drained_gives_the_next_read_no_floor() -> None:
    """A long read may have left bytes in the socket: the next read's events may have arrived before it, so
    they are bounded by the time since the send (20 ms), not since the read before (10 ms); a short read
    after it took all there was, so the read after that is bounded from it again (30 ms, not 50)."""
    big = _chunk("x" * WHOLE_READ_BYTES)
    ex = _kernel_stamped(
        [
            (0.010, big[: len(big) - 2]),  # an event cut short: the next read ends it
            (0.020, big[len(big) - 2 :] + _chunk("two ") + _chunk("three ")),
            (0.050, _chunk("four ") + _chunk("five")),
        ]
    )
    assert len(ex.events) == 5 and ex.stamp_lateness_s == pytest.approx(0.030)
    assert ex.bounds is not None and ex.bounds.ttft_s == pytest.approx(0.020)


def test_no_stamp_is_later_than_the_time_since_the_send() -> None:
    """With the loop's stamps alone (no kernel), a stamp's bound is capped by its own time: nothing of the
    answer arrived before the request went out."""
    ex = Exchange(sent_at=1000.0)
    parser = probe_class("openai").parser()
    for rel, word in ((0.0004, "one "), (0.0014, "two ")):
        ex.collector.add(parser.feed(_chunk(word), 1000.0 + rel))
    monitor = StallMonitor()
    monitor.record(1010.0, 20.0)
    fill_figures(ex, probe_class("openai"), 1000.002, StampLateness(monitor))
    assert ex.bounds is not None and ex.bounds.ttft_s == pytest.approx(0.0004)
    assert ex.bounds.e2e_s == pytest.approx(0.002)


def test_a_merged_read_bounds_its_earlier_events_where_the_heartbeat_saw_no_stall() -> None:
    """Two tokens in one read mean the loop came late for the first, even when its heartbeat saw nothing
    (it misses lateness under one period plus its floor): the first is bounded by the time since the read
    before, here the response head's, not by the heartbeat's 0."""
    ex = _kernel_stamped(
        [(0.010, _chunk("one ") + _chunk("two ")), (0.011, _chunk("three "))], head=0.004, stalled=False
    )
    assert ex.bounds is not None and ex.bounds.ttft_s == pytest.approx(0.006)
    assert ex.stamp_lateness_s == pytest.approx(0.006)


def test_a_token_read_with_the_answers_end_keeps_the_heartbeats_bound() -> None:
    """The last token read together with usage: no later token in its read, so the loop's bound holds (0
    where its heartbeat saw the loop on time), as for any read not known to have come late."""
    ex = _kernel_stamped(
        [
            (0.010, _chunk("one ")),
            (0.011, _chunk("two ") + _sse({"model": "m", "choices": [], "usage": {"completion_tokens": 2}})),
        ],
        stalled=False,
    )
    assert ex.stamp_lateness_s == 0.0
