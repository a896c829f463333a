"""The load generator end to end against a real streaming server on 127.0.0.1."""

import asyncio
import itertools
import json
from pathlib import Path

import pytest
from rich.console import Console

from tokwatch.bench.config import build_options
from tokwatch.bench.outcome import BenchOutcome, ExitCode
from tokwatch.bench.run_bounds import run_figure_bounds
from tokwatch.bench.session import run_bench
from tokwatch.figures.result import Status
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.transport import kernel_stamps, precise_timer, rxwatch

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets"
TRACE = DATA / "trace.jsonl"


def _opts(url, **kw):
    base = {"url": url, "model": "m", "output_tokens": "8", "input_tokens": "16", "live_interval": 60,
            "server_metrics": False, "plots": False}  # fmt: skip
    base.update(kw)
    return build_options(base)


async def _bench(tmp_path, url, **kw):
    return await run_bench(_opts(url, **kw), console=Console(quiet=True), out_dir=tmp_path / "run")


async def test_closed_loop_respects_concurrency(tmp_path, stream_server):
    outcome, _ = await _bench(tmp_path, stream_server.url, concurrency=4, number=20)
    assert stream_server.max_in_flight == 4
    assert len(outcome.records) == 20 and all(r.ok for r in outcome.records)
    assert all(r.queue_time_s < 0.001 and r.scheduling_lag_s is None for r in outcome.records)
    # A host too busy for the client's own figures fails client timing (exit 6); else the run is clean.
    timing = ExitCode.CLIENT_TIMING if outcome.client_timing_failed else ExitCode.OK
    assert outcome.complete and outcome.exit_code() is timing


async def test_duration_is_a_soft_exit(tmp_path, stream_server):
    stream_server.gap = 0.01
    outcome, _ = await _bench(tmp_path, stream_server.url, concurrency=2, duration=0.3, output_tokens="20")
    start = 0.0 if outcome.records[0].sent_at_s < 0.1 else outcome.records[0].sent_at_s
    end = start + 0.3 + 0.05
    assert all(r.ok for r in outcome.records)  # in-flight requests were allowed to finish
    assert all(r.sent_at_s < end for r in outcome.records)
    assert max(r.completed_at_s for r in outcome.records) > 0.3
    assert outcome.complete


async def test_warmup_requests_are_excluded(tmp_path, stream_server):
    outcome, out_dir = await _bench(tmp_path, stream_server.url, concurrency=2, number=5, warmup=3)
    assert len(outcome.records) == 8
    assert sum(r.warmup for r in outcome.records) == 3
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["requests"]["total"] == 5 and summary["requests"]["warmup_excluded"] == 3
    assert summary["metrics"]["ttft"]["count"] == 5


async def test_open_loop_with_concurrency_cap_separates_queue_time(tmp_path, stream_server):
    stream_server.gap = 0.01
    outcome, _ = await _bench(
        tmp_path, stream_server.url, rate=100, arrivals="constant", number=12, max_concurrency=2
    )
    rs = sorted(outcome.records, key=lambda r: r.intended_at_s)
    assert [round(r.intended_at_s - rs[0].intended_at_s, 6) for r in rs[:3]] == [0.0, 0.01, 0.02]
    assert stream_server.max_in_flight <= 2
    assert max(r.queue_time_s for r in rs) > 0.05  # 12 requests of ~80 ms through 2 slots at 100/s
    for r in rs:
        # latency starts at the actual send: e2e is about 8 gaps, never the queue wait on top
        assert r.e2e_s < 0.08 + 0.25
        assert r.scheduling_lag_s is not None and r.scheduling_lag_s >= 0


