"""One schedule over several machines: `tokwatch bench --segment K/N` processes that share nothing but the
store and the start time (real OS processes, a real simulator, real PostgreSQL and SQLite), against one
process at the same total rate.

Tolerance of the figure comparison: the simulator's own times are fixed for a request (no jitter, no
contention; prefill 2,000 tok/s, decode 200 tok/s: TTFT about 32 ms, E2E about 60 ms), and both runs send
the very same requests (same seed, same indices), so what differs is when each process got a core on a
shared 2-core machine: a few milliseconds at a time. p50 and p90 of TTFT and E2E must agree within 10 ms
plus the larger of the two runs' own scheduling lag p90 (how late the clients themselves were to send, which
is what a loaded machine adds; a fraction of a millisecond on a quiet one); the tails (p99, max) are not
compared, being the noise itself. Counts must agree exactly.
"""

import asyncio
import json
import time

import pytest

from tests.bench.processes import bench_ran, tokwatch_cli
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.testing import run_sim

SIM = """
servers:
  - name: fixed
    dialect: openai
    models:
      - name: m
        decode_tps: 200
        prefill_tps: 2000
"""
LOAD = ("--rate", "30", "--number", "60", "--seed", "5", "--input-tokens", "64", "--output-tokens", "6",
        "--no-server-metrics", "--live-interval", "60", "--warmup", "3")  # fmt: skip
TOLERANCE_S = 0.010


@pytest.fixture
async def sim():
    async with run_sim(load_sim_config_text(SIM)) as s:
        yield s


def _config(tmp_path, sim, storage):
    path = tmp_path / "tokwatch.yml"
    path.write_text(
        "endpoints:\n  - name: ep\n    kind: openai\n"
        f"    base_url: {sim.base_url('fixed')}/v1\n    model: m\nstorage:\n{storage}\n"
    )
    return str(path)


async def _segments(cfg, tmp_path, n, run_id, *extra, parts=None):
    """Segments `parts` (all by default) of n as separate processes at once; [(exit code, stderr)]."""

    def argv(k):
        return ["bench", "-c", cfg, "--endpoint", "ep", *LOAD, "--segment", f"{k}/{n}", "--run-id", run_id,
                "--output-dir", str(tmp_path / f"{run_id}-{k}"), *extra]  # fmt: skip

    runs = [tokwatch_cli(*argv(k), limit_s=180) for k in (range(n) if parts is None else parts)]
    return [(code, err) for code, _, err in await asyncio.gather(*runs)]


async def _report(cfg, run_id):
    code, out, err = await tokwatch_cli("bench", "report", run_id, "-c", cfg, "--format", "json")
    assert "Traceback" not in err
    return code, (json.loads(out) if out.strip() else None), err


