"""Capacity sweeps and searches: parsing, the bracket-and-bisect search, and a search against the simulator
whose saturation point is known from its `max_running` and decode rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.processes import tokwatch_cli
from tests.support.sim import StartSim
from tokwatch.bench.capacity import Capacity, parse_sweep, run_capacity, table_lines, write_capacity
from tokwatch.bench.config import BenchOptions, build_options
from tokwatch.bench.outcome import BenchOutcome, ExitCode
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures.result import Status
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.sim.testing import RunningSim

# max_running 2, 8 tokens at 200 tok/s (5 ms per token, prefill negligible): 40 ms per request, so the
# server saturates at 2 / 0.04 = 50 requests/s; past it the queue (and TTFT) grows without bound. With 8
# tokens a late first token alone brings a request's fluidity-index to 7/8 < 0.9, so the fluid rate is the
# highest rate whose TTFT p99 stays within the prefill deadline: below saturation, and not far below it.
SATURATION = 50.0
SIM = """
servers:
  - name: oa
    dialect: openai
    max_running: 2
    models: [{name: m, decode_tps: 200, prefill_tps: 1000000}]
"""


def test_parse_sweep() -> None:
    assert parse_sweep("rate=4,1,2,2") == ("rate", [1.0, 2.0, 4.0])
    assert parse_sweep("concurrency=1,8") == ("concurrency", [1.0, 8.0])
    for bad, words in (
        ("rps=1,2", "expected rate="),
        ("rate=1,x", "'x' is not a number"),
        ("concurrency=1.5", "not a positive whole number"),
        ("rate=0,1", "not a positive finite rate"),
        ("rate=inf", "not a positive finite rate"),
    ):
        with pytest.raises(ConfigError, match=words):
            parse_sweep(bad)


def _opts(**kw: object) -> BenchOptions:
    return build_options({"url": "http://127.0.0.1:9/v1", "model": "m", **kw})


def _fake_outcome(fluid: bool, n: int = 20) -> BenchOutcome:
    records = []
    for i in range(n):
        r = RequestRecord(request_id=i, category="chat", status=Status.OK)
        r.fluidity_index = 1.0 if fluid or i % 2 else 0.5
        r.sent_at_s = i * 0.1
        records.append(r)
    return BenchOutcome(options={}, records=records, started_at_unix=0.0, wall_s=2.0, complete=True,
                        stop_reason="finished")  # fmt: skip


async def test_search_brackets_then_bisects_to_the_tolerance(tmp_path: Path) -> None:
    knee = 37.0  # a server that is fluid below this rate, and not above
    tried: list[float] = []

    async def point(o: BenchOptions, sub: Path) -> tuple[BenchOutcome, Path]:
        assert o.rate is not None and o.output_dir == str(sub) and o.search is None
        tried.append(o.rate)
        return _fake_outcome(o.rate <= knee), sub

    opts = _opts(search="fluid", search_start=5, search_tolerance=0.05, duration=1)
    cap = await run_capacity(opts, tmp_path, point)
    assert tried[:4] == [5, 10, 20, 40]  # doubling until the first failure
    lo, hi = cap.bracket
    assert lo is not None and hi is not None and lo <= knee < hi and hi - lo <= 0.05 * lo
    assert cap.result_rate == lo and cap.stopped_by == "done"
    data = json.loads((write_capacity(cap, tmp_path, plots_enabled=False)[0]).read_text())
    assert data["fluid_token_generation_rate"] == lo and data["tolerance"] == 0.05
    assert [p["value"] for p in data["points"]] == tried
    assert all(p["passed"] == (p["value"] <= knee) for p in data["points"])


async def test_a_failing_start_is_halved_and_a_search_without_failure_is_a_lower_bound(tmp_path: Path):
    async def never(o: BenchOptions, sub: Path) -> tuple[BenchOutcome, Path]:
        return _fake_outcome(False), sub

    cap = await run_capacity(_opts(search="fluid", duration=1, search_start=8), tmp_path, never)
    assert [p.value for p in cap.points] == [8, 4, 2, 1, 0.5, 0.25, 0.125]  # down to start / 64
    assert cap.result_rate is None and cap.stopped_by == "no_passing_rate"
    assert "not found" in table_lines(cap)[-1]

    knee = 3.0

    async def below_knee(o: BenchOptions, sub: Path) -> tuple[BenchOutcome, Path]:
        assert o.rate is not None
        return _fake_outcome(o.rate <= knee), sub

    cap = await run_capacity(_opts(search="fluid", duration=1, search_start=16), tmp_path, below_knee)
    assert [p.value for p in cap.points][:4] == [16, 8, 4, 2]  # halved until a pass, then bisected
    lo, hi = cap.bracket
    assert lo is not None and hi is not None and lo <= knee < hi and not cap.lower_bound

    async def always(o: BenchOptions, sub: Path) -> tuple[BenchOutcome, Path]:
        return _fake_outcome(True), sub

    opts = _opts(search="fluid", duration=1, search_start=1, search_max_points=3)
    cap = await run_capacity(opts, tmp_path, always)
    assert len(cap.points) == 3 and cap.stopped_by == "max_points" and cap.result_rate == 4.0
    assert cap.lower_bound and cap.bracket == (4.0, None)
    assert "fluid token generation rate: >= 4 req/s (lower bound: no point failed)" in table_lines(cap)[-1]
    write_capacity(cap, tmp_path, plots_enabled=False)
    data = json.loads((tmp_path / "capacity.json").read_text())
    assert data["result_is_lower_bound"] is True and data["fluid_token_generation_rate"] == 4.0
    report = (tmp_path / "report.md").read_text()
    assert "**>= 4 req/s (lower bound: no point failed)**" in report and "at least this rate" in report


async def test_the_start_rate_comes_from_a_single_stream_measurement(tmp_path: Path) -> None:
    seen: list[BenchOptions] = []

    async def point(o: BenchOptions, sub: Path) -> tuple[BenchOutcome, Path]:
        seen.append(o)
        outcome = _fake_outcome(o.rate is None or o.rate <= 10)
        for i, r in enumerate(outcome.records):
            r.e2e_s = (0.2, 0.25, 0.3)[i % 3]  # median 0.25 s: one stream sustains 4 req/s
        return outcome, sub

    cap = await run_capacity(_opts(search="fluid", search_tolerance=0.5), tmp_path, point)
    calib = seen[0]
    assert (calib.concurrency, calib.rate, calib.number, calib.duration) == (1, None, 4, None)
    assert calib.warmup == 1 and Path(calib.output_dir or "").name == "calibration"
    assert cap.calibration is not None and cap.calibration.e2e_p50_s == 0.25
    assert cap.calibration.start_rate == 4.0 and cap.points[0].value == 4.0
    # Each point lasts a bounded time: max(10 s, 10 x 0.25 s) of arrivals, then at most as long to drain.
    assert all(o.duration == 10.0 and o.drain_timeout == 10.0 for o in seen[1:])
    assert all(p.duration_s == 10.0 and p.drain_timeout_s == 10.0 for p in cap.points)
    assert "start 4 req/s = 1 / single-stream E2E 250 ms" in table_lines(cap)[-1]


def test_bad_capacity_options_are_usage_errors() -> None:
    for values, words in (
        ({"sweep": "rate=1", "search": "fluid"}, "either sweep or search"),
        ({"sweep": "rate=1,2", "concurrency": 4}, "leave out concurrency"),
        ({"search": "slo"}, "needs at least one slo"),
        ({"search": "fluid", "concurrency": 2}, "leave out concurrency"),
    ):
        with pytest.raises(ConfigError, match=words):
            _opts(**values)


@pytest.fixture
def sim_url(sim: RunningSim) -> str:
    return f"{sim.base_url('oa')}/v1"


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_fluid_search_against_the_simulator_finds_its_knee(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    argv = [
        "--url", sim_url, "--model", "m", "--output-tokens", "8", "--input-tokens", "16", "--warmup", "0",
        "--duration", "3s", "--seed", "7", "--no-server-metrics", "--output-dir", str(out),
        "--search", "fluid", "--search-start", "10", "--search-tolerance", "0.1",
        "--fluidity-prefill-deadline", "150ms", "--search-max-points", "9",
    ]  # fmt: skip
    code, _, text = await tokwatch_cli("bench", *argv, limit_s=240)
    assert code == ExitCode.OK, text[-3000:]
    assert "fluid token generation rate:" in text
    data = json.loads((out / "capacity.json").read_text())
    rate = data["fluid_token_generation_rate"]
    lo, hi = data["bracket"]["highest_pass"], data["bracket"]["lowest_fail"]
    print(f"fluid token generation rate {rate:.1f} req/s (saturation {SATURATION:g}); bracket {lo}..{hi}; "
          f"{len(data['points'])} points")  # fmt: skip
    # Within the stated tolerance of the measured knee, and that knee is where the simulator saturates:
    # below the saturation rate (past it TTFT grows without bound) and not far below it.
    assert hi is not None and hi - lo <= 0.1 * lo
    assert 0.5 * SATURATION <= rate < 1.05 * SATURATION
    for p in data["points"]:
        assert (out / Path(p["result_dir"]).name / "summary.json").is_file()  # each point a full run
        assert p["passed"] == (p["value"] <= rate)
    assert (out / "capacity.png").is_file() or not _has_matplotlib()


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# A local server with a known knee for a search with every default: 128-token answers at 400 tok/s, four
# at a time (0.32 s each, so about 12.5 requests/s saturate it; past that the queue, and TTFT, grow).
DEFAULT_SIM = """
servers:
  - name: oa
    dialect: openai
    max_running: 4
    models: [{name: m, decode_tps: 400, prefill_tps: 1000000}]
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_a_default_fluid_search_is_bounded_and_states_its_bracket(
    tmp_path: Path, start_sim: StartSim
) -> None:
    out = tmp_path / "cap"
    sim = await start_sim(DEFAULT_SIM)
    argv = ["--url", f"{sim.base_url('oa')}/v1", "--model", "m", "--no-server-metrics",
            "--output-dir", str(out), "--search", "fluid"]  # fmt: skip
    code, _, text = await tokwatch_cli("bench", *argv, limit_s=360)
    assert code == ExitCode.OK, text[-3000:]
    data = json.loads((out / "capacity.json").read_text())
    calib, points = data["calibration"], data["points"]
    lo, hi = data["bracket"]["highest_pass"], data["bracket"]["lowest_fail"]
    print(f"default fluid search: {data['fluid_token_generation_rate']} req/s, bracket {lo}..{hi}, "
          f"start {calib['start_rate']} req/s (single-stream E2E {calib['e2e_p50_s']:.3f} s), "
          f"{len(points)} points of {data['point_duration_s']} s, wall {data['wall_time_s']:.0f} s, "
          f"point walls {[round(p['wall_s'], 1) for p in points]}")  # fmt: skip
    # Started from the measured single stream, not from 1 req/s ...
    assert calib["ok"] == 4 and 2.0 <= calib["start_rate"] <= 4.0
    assert points[0]["value"] == calib["start_rate"]
    # ... every point bounded by its duration and drain limit, and few enough that the whole search is
    # bounded by 3 minutes whatever each point does within its limits.
    assert data["point_duration_s"] == 10.0 and data["point_drain_timeout_s"] == 10.0
    assert all(p["duration_s"] == 10.0 and p["drain_timeout_s"] == 10.0 for p in points)
    bound = sum(p["duration_s"] + p["drain_timeout_s"] for p in points) + 5 * calib["e2e_p50_s"]
    assert bound <= 180, f"{len(points)} points: up to {bound:.0f} s"
    # The bracket is stated and within the tolerance, and the knee is near saturation in the arrivals that
    # came (a 10 s Poisson schedule averages a little off the requested rate). Not below it only: a 10 s
    # point at a rate x times saturation builds a backlog of about (x - 1) x 10 s of work, and a first token
    # up to ~1.65 s late still leaves a 128-token answer fluid (etalon counting, D_p 1 s, D_d 50 ms), so a
    # point up to ~1.16 x saturation can pass (docs/methodology.md).
    assert hi is not None and data["result_is_lower_bound"] is False and hi - lo <= 0.1 * lo
    best = next(p for p in points if p["value"] == lo)
    assert 0.5 * 12.5 <= best["achieved_rate_per_s"] <= 1.2 * 12.5
    assert "fluid token generation rate:" in text and "lowest fail" in text