async def test_multi_turn_history_grows_with_real_replies(tmp_path, stream_server):
    data = tmp_path / "conv.jsonl"
    turns = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "DATASET"},
             {"role": "user", "content": "two"}, {"role": "user", "content": "three"}]  # fmt: skip
    data.write_text(json.dumps(turns) + "\n")
    outcome, _ = await _bench(
        tmp_path, stream_server.url, dataset=str(data), multi_turn=True, parallel=1, number=1,
        output_tokens="3",
    )  # fmt: skip
    assert [r.turn for r in outcome.records] == [0, 1, 2]
    bodies = stream_server.bodies
    assert [len(b["messages"]) for b in bodies] == [1, 3, 5]
    assert bodies[1]["messages"][1] == {"role": "assistant", "content": "r1w0 r1w1 r1w2 "}
    assert bodies[2]["messages"][3]["content"] == "r2w0 r2w1 r2w2 "
    assert all("DATASET" not in json.dumps(b) for b in bodies)
    hist = [r.history_tokens for r in outcome.records]
    assert hist[0] == 0 and hist[0] < hist[1] < hist[2]


async def test_every_request_failing_stops_and_writes_incomplete(tmp_path, stream_server):
    stream_server.status = 500
    outcome, out_dir = await _bench(tmp_path, stream_server.url, concurrency=1, number=50)
    assert outcome.stop_reason == "all_failed" and not outcome.complete
    assert len(outcome.records) == 5  # fail_fast default
    assert outcome.exit_code() is ExitCode.FAILED
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["requests"]["by_status"]["provider_error"] == 5
    assert "no request succeeded" in summary["message"]


async def test_auth_failure_stops_at_once(tmp_path, stream_server):
    stream_server.status = 401
    outcome, out_dir = await _bench(tmp_path, stream_server.url, concurrency=1, number=50)
    assert outcome.stop_reason == "auth_failure"
    assert [r.status for r in outcome.records] == [Status.AUTH_FAILURE]
    assert json.loads((out_dir / "slo_results.json").read_text())["complete"] is False


async def test_a_stop_wakes_the_open_loop_waiting_for_its_next_send(tmp_path, stream_server):
    stream_server.status = 401
    outcome, _ = await _bench(tmp_path, stream_server.url, rate=0.1, arrivals="constant", number=3)
    assert outcome.stop_reason == "auth_failure" and len(outcome.records) == 1
    assert outcome.wall_s < 10.0  # the second send was planned 10 s in: the run did not wait for it


async def test_the_client_block_says_what_ran_beside_the_requests(tmp_path, stream_server):
    closed, _ = await _bench(tmp_path / "closed", stream_server.url, concurrency=2, number=4)
    opened, _ = await _bench(tmp_path / "open", stream_server.url, rate=50, number=4)
    url = stream_server.url
    watched, _ = await _bench(tmp_path / "watched", url, concurrency=2, number=4, receive_watcher="on")
    for outcome in (closed, opened, watched):
        assert outcome.client["stall_heartbeat_s"] == 0.002 and outcome.client["gc_freeze_every_s"] == 1.0
    kernel = kernel_stamps.available()
    assert opened.client["receive_stamps"] == ("kernel" if kernel else "event_loop")
    assert opened.client["receive_watcher_nice"] is None
    assert opened.client["watcher_heartbeat_s"] is None
    assert opened.client["send_timer"] == ("timerfd" if precise_timer.available() else "event_loop")
    assert closed.client["send_timer"] is None  # a closed loop waits for no planned instant
    # A closed loop runs the watcher thread only where the kernel does not stamp the reads.
    assert closed.client["receive_stamps"] == ("kernel" if kernel else "watcher_thread")
    if rxwatch.available():  # Linux
        assert watched.client["receive_stamps"] == ("kernel+watcher_thread" if kernel else "watcher_thread")
        assert watched.client["receive_watcher_nice"] in (-10, 0)  # raised where the OS allows it
        assert watched.client["watcher_heartbeat_s"] == 0.002


async def test_unreachable_url(tmp_path):
    outcome, out_dir = await _bench(tmp_path, "http://127.0.0.1:9/v1", rate=10, number=5)
    assert outcome.stop_reason == "unreachable" and outcome.exit_code() is ExitCode.FAILED
    assert (out_dir / "report.md").is_file()