def _planned_offsets(tmp_path, names):
    """Planned instants of the measured requests of these result directories (one host, one perf_counter
    clock), after the first: what the schedule decided, whoever sent them."""
    planned = []
    for name in names:
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        origin = summary["client"]["perf_counter_origin_s"]
        for line in (tmp_path / name / "request_level_metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            if not r["warmup"]:
                planned.append((r["request_id"], origin + r["intended_at_s"]))
    first = min(t for _, t in planned)
    return sorted((i, t - first) for i, t in planned)


def _same_figures(split, one):
    late = max(split["metrics"]["scheduling_lag"]["p90"], one["metrics"]["scheduling_lag"]["p90"])
    for name in ("ttft", "e2e"):
        for q in ("p50", "p90"):
            a, b = split["metrics"][name][q], one["metrics"][name][q]
            assert abs(a - b) <= TOLERANCE_S + late, f"{name} {q}: {a * 1e3:.1f} ms vs one {b * 1e3:.1f} ms"


def _same_plan(tmp_path, split_dirs, one_dir):
    split, one = _planned_offsets(tmp_path, split_dirs), _planned_offsets(tmp_path, [one_dir])
    assert [i for i, _ in split] == [i for i, _ in one] == list(range(3, 63))  # ids after the 3 warm-up ones
    assert [t for _, t in split] == pytest.approx([t for _, t in one], abs=1e-4)


@pytest.mark.slow
async def test_segments_on_postgres_agree_on_a_start_and_merge_as_one_process_runs(tmp_path, sim, pg_dsn):
    cfg = _config(tmp_path, sim, f"  dsn: {pg_dsn}")
    results = await _segments(cfg, tmp_path, 3, "split-pg", "--start-delay", "5s")
    for code, err in results:
        assert bench_ran(code, err), err
        assert "stored: segment" in err and "of bench run split-pg (20 requests) in postgres" in err
    # the last segment to store merged every segment: the row as stored says so
    assert sum("merged: bench run split-pg: 3/3 segments stored; 60/60 ok" in err for _, err in results) >= 1
    sim.restart_counters("fixed")  # an empty prefix cache again: the one process sends the same prompts
    code, _, err = await tokwatch_cli("bench", "-c", cfg, "--endpoint", "ep", *LOAD, "--run-id", "one-pg",
                                      "--output-dir", str(tmp_path / "one"), limit_s=180)  # fmt: skip
    assert bench_ran(code, err) and "stored: bench run one-pg (60 requests)" in err, err
    code, split, _ = await _report(cfg, "split-pg")
    assert code == 0, split
    code, one, _ = await _report(cfg, "one-pg")
    assert code == 0
    assert split["complete"] and split["requests"]["total"] == one["requests"]["total"] == 60
    assert split["requests"]["ok"] == 60 and split["split"]["arrivals_planned"] == 60
    assert split["split"]["stored"] == [0, 1, 2] and split["split"]["missing"] == []
    # every segment read the database's clock: one machine, one clock, so each offset is 0 within its read's
    # error and the spread within twice the largest error
    assert split["split"]["clock_offset_spread_s"] <= 2 * split["split"]["clock_offset_error_s"] + 1e-6
    assert all(s["clock_offset_s"] is not None for s in split["split"]["per_segment"])
    assert split["arrivals"]["clock"] == "database" and split["arrivals"]["arrivals"] == 60
    _same_figures(split, one)
    _same_plan(tmp_path, [f"split-pg-{k}" for k in range(3)], "one")
    # `tokwatch report --bench` lists the merged run as one run
    code, out, _ = await tokwatch_cli("report", "--bench", "-c", cfg, "--format", "json", "--since", "1h")
    rows = {r["id"]: r for r in json.loads(out)["bench_runs"]}
    assert rows["split-pg"]["requests_measured"] == 60 and rows["split-pg"]["complete"] is True
    assert rows["split-pg"]["ttft_p99_s"] == pytest.approx(split["metrics"]["ttft"]["p99"])


@pytest.mark.slow
async def test_segments_on_sqlite_with_a_given_start_and_workers_inside_one(tmp_path, sim):
    cfg = _config(tmp_path, sim, f"  sqlite_path: {tmp_path / 'tw.db'}")
    start = f"{time.time() + 6:.3f}"
    first, second = await asyncio.gather(
        _segments(cfg, tmp_path, 2, "split-lite", "--start-at", start, "--workers", "2", parts=[0]),
        _segments(cfg, tmp_path, 2, "split-lite", "--start-at", start, parts=[1]),
    )
    for code, err in first + second:
        assert bench_ran(code, err), err
    sim.restart_counters("fixed")
    code, _, err = await tokwatch_cli("bench", "-c", cfg, "--endpoint", "ep", *LOAD, "--run-id", "one-lite",
                                      "--output-dir", str(tmp_path / "one"), limit_s=180)  # fmt: skip
    assert bench_ran(code, err), err
    code, split, _ = await _report(cfg, "split-lite")
    _, one, _ = await _report(cfg, "one-lite")
    assert code == 0 and split["requests"]["total"] == one["requests"]["total"] == 60
    assert split["split"]["clock_offset_spread_s"] is None  # SQLite has no clock of its own
    assert split["arrivals"]["clock"] == "own"
    _same_figures(split, one)
    _same_plan(tmp_path, ["split-lite-0", "split-lite-1"], "one")


@pytest.mark.slow
async def test_a_missing_segment_is_named_and_the_run_is_incomplete(tmp_path, sim, monkeypatch):
    cfg = _config(tmp_path, sim, f"  sqlite_path: {tmp_path / 'tw.db'}")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")  # as in a pod of a Kubernetes Indexed Job
    start = f"{time.time() + 4:.3f}"
    ((code, err),) = await _segments(cfg, tmp_path, 2, "half", "--start-at", start, parts=["auto"])
    assert bench_ran(code, err) and "stored: segment 1/2 of bench run half (30 requests)" in err, err
    assert "merged: bench run half: 1/2 segments stored (missing 0)" in err
    code, report, _ = await _report(cfg, "half")
    assert code == 3  # incomplete
    assert report["stop_reason"] == "segments_missing" and report["split"]["missing"] == [0]
    # The missing segment's share of the 60 planned arrivals is counted (issue 37: it said 30 of 30).
    assert report["requests"]["total"] == 30 and report["split"]["arrivals_planned"] == 60
    assert report["split"]["arrivals_planned_missing"] == 30
    code, text, _ = await tokwatch_cli("bench", "report", "half", "-c", cfg)
    assert code == 3 and "MISSING: segment(s) 0 stored nothing" in text
    assert "30 measured of 60 planned (30 of them in the missing segments)" in text
    assert "| 1/2 | " in text and "never averaged over segments" in text


async def test_a_segment_ready_after_the_start_is_stored_as_late(tmp_path, sim):
    cfg = _config(tmp_path, sim, f"  sqlite_path: {tmp_path / 'tw.db'}")
    past = f"{time.time() - 30:.3f}"
    ((code, err),) = await _segments(cfg, tmp_path, 2, "late", "--start-at", past, parts=[0])
    assert code == 4 and "late_start" in err and "after the common start" in err, err  # nothing sent
    code, report, _ = await _report(cfg, "late")
    (seg,) = report["split"]["per_segment"]
    assert (seg["stop_reason"], seg["requests_measured"], seg["arrivals_planned"]) == ("late_start", 0, 30)
    assert code == 4  # nothing succeeded


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--segment", "0/2", "--start-at", "1e9"), "segment needs run_id"),
        (("--segment", "auto/2", "--run-id", "x"), "JOB_COMPLETION_INDEX"),
        (("--segment", "0/2", "--run-id", "x"), "--segment without --start-at needs a store"),
        (("--segment", "0/2", "--run-id", "x", "--start-at", "soon"), "expected unix seconds or an RFC 3339"),
    ],
)
async def test_bad_segment_runs_are_usage_errors_before_sending(tmp_path, sim, monkeypatch, argv, message):
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    code, _, err = await tokwatch_cli("bench", "--url", f"{sim.base_url('fixed')}/v1", "--model", "m", *LOAD,
                                      *argv, "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
async def test_a_run_id_planned_with_other_segments_is_refused(tmp_path, sim):
    cfg = _config(tmp_path, sim, f"  sqlite_path: {tmp_path / 'tw.db'}")
    start = f"{time.time() + 3:.3f}"
    ((code, err),) = await _segments(cfg, tmp_path, 2, "twice", "--start-at", start, parts=[0])
    assert bench_ran(code, err), err
    ((code, err),) = await _segments(cfg, tmp_path, 3, "twice", "--start-at", start, parts=[1])
    assert code == 2 and "already stored with 2 segments, not as 3 segments" in err
