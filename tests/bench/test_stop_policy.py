"""A bench that fails when the run failed: the failure share against --max-error-rate, a server that stops
answering (hung in-process simulator; killed simulator process), and requests abandoned at the drain limit."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rich.console import Console

from tests.bench.processes import sim_process, until_served
from tokwatch.bench.config import build_options
from tokwatch.bench.health import run_checks
from tokwatch.bench.outcome import ExitCode
from tokwatch.bench.session import run_bench
from tokwatch.bench.stop_policy import Silence, check_period, failure_share, too_many_failures
from tokwatch.figures.result import Status
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.testing import RunningSim, run_sim

SIM = """
servers:
  - name: oa
    dialect: openai
    models: [{name: m, decode_tps: 400, prefill_tps: 1000000, stall_seconds: 600}]
"""


def test_silence_counts_only_while_the_client_waits() -> None:
    s = Silence(now=0.0)
    s.sent(1.0)
    assert s.silent_for(5.0) == 0.0  # before the first answer a cold model load may take long
    s.answered(2.0)
    s.finished(got_answer=True)
    assert s.silent_for(100.0) == 0.0  # idle: nothing is waiting for the server
    s.sent(50.0)  # an idle client starts the clock at its send, not at the last answer
    assert s.silent_for(53.0) == 3.0
    s.finished(got_answer=False)  # refused: the clock keeps running with nothing in flight
    assert s.silent_for(60.0) == 10.0
    s.sent(60.0)
    assert s.silent_for(61.0) == 11.0  # a send after an unanswered failure does not restart it
    s.answered(62.0)
    assert s.silent_for(63.0) == 1.0
    assert check_period(10.0) == 0.5 and check_period(1.0) == 0.25


def test_failure_share_against_the_limit(make_record) -> None:
    records = [make_record(i) for i in range(18)] + [make_record(i, status=Status.TIMEOUT) for i in (18, 19)]
    share = failure_share(records)
    assert share == pytest.approx(0.1)
    assert too_many_failures(share, 0.05) and not too_many_failures(share, 0.1)
    assert not too_many_failures(share, None) and not too_many_failures(None, 0.05)


@pytest.fixture
async def sim() -> AsyncIterator[RunningSim]:
    async with run_sim(load_sim_config_text(SIM)) as running:
        yield running


def _opts(sim: RunningSim, **kw: object):
    return build_options({
        "url": f"{sim.base_url('oa')}/v1", "model": "m", "input_tokens": "16", "output_tokens": "8",
        "plots": False, "live_interval": 60, "server_metrics": False, **kw,
    })  # fmt: skip


async def test_a_failure_share_above_the_limit_fails_the_run(sim: RunningSim, tmp_path: Path) -> None:
    sim.set_faults("oa", "m", http_5xx=0.3)
    outcome, out = await run_bench(_opts(sim, concurrency=2, number=60), console=Console(quiet=True),
                                   out_dir=tmp_path / "run")  # fmt: skip
    assert outcome.complete and outcome.failure_share is not None and 0.1 < outcome.failure_share < 0.6
    assert outcome.exit_code() is ExitCode.ERRORS == 5
    checks = {c.name: c for c in run_checks(outcome)}
    assert checks["run"].verdict == "FAIL" and "above --max-error-rate 5%" in checks["run"].detail
    assert checks["errors"].verdict == "FAIL"
    assert "[PASS] run" not in (out / "health_checks.txt").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["max_error_rate"] == 0.05
    assert summary["requests"]["error_rate_exceeded"] is True
    # the same run with a tolerant limit passes
    tolerant, _ = await run_bench(_opts(sim, concurrency=2, number=20, max_error_rate=1.0),
                                  console=Console(quiet=True), out_dir=tmp_path / "tolerant")  # fmt: skip
    timing = ExitCode.CLIENT_TIMING if tolerant.client_timing_failed else ExitCode.OK  # a busy host: 6
    assert tolerant.exit_code() is timing and run_checks(tolerant)[0].verdict == "PASS"


async def test_a_hung_server_stops_the_run_and_abandons_requests_in_flight(
    sim: RunningSim, tmp_path: Path
) -> None:
    opts = _opts(sim, concurrency=3, duration="60s", unresponsive_timeout="1s")
    task = asyncio.create_task(run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run"))
    for _ in range(400):  # some answers first, then every stream stalls after its first token
        await asyncio.sleep(0.05)
        truth = sim.last_truth("oa")
        if truth is not None and truth.seq >= 10:
            break
    sim.set_faults("oa", "m", stall=1.0)
    outcome, out = await asyncio.wait_for(task, timeout=60)
    assert outcome.stop_reason == "unresponsive" and not outcome.complete
    assert outcome.exit_code() is ExitCode.INCOMPLETE
    assert "--unresponsive-timeout 1s" in (outcome.message or "")
    abandoned = [r for r in outcome.records if r.error_class == "unresponsive"]
    assert len(abandoned) == 3 and all(r.status is Status.TIMEOUT for r in abandoned)  # one per stream
    assert outcome.wall_s < 60  # stopped long before its duration (and the 600 s stall)
    lines = (out / "request_level_metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(outcome.records)  # abandoned requests are written, not dropped


async def test_drain_timeout_abandons_requests_still_running(sim: RunningSim, tmp_path: Path) -> None:
    # Every 4th request stalls for 600 s; the run keeps sending until its 1 s duration ends, then gives the
    # stalled ones 0.5 s before abandoning them as failed.
    sim.set_faults("oa", "m", stall=0.25)
    opts = _opts(sim, concurrency=2, duration="1s", drain_timeout="500ms", max_error_rate=1.0,
                 unresponsive_timeout="30s")  # fmt: skip
    outcome, _ = await asyncio.wait_for(
        run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run"), timeout=60
    )
    drained = [r for r in outcome.records if r.error_class == "drain_timeout"]
    assert outcome.complete and outcome.stop_reason == "finished" and drained
    assert all(r.status is Status.TIMEOUT for r in drained)
    assert outcome.wall_s < 30  # not the 600 s stall


async def _killed_mid_run(tmp_path: Path, *extra: str) -> tuple[int, str, dict, list[dict]]:
    """Issue 19's scenario: a simulator process killed in a 15 s closed-loop run once it answered 40
    requests (about 3 s in: 32 tokens at 200 tok/s, two at a time)."""
    config = ("listen: 127.0.0.1:{port}\nservers:\n  - name: oa\n    dialect: openai\n"
              "    models:\n      - {{name: m, decode_tps: 200, prefill_tps: 200000}}\n")  # fmt: skip
    out = tmp_path / "run"
    bench = None
    async with sim_process(tmp_path, config) as (sim, port):
        try:
            bench = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tokwatch", "bench", "--url", f"http://127.0.0.1:{port}/oa/v1",
                "--model", "m", "--concurrency", "2", "--duration", "15s", "--output-tokens", "32",
                "--output-dir", str(out), "--no-server-metrics", *extra,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "MPLBACKEND": "Agg"},
            )  # fmt: skip
            await until_served(port, 40)
            sim.kill()
            await sim.wait()
            _, err = await asyncio.wait_for(bench.communicate(), timeout=90)
        finally:
            if bench is not None and bench.returncode is None:
                bench.kill()
                await bench.wait()
    assert bench.returncode is not None
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "request_level_metrics.jsonl").read_text().splitlines()]
    return bench.returncode, err.decode(), summary, lines


@pytest.mark.slow
async def test_a_server_killed_mid_run_ends_the_bench_within_the_bound(tmp_path: Path) -> None:
    """It used to exit 0 with `run complete: 44/78 ok` and `[PASS] run: complete`."""
    code, text, summary, lines = await _killed_mid_run(tmp_path, "--unresponsive-timeout", "3s")
    assert code == ExitCode.INCOMPLETE, text
    assert "INCOMPLETE (unresponsive)" in text and "[FAIL] run" in text and "Traceback" not in text
    assert summary["stop_reason"] == "unresponsive" and summary["requests"]["ok"] > 0
    last_ok = max(r["completed_at_s"] for r in lines if r["status"] == "ok")
    after = [r for r in lines if r["status"] != "ok"]
    print(f"{summary['requests']['ok']} ok; {len(after)} failed after the kill; stopped "
          f"{summary['wall_time_s'] - last_ok:.1f} s after the last answer (bound 3 s)")  # fmt: skip
    # Stopped by the silence bound, well before the run's own 15 s end, and no request storm meanwhile.
    assert summary["wall_time_s"] < 15
    assert summary["wall_time_s"] - last_ok < 3 + 5  # the bound, plus generous slack for a loaded host
    assert len(after) < 50


@pytest.mark.slow
async def test_with_default_limits_the_killed_run_fails_on_its_error_share(tmp_path: Path) -> None:
    # The 30 s silence bound is longer than what is left of the run: it ends at its duration, but failed.
    code, text, summary, lines = await _killed_mid_run(tmp_path)
    # FAILED when a loaded host had no answer back before the kill: still a failed run, never OK.
    assert code in (ExitCode.ERRORS, ExitCode.INCOMPLETE, ExitCode.FAILED), text
    assert "[FAIL] run" in text and "Traceback" not in text
    health = (tmp_path / "run" / "health_checks.txt").read_text()
    assert "[FAIL] run" in health and "[PASS] run" not in health
    assert summary["requests"]["error_rate_exceeded"] or not summary["complete"]
    assert len([r for r in lines if r["status"] != "ok"]) < 50