async def test_cancelling_the_run_still_writes_incomplete_results(tmp_path, stream_server):
    stream_server.gap = 0.01
    task = asyncio.create_task(_bench(tmp_path, stream_server.url, concurrency=2, number=10_000))
    for _ in range(200):
        await asyncio.sleep(0.02)
        if (stream_server.bodies and len(stream_server.bodies) > 6) or task.done():
            break
    task.cancel()
    outcome, out_dir = await asyncio.wait_for(task, timeout=10)
    assert not outcome.complete and outcome.stop_reason == "interrupted"
    assert outcome.exit_code() is ExitCode.INCOMPLETE
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["requests"]["ok"] >= 4
    lines = (out_dir / "request_level_metrics.jsonl").read_text().splitlines()
    assert len(lines) == summary["requests"]["total"]


@pytest.mark.parametrize("seed", [1, 2])
async def test_seeded_runs_send_the_same_lengths_and_fresh_words(tmp_path, stream_server, seed):
    def sent() -> list[str]:
        texts = [b["messages"][0]["content"] for b in stream_server.bodies]
        stream_server.bodies.clear()
        return texts

    kw = {"concurrency": 1, "number": 4, "seed": seed, "input_tokens": "5:50"}
    await _bench(tmp_path / "a", stream_server.url, **kw)
    a = sent()
    await _bench(tmp_path / "b", stream_server.url, **kw)
    b = sent()
    assert [len(t.split()) for t in a] == [len(t.split()) for t in b]  # the seed's lengths ...
    assert all(x != y for x, y in zip(a, b, strict=True))  # ... with each run's own words
    await _bench(tmp_path / "c", stream_server.url, repeat_prompts=True, **kw)
    c = sent()
    await _bench(tmp_path / "d", stream_server.url, repeat_prompts=True, **kw)
    assert sent() == c and [len(t.split()) for t in c] == [len(t.split()) for t in a]


async def test_worker_processes_share_one_timeline(tmp_path, stream_server):
    outcome, _ = await _bench(
        tmp_path, stream_server.url, rate=50, arrivals="constant", number=10, workers=2, warmup=2
    )
    measured = [r for r in outcome.records if not r.warmup]
    assert len(measured) == 10 and all(r.ok for r in measured) and outcome.complete
    assert sum(r.warmup for r in outcome.records) == 2
    assert len({r.request_id for r in outcome.records}) == 12
    intended = sorted(r.intended_at_s for r in measured)
    # worker k is phase-shifted by k/rate: the merged schedule is exactly every 20 ms
    assert [round(b - a, 6) for a, b in itertools.pairwise(intended)] == [0.02] * 9
    assert outcome.client["cpu_s"] > 0
    assert outcome.client["send_timer"] == ("timerfd" if precise_timer.available() else "event_loop")


async def test_endpoint_from_config_file(tmp_path, stream_server, monkeypatch):
    monkeypatch.setenv("BENCH_KEY", "cfg-secret-key")
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(
        "endpoints:\n  - name: local\n    kind: openai\n"
        f"    base_url: {stream_server.url}\n    model: served\n    api_key_env: BENCH_KEY\n"
    )
    outcome, out_dir = await run_bench(
        build_options(
            {"endpoint": "local", "config": str(cfg), "number": 2, "plots": False, "live_interval": 60}
        ),
        console=Console(quiet=True),
        out_dir=tmp_path / "run",
    )
    assert all(r.ok for r in outcome.records)
    assert stream_server.bodies[0]["model"] == "served"
    assert "cfg-secret-key" not in (out_dir / "summary.json").read_text()
    with pytest.raises(ConfigError, match="no endpoint named 'other'"):
        await run_bench(build_options({"endpoint": "other", "config": str(cfg)}), console=Console(quiet=True))


