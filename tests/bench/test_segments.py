"""Segments of one schedule: k of n takes every n-th request; n segments send exactly the one-process run."""

import asyncio
import itertools
import re
import time

import pytest
from rich.console import Console

from tokwatch.bench.arrivals import arrival_offsets
from tokwatch.bench.config import build_options
from tokwatch.bench.prompt_salt import PromptSalt, SaltedPrompts
from tokwatch.bench.segments import JOB_INDEX_ENV, Segment, SegmentError, parse_segment, spec_at
from tokwatch.bench.session import run_bench
from tokwatch.bench.workload import LengthRange, SyntheticWorkload
from tokwatch.figures.tokens import CharEstimate
from tokwatch.settings.strict_yaml import ConfigError


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [("0/1", {}, Segment(0, 1)), ("3/4", {}, Segment(3, 4)), ("auto/4", {JOB_INDEX_ENV: "2"}, Segment(2, 4))],
)
def test_parse(text, env, expected):
    assert parse_segment(text, env) == expected


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("4", {}, "expected K/N"),
        ("4/4", {}, "K must be in 0..3"),
        ("-1/4", {}, "K must be in 0..3"),
        ("a/2", {}, "K must be an integer"),
        ("1/0", {}, "N must be at least 1"),
        ("auto/2", {}, f"{JOB_INDEX_ENV} (set in the pods of a Kubernetes Indexed Job), which is not set"),
        ("auto/2", {JOB_INDEX_ENV: "2"}, f"({JOB_INDEX_ENV}=2): K must be in 0..1"),
    ],
)
def test_bad_segments_are_named(text, env, message):
    with pytest.raises(SegmentError, match=re.escape(message)):
        parse_segment(text, env)


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_segments_partition_the_schedule_exactly(n):
    offsets = list(itertools.islice(arrival_offsets("poisson", 100.0, 5), 101))
    taken = [pair for k in range(n) for pair in Segment(k, n).take(offsets)]
    assert sorted(taken) == list(enumerate(offsets))  # every arrival once, at its own instant
    counts = [sum(1 for _ in Segment(k, n).take(offsets)) for k in range(n)]
    assert [Segment(k, n).share(101) for k in range(n)] == counts


def test_a_segment_split_again_is_a_segment_of_the_whole():
    outer = Segment(1, 3)
    inner = [outer.split(j, 2) for j in range(2)]
    assert inner == [Segment(1, 6), Segment(4, 6)]
    mine = {i for i, _ in outer.take(range(60))}
    assert {i for s in inner for i, _ in s.take(range(60))} == mine
    assert sum(s.share(61) for s in inner) == outer.share(61)


def test_a_request_is_built_from_the_seed_the_salt_and_its_index_alone():
    def workload(salt="run1"):
        lengths = (LengthRange(5, 50), LengthRange(4, 9))
        return SyntheticWorkload(*lengths, seed=3, reasoning_ratio=0.3, salt=salt)

    ahead = [spec_at(workload(), i) for i in range(10)]
    odd_only = workload()
    assert [spec_at(odd_only, i) for i in range(1, 10, 2)] == ahead[1::2]
    assert len({s.messages[0]["content"] for s in ahead}) == 10
    # Another run (salt): the same lengths and mix, other words.
    other = [spec_at(workload("run2"), i) for i in range(10)]
    assert [(s.category, s.max_tokens, s.prompt_tokens_target) for s in other] == [
        (s.category, s.max_tokens, s.prompt_tokens_target) for s in ahead
    ]
    assert all(a.messages != b.messages for a, b in zip(ahead, other, strict=True))
    dataset = ahead[:3]
    assert [spec_at(dataset, i) for i in (0, 4, 5)] == [dataset[0], dataset[1], dataset[2]]
    # A dataset's sends: entry i mod n with the nonce of send i, whichever process builds it.
    salted = SaltedPrompts(dataset, PromptSalt("run1", 3, CharEstimate()))
    sends = [spec_at(salted, i) for i in range(6)]
    assert [spec_at(SaltedPrompts(dataset, PromptSalt("run1", 3, CharEstimate())), 4)] == [sends[4]]
    assert sends[4].messages[0]["content"].endswith(dataset[1].messages[0]["content"])
    assert len({s.messages[0]["content"] for s in sends}) == 6


def _opts(url, **kw):
    base = {"url": url, "model": "m", "output_tokens": "3:8", "input_tokens": "5:50", "live_interval": 60,
            "server_metrics": False, "plots": False, "seed": 11}  # fmt: skip
    base.update(kw)
    return build_options(base)


def _bodies(server):
    return sorted((b["messages"][0]["content"], b["max_tokens"]) for b in server.bodies)


async def _whole(tmp_path, server, run_id, **kw):
    """The run in one process, under the split run's id: the same id, the same prompt salt."""
    server.bodies.clear()
    opts = _opts(server.url, run_id=run_id, **kw)
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "one")
    return outcome, _bodies(server)