def test_table_names_the_result() -> None:
    cap = Capacity("fluid", "rate", [], {}, result_rate=12.5, bracket=(12.5, 13.0), tolerance=0.1)
    assert "fluid token generation rate: 12.5 req/s" in table_lines(cap)[-1]


async def _run_bench(*argv: str) -> tuple[int, str]:
    code, _, err = await tokwatch_cli("bench", *argv, limit_s=150)
    return code, err


@pytest.mark.slow
async def test_concurrency_sweep_runs_one_full_point_per_value(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    code, err = await _run_bench(
        "--url", sim_url, "--model", "m", "--output-tokens", "8", "--input-tokens", "16", "--number", "12",
        "--no-server-metrics", "--output-dir", str(out), "--sweep", "concurrency=1,4",
    )  # fmt: skip
    assert code == ExitCode.OK, err[-3000:]
    data = json.loads((out / "capacity.json").read_text())
    assert data["mode"] == "sweep" and data["dimension"] == "concurrency"
    assert [p["value"] for p in data["points"]] == [1, 4]
    one, four = data["points"]
    assert one["requests"] == four["requests"] == 12 and one["failures"] == 0
    # max_running 2: four closed-loop streams queue behind two slots, one stream never waits.
    assert four["ttft_p50_s"] > one["ttft_p50_s"]
    assert four["output_tokens_per_s"] > one["output_tokens_per_s"]
    assert "passed" in one and one["passed"] is None  # no search criterion in a sweep
    for sub in ("concurrency-1", "concurrency-4"):
        assert {"summary.json", "request_level_metrics.jsonl"} <= {f.name for f in (out / sub).iterdir()}
    assert "concurrency" in err and "capacity.json" in err


@pytest.mark.slow
async def test_slo_search_stops_below_the_rate_that_misses_the_slo(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "slo"
    code, err = await _run_bench(
        "--url", sim_url, "--model", "m", "--output-tokens", "8", "--input-tokens", "16", "--duration", "2s",
        "--no-server-metrics", "--output-dir", str(out), "--search", "slo", "--slo", "ttft:p90<=150ms",
        "--search-start", "20", "--search-tolerance", "0.25", "--search-max-points", "6",
    )  # fmt: skip
    assert code == ExitCode.OK, err[-3000:]
    data = json.loads((out / "capacity.json").read_text())
    rate, lo, hi = data["slo_capacity_rate"], data["bracket"]["highest_pass"], data["bracket"]["lowest_fail"]
    assert rate == lo and hi is not None and rate < hi <= 2 * SATURATION
    assert rate < 1.05 * SATURATION  # past saturation TTFT grows without bound
    assert data["slo_capacity_tokens_per_s"] > 0
    for p in data["points"]:
        assert p["slos_met"] == p["passed"] and p["slo_results"][0]["name"].startswith("ttft")
    assert "SLO capacity:" in err