async def test_fixed_length_is_claimed_only_where_it_is_asked_for(tmp_path, stream_server):
    plain, _ = await _bench(tmp_path / "openai", stream_server.url, kind="openai", concurrency=1, number=2)
    assert not any(r.fixed_output for r in plain.records)  # kind openai: no ignore_eos sent
    assert all("ignore_eos" not in body for body in stream_server.bodies)
    vllm, _ = await _bench(tmp_path / "vllm", stream_server.url, kind="vllm", concurrency=1, number=2)
    assert all(r.fixed_output for r in vllm.records)
    assert stream_server.bodies[-1]["ignore_eos"] is True


def _conversations_file(tmp_path, n, turns):
    data = tmp_path / "convs.jsonl"
    lines = [json.dumps([{"role": "user", "content": f"c{c} t{t}"} for t in range(turns)]) for c in range(n)]
    data.write_text("\n".join(lines) + "\n")
    return data


async def test_duration_lets_conversations_in_flight_run_all_their_turns(tmp_path, stream_server):
    stream_server.gap = 0.01  # 5 tokens: about 50 ms a turn, 200 ms a conversation of 4 turns
    data = _conversations_file(tmp_path, 6, 4)
    outcome, _ = await _bench(tmp_path, stream_server.url, dataset=str(data), multi_turn=True, parallel=2,
                              duration=0.12, output_tokens="5")  # fmt: skip
    by_conv = {}
    for r in outcome.records:
        by_conv.setdefault(r.conversation_id, []).append(r)
    start = min(r.sent_at_s for r in outcome.records)
    assert len(by_conv) >= 2
    for turns in by_conv.values():
        assert [r.turn for r in turns] == [0, 1, 2, 3] and all(r.ok for r in turns)  # none abandoned
        assert turns[0].sent_at_s < start + 0.12 + 0.05  # no conversation starts after the deadline
    # ... but turns of conversations in flight were sent after it (seed 003's soft exit)
    assert max(r.sent_at_s for r in outcome.records) > start + 0.12
    assert outcome.complete


async def test_trace_replay_waits_between_turns_outside_latency(tmp_path, stream_server):
    stream_server.gap = 0.002
    outcome, out_dir = await _bench(tmp_path, stream_server.url, kind="vllm", dataset=str(TRACE),
                                    multi_turn=True, parallel=2, number=2, repeat_prompts=True)  # fmt: skip
    assert all(r.ok for r in outcome.records) and len(outcome.records) == 5
    waits = {0: [0.3, 0.2], 1: [0.1]}  # tests/data/datasets/trace.jsonl
    for cid, expected in waits.items():
        turns = sorted((r for r in outcome.records if r.conversation_id == cid), key=lambda r: r.turn)
        for (prev, nxt), wait in zip(itertools.pairwise(turns), expected, strict=True):
            assert nxt.wait_before_s == wait
            assert nxt.sent_at_s - prev.completed_at_s >= wait  # the pause happened ...
            assert nxt.e2e_s < wait  # ... and is not in the next turn's latency
    first = sorted((r for r in outcome.records if r.conversation_id == 0), key=lambda r: r.turn)
    assert [r.max_tokens for r in first] == [8, 6, 5] and [r.output_tokens for r in first] == [8, 6, 5]
    assert all(r.fixed_output for r in first)
    assert all(b["ignore_eos"] is True and b["min_tokens"] == b["max_tokens"] for b in stream_server.bodies)
    assert [r.prompt_tokens_target - r.history_tokens for r in first] == [60, 20, 15]
    traces = json.loads((out_dir / "trace_summary.json").read_text())
    assert [t["wait_s"] for t in traces["traces"]] == [pytest.approx(0.5), pytest.approx(0.1)]