def _plan(*outcomes):
    """(id, warm-up, planned instant after the first) of every request of these runs sharing one perf_counter
    clock: what the schedule decided, not how it went (the segments' starts agree to a microsecond or so)."""
    planned = [
        (r.request_id, r.warmup, None if r.warmup else o.perf_t0 + (r.intended_at_s or 0.0))
        for o in outcomes
        for r in o.records
    ]
    first = min(t for _, w, t in planned if t is not None)
    return sorted((i, w, None if t is None else t - first) for i, w, t in planned)


def _same_plan(a, b):
    assert [(i, w) for i, w, _ in a] == [(i, w) for i, w, _ in b]
    assert [t for *_, t in a] == [None if t is None else pytest.approx(t, abs=1e-5) for *_, t in b]


async def test_segments_send_exactly_the_one_process_run(tmp_path, stream_server):
    load = {"rate": 200, "number": 21, "warmup": 3}
    one, one_bodies = await _whole(tmp_path, stream_server, "r1", **load)
    stream_server.bodies.clear()
    start = time.time() + 1.0
    parts = await asyncio.gather(
        *(
            run_bench(
                _opts(stream_server.url, segment=f"{k}/3", run_id="r1", start_at=start, **load),
                console=Console(quiet=True),
                out_dir=tmp_path / f"seg{k}",
            )
            for k in range(3)
        )
    )
    outcomes = [o for o, _ in parts]
    assert all(o.complete for o in outcomes) and {o.run_id for o in outcomes} == {"r1"}
    assert [len(o.measured) for o in outcomes] == [7, 7, 7]
    _same_plan(_plan(*outcomes), _plan(one))
    assert _bodies(stream_server) == one_bodies  # the same prompts and lengths, each sent once


async def test_worker_processes_send_exactly_the_one_process_run(tmp_path, stream_server):
    load = {"rate": 100, "arrivals": "poisson", "number": 15, "warmup": 3}
    one, one_bodies = await _whole(tmp_path, stream_server, "w1", **load)
    stream_server.bodies.clear()
    two, _ = await run_bench(
        _opts(stream_server.url, workers=2, run_id="w1", **load),
        console=Console(quiet=True),
        out_dir=tmp_path / "two",
    )
    assert two.complete and len(two.measured) == 15
    _same_plan(_plan(two), _plan(one))
    assert _bodies(stream_server) == one_bodies
    assert two.client["cpu_s"] > 0


async def test_closed_loop_segments_split_concurrency_and_number(tmp_path, stream_server):
    load = {"concurrency": 4, "number": 10, "warmup": 2}
    one, one_bodies = await _whole(tmp_path, stream_server, "c1", **load)
    stream_server.bodies.clear()
    stream_server.max_in_flight = 0
    parts = await asyncio.gather(
        *(
            run_bench(
                _opts(stream_server.url, segment=f"{k}/2", run_id="c1", start_at=time.time() + 1.0, **load),
                console=Console(quiet=True),
                out_dir=tmp_path / f"c{k}",
            )
            for k in range(2)
        )
    )
    ids = sorted(r.request_id for o, _ in parts for r in o.records)
    assert ids == sorted(r.request_id for r in one.records) == list(range(12))
    assert _bodies(stream_server) == one_bodies
    assert stream_server.max_in_flight <= 4


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_segment_ready_after_the_common_start_stops_without_sending(tmp_path, stream_server, workers):
    split = {"segment": "0/2", "run_id": "late", "start_at": time.time() - 5, "workers": workers}
    opts = _opts(stream_server.url, rate=50, number=4, **split)
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "late")
    assert outcome.stop_reason == "late_start" and not outcome.complete
    assert "after the common start" in (outcome.message or "") and outcome.measured == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"segment": "1/2"}, "segment needs run_id"),
        ({"segment": "1/2", "run_id": "x", "concurrency": 1}, "concurrency 1 cannot be split over 2"),
        ({"segment": "2/2", "run_id": "x"}, "K must be in 0..1"),
        ({"start_at": "yesterday"}, "expected unix seconds or an RFC 3339 time"),
        ({"start_at": "2025-05-01T12:00:00"}, "give the zone"),
        ({"run_id": "a b"}, "run_id"),
    ],
)
def test_bad_segment_options_are_usage_errors(extra, message):
    with pytest.raises(ConfigError, match=message):
        _opts("http://127.0.0.1:9/v1", **extra)


def test_start_at_takes_rfc3339_and_unix_seconds():
    assert _opts("http://127.0.0.1:9/v1", start_at="2025-05-01T12:00:00Z").start_at == 1746100800.0
    assert _opts("http://127.0.0.1:9/v1", start_at="2025-05-01T14:00:00+02:00").start_at == 1746100800.0
    assert _opts("http://127.0.0.1:9/v1", start_at="1746100800.5").start_at == 1746100800.5