async def test_tokenizer_gives_exact_prompt_lengths(tmp_path, stream_server, tokenizer_json):
    from tokwatch.figures.tokens import HFTokenizer

    tok = HFTokenizer(tokenizer_json)
    outcome, _ = await _bench(tmp_path / "a", stream_server.url, concurrency=2, number=6, input_tokens="37",
                              tokenizer=tokenizer_json)  # fmt: skip
    assert [tok.count(b["messages"][0]["content"]) for b in stream_server.bodies] == [37] * 6
    assert all(r.prompt_tokens_target == 37 for r in outcome.records)
    stream_server.bodies.clear()
    await _bench(tmp_path / "b", stream_server.url, dataset=str(TRACE), multi_turn=True, parallel=1, number=1,
                 tokenizer=tokenizer_json, repeat_prompts=True)  # fmt: skip
    users = [b["messages"][-1]["content"] for b in stream_server.bodies]
    assert [tok.count(u) for u in users] == [60, 20, 15]


async def test_extra_body_from_flag_and_endpoint_reaches_the_server(tmp_path, stream_server):
    await _bench(
        tmp_path / "a", stream_server.url, number=1, extra_body='{"top_k": 20, "stream_options": {"x": 1}}'
    )
    body = stream_server.bodies[-1]
    assert body["top_k"] == 20
    assert body["stream_options"] == {"include_usage": True, "x": 1}  # nested objects merge key by key
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(
        "endpoints:\n  - name: local\n    kind: openai\n"
        f"    base_url: {stream_server.url}\n    model: served\n"
        "    extra_body: {top_k: 5, temperature: 0.7, chat_template_kwargs: {enable_thinking: false}}\n"
    )
    opts = build_options({"endpoint": "local", "config": str(cfg), "number": 1, "plots": False,
                          "live_interval": 60, "extra_body": {"top_k": 40}})  # fmt: skip
    await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "b")
    body = stream_server.bodies[-1]
    assert body["top_k"] == 40  # the flag wins over the endpoint
    assert body["temperature"] == 0.7 and body["chat_template_kwargs"] == {"enable_thinking": False}


async def test_dataset_offset_skips_the_first_entries(tmp_path, stream_server):
    await _bench(tmp_path, stream_server.url, dataset=str(DATA / "prompts.jsonl"), dataset_offset=1, number=2,
                 repeat_prompts=True)  # fmt: skip
    assert [b["messages"][-1]["content"] for b in stream_server.bodies] == [
        "Hi",
        "What is the capital of France?",
    ]


async def test_random_multi_turn_conversations(tmp_path, stream_server):
    outcome, out_dir = await _bench(tmp_path, stream_server.url, dataset="random-multi-turn",
                                    multi_turn=True, min_turns=2, max_turns=3, parallel=2, number=6,
                                    input_tokens="12")  # fmt: skip
    by_conv = {}
    for r in outcome.records:
        by_conv.setdefault(r.conversation_id, []).append(r)
    assert len(by_conv) == 6 and {len(v) for v in by_conv.values()} <= {2, 3}
    assert all(r.turns == r.turn + 1 and r.conversation_turns == len(by_conv[r.conversation_id])
               for r in outcome.records)  # fmt: skip
    assert all(len(b["messages"][-1]["content"].split()) == 12 for b in stream_server.bodies)
    assert json.loads((out_dir / "trace_summary.json").read_text())["conversations"]["completed"] == 6


@pytest.mark.slow
async def test_connection_errors_after_a_success_back_off_doubling(tmp_path, serve):
    from aiohttp import web

    from tokwatch.bench.runner import BACKOFF_MAX_S, BACKOFF_MIN_S

    first_done = asyncio.Event()
    answered = 0

    async def dies_after_one_answer(request):
        nonlocal answered
        body = await request.json()
        if answered == 0:  # the one success: a proper stream
            answered = 1
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(body["max_tokens"]):
                await asyncio.sleep(0.002)
                event = {"choices": [{"delta": {"content": f"w{i} "}}]}
                await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            first_done.set()
            return resp
        if not first_done.is_set():  # sent together with the first: fail only once it was judged ok
            await first_done.wait()
            await asyncio.sleep(0.1)
        assert request.transport is not None
        request.transport.abort()  # closed at once, before any response byte: unreachable
        await asyncio.sleep(1)
        return web.Response()

    url = await serve({"/v1/chat/completions": dies_after_one_answer})
    outcome, _ = await _bench(tmp_path, url + "/v1", concurrency=2, number=10, output_tokens="4",
                              max_consecutive_failures=1000)  # fmt: skip
    ok = [r for r in outcome.records if r.ok]
    failed = sorted((r for r in outcome.records if not r.ok), key=lambda r: r.completed_at_s)
    assert len(ok) == 1 and len(failed) == 9 and outcome.complete  # the budget ended it, not a stop
    assert {(r.status, r.error_class) for r in failed} == {(Status.UNREACHABLE, "reset")}
    assert ok[0].completed_at_s < failed[0].completed_at_s
    # The k-th failure in a row pauses every worker's next send by 50 ms doubling per failure, up to 2 s:
    # the worker that got it sends next exactly that long after it (the other one may still be waiting).
    pauses = [min(BACKOFF_MIN_S * 2**k, BACKOFF_MAX_S) for k in range(len(failed))]
    planned = sorted((f.completed_at_s + p, p) for f, p in zip(failed, pauses, strict=True))
    sends = sorted(r.dispatched_at_s for r in outcome.records if r.dispatched_at_s > failed[0].completed_at_s)
    assert len(sends) == 7  # 10 sent: 2 at the start, 1 right after the success, then one per pause
    for send, (at, pause) in zip(sends, planned, strict=False):
        assert at - 0.005 <= send <= at + 0.1 + pause / 2, (sends, planned)
    assert [p for _, p in planned[: len(sends)]] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]


async def _blocked_run(tmp_path, stream_server, **kw):
    """A run during which the client's loop is blocked for 40 ms while requests stream (as a full garbage
    collection or a CPU-starved process would block it): 50 ms after the server had the first request, so
    a slow start on a busy host (the run's own start-up collection) cannot put the block before any stream."""
    import time

    stream_server.gap = 0.01
    loop = asyncio.get_running_loop()
    stream_server.on_first_request = lambda: loop.call_later(0.05, time.sleep, 0.04)
    outcome, out_dir = await _bench(tmp_path, stream_server.url, number=8, **kw)
    assert all(r.max_stall_s is not None and r.stamp_lateness_s is not None for r in outcome.measured)
    stalled = [r for r in outcome.measured if (r.max_stall_s or 0.0) >= 0.03]
    assert len(stalled) >= 1  # at least the requests in flight then (a busy machine may stall others too)
    rows = [json.loads(line) for line in (out_dir / "request_level_metrics.jsonl").read_text().splitlines()]
    assert sum(1 for r in rows if (r["max_stall_s"] or 0.0) >= 0.03) == len(stalled)
    return outcome, stalled, (out_dir / "health_checks.txt").read_text()


def _client_timing_verdict(outcome: BenchOutcome, health: str) -> str:
    """The `client timing` verdict the records call for, checked against health_checks.txt and the exit code:
    FAIL when a published figure's bound exceeds its tolerance, WARN when only requests' own figures do."""
    late = sum(1 for r in outcome.measured if r.beyond_tolerance)
    wrong = [b for b in run_figure_bounds(outcome.measured) if b.beyond]
    verdict = "FAIL" if wrong else "WARN" if late else "PASS"
    assert f"[{verdict}] client timing: " in health
    assert f"; {late}/{len(outcome.measured)} requests have a figure of their own" in health
    assert (outcome.exit_code() is ExitCode.CLIENT_TIMING) is (verdict == "FAIL")
    # summary.json states every published figure's bound, and which are beyond tolerance.
    stated = outcome.summary()["client_timing"]
    assert stated["beyond_tolerance"] == [b.name for b in wrong]
    assert set(stated["bounds_s"]) >= {"ttft", "tbt", "tpot", "e2e"}
    assert all(v >= 0.0 for stats in stated["bounds_s"].values() for v in stats.values())
    return verdict


async def test_a_clean_run_passes_client_timing(tmp_path, stream_server):
    # Nothing blocks the client's loop: each request's figures are judged by the probe's error bounds and
    # stay within tolerance, so the run passes and exits 0. A host busy enough to starve the client does move
    # figures beyond tolerance (a FAIL is then right, and consistent with the records): up to three runs for
    # one that passes.
    stream_server.gap = 0.01
    for attempt in range(3):
        outcome, out_dir = await _bench(tmp_path / str(attempt), stream_server.url, concurrency=2, number=8)
        health = (out_dir / "health_checks.txt").read_text()
        assert len(outcome.timed_requests) == 8
        verdict = _client_timing_verdict(outcome, health)
        if verdict == "PASS":
            assert outcome.exit_code() is ExitCode.OK
            return
    pytest.fail(f"no clean run in three: {health}")


async def test_a_blocked_loop_fails_client_timing_where_the_loop_took_the_stamps(tmp_path, stream_server):
    # Open loop: the loop stamps every read, so the stamps right after the block carry it.
    outcome, stalled, health = await _blocked_run(tmp_path, stream_server, rate=40.0, kernel_stamps="off")
    assert outcome.client["receive_stamps"] == "event_loop"
    assert any((r.stamp_lateness_s or 0.0) >= 0.03 for r in stalled)
    assert any(r.beyond_tolerance for r in stalled)  # the block moved their figures beyond tolerance
    assert "[FAIL] client timing:" in health and "taken by the event loop" in health
    assert outcome.exit_code() is ExitCode.CLIENT_TIMING  # the figures are wrong: the exit code says so


@pytest.mark.skipif(not kernel_stamps.available(), reason="kernel receive stamps need Linux")
async def test_a_blocked_loop_is_charged_at_the_kernels_stamps(tmp_path, stream_server):
    # Closed loop, the default on Linux: reads carry the kernel's receive time and no watcher runs. The
    # loop's stall bounds each stamp at the kernel's time, not at the late read: a token that arrived early
    # in the block is charged for that part of it only (the newest segment of a merged read is exact, the
    # older ones are late by less than the block), and a stamp outside the stall for nothing.
    outcome, _, health = await _blocked_run(tmp_path, stream_server, concurrency=2)
    assert outcome.client["receive_stamps"] == "kernel"
    _client_timing_verdict(outcome, health)
    assert "taken by the kernel (its receive time on each of the loop's reads" in health
    assert all((r.stamp_lateness_s or 0.0) <= (r.max_stall_s or 0.0) + 0.01 for r in outcome.measured)


@pytest.mark.skipif(not rxwatch.available(), reason="the receive watcher needs Linux epoll")
async def test_a_blocked_loop_does_not_fail_client_timing_under_the_receive_watcher(tmp_path, stream_server):
    # Closed loop: the receive watcher thread stamps the reads, and a loop stall delays the reading, not the
    # stamp; what counts is the watcher's own lateness (its thread's heartbeat), not the 40 ms block. A host
    # so busy that the watcher's thread was itself starved through the block is charged for it, rightly: up
    # to three runs for one where it was not.
    for attempt in range(3):
        outcome, stalled, health = await _blocked_run(
            tmp_path / str(attempt), stream_server, concurrency=2, receive_watcher="on"
        )
        assert outcome.client["receive_stamps"].endswith("watcher_thread")
        _client_timing_verdict(outcome, health)  # quiet host: PASS
        assert "taken by the receive watcher thread" in health and "not the watcher's stamps" in health
        if any((r.stamp_lateness_s or 0.0) < 0.03 <= (r.max_stall_s or 0.0) for r in stalled):
            return
    pytest.fail(f"every run charged the loop's block to the watcher's stamps: {stalled}")
