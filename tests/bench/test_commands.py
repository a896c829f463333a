"""`tokwatch bench` as a command: exit codes, messages, signals and the live Prometheus endpoint."""

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sys

import aiohttp
import pytest
from rich.console import Console

from tests.bench.processes import sim_process, until_served
from tests.support.thread_server import ThreadServer
from tokwatch.bench.commands import add_commands
from tokwatch.bench.config import build_options
from tokwatch.bench.outcome import ExitCode
from tokwatch.bench.session import run_bench

ENTRY = (
    "import argparse, sys\n"
    "from tokwatch.bench.commands import add_commands\n"
    "p = argparse.ArgumentParser(); add_commands(p.add_subparsers())\n"
    "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))\n"
)


def _cmd(argv):
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def _ok_count(body):
    m = re.search(r'^tokwatch_bench_requests_total\{status="ok"\} (\S+)$', body, re.M)
    return float(m.group(1)) if m else 0.0


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_input_exits_2_with_a_message(tmp_path, capsys):
    code = _cmd(["--url", "http://127.0.0.1:9/v1", "--model", "m", "--concurrency", "0"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE == 2
    assert "concurrency" in err and "Traceback" not in err
    code = _cmd(["--url", "http://127.0.0.1:9/v1", "--model", "m", "--dataset", str(tmp_path / "none.jsonl")])
    assert code == 2 and "no such dataset file" in capsys.readouterr().err
    code = _cmd(["--url", "http://127.0.0.1:9/v1", "--model", "m", "--slo", "ttft<1"])
    assert code == 2 and "expected METRIC:pNN<=VALUE" in capsys.readouterr().err


def test_unreachable_endpoint_exits_4_and_writes_results(tmp_path, capsys):
    out = tmp_path / "run"
    code = _cmd(["--url", "http://127.0.0.1:9/v1", "--model", "m", "--number", "3", "--output-dir", str(out),
                 "--no-server-metrics"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.FAILED == 4
    assert "INCOMPLETE (unreachable)" in err and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["stop_reason"] == "unreachable"


@pytest.mark.slow
async def test_sigint_stops_the_run_writes_incomplete_and_exits_3(tmp_path, stream_server):
    stream_server.gap = 0.01
    out = tmp_path / "run"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ENTRY, "bench", "--url", stream_server.url, "--model", "m",
        "--concurrency", "2", "--number", "100000", "--output-dir", str(out), "--no-server-metrics",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )  # fmt: skip
    try:
        for _ in range(600):
            await asyncio.sleep(0.05)
            if len(stream_server.bodies) > 6:
                break
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == ExitCode.INCOMPLETE == 3, err.decode()
    assert b"Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["stop_reason"] == "interrupted"
    assert summary["requests"]["ok"] >= 4


async def test_live_metrics_are_served_during_the_run(tmp_path, stream_server):
    stream_server.gap = 0.01
    port = _free_port()
    opts = build_options(
        {"url": stream_server.url, "model": "m", "concurrency": 2, "number": 100000,
         "listen": f"127.0.0.1:{port}", "plots": False, "server_metrics": False, "live_interval": 60}
    )  # fmt: skip
    task = asyncio.create_task(run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run"))
    body = ""
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                await asyncio.sleep(0.05)
                try:
                    async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                        body = await r.text()
                except aiohttp.ClientError:
                    continue
                if _ok_count(body) >= 3:
                    break
    finally:
        task.cancel()
        outcome, _ = await asyncio.wait_for(task, timeout=30)
    assert _ok_count(body) >= 3
    assert 'tokwatch_bench_ttft_seconds{quantile="0.99"}' in body
    assert "tokwatch_bench_in_flight 2.0" in body
    assert outcome.stop_reason == "interrupted"


@pytest.mark.slow
async def test_a_server_that_dies_mid_run_stops_the_bench_without_a_storm(tmp_path):
    config = ("listen: 127.0.0.1:{port}\nservers:\n  - name: oa\n    dialect: openai\n"
              "    models:\n      - {{name: m, decode_tps: 4000, prefill_tps: 200000}}\n")  # fmt: skip
    bench = None
    out = tmp_path / "run"
    async with sim_process(tmp_path, config) as (sim, port):
        try:
            bench = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tokwatch", "bench", "--url", f"http://127.0.0.1:{port}/oa/v1",
                "--model", "m",
                "--concurrency", "8", "--duration", "120", "--output-tokens", "16", "--output-dir", str(out),
                "--no-server-metrics", "--unresponsive-timeout", "120s",  # the consecutive-failure stop
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "MPLBACKEND": "Agg"},
            )  # fmt: skip
            await until_served(port, 200)  # successes first: the old fail-fast looked before the first one
            sim.kill()
            await sim.wait()
            _, err = await asyncio.wait_for(bench.communicate(), timeout=60)
        finally:
            if bench is not None and bench.returncode is None:
                bench.kill()
                await bench.wait()
    text = err.decode()
    assert bench.returncode == ExitCode.INCOMPLETE == 3, text
    assert "INCOMPLETE (failing)" in text and "in a row failed" in text and "Traceback" not in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["stop_reason"] == "failing"
    assert summary["requests"]["ok"] > 0
    failed = summary["requests"]["total"] - summary["requests"]["ok"]
    print(f"{summary['requests']['ok']} ok, then {failed} failed before the stop")
    assert failed < 2000  # was 63,167 in 12 s


def test_bad_extra_body_and_tokenizer_exit_2(tmp_path, capsys):
    base = ["--url", "http://127.0.0.1:9/v1", "--model", "m", "--output-dir", str(tmp_path / "run")]
    assert _cmd([*base, "--extra-body", '{"top_k": }']) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "extra_body" in err and "invalid JSON" in err and "Traceback" not in err
    assert _cmd([*base, "--tokenizer", str(tmp_path / "missing.json")]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert ("missing.json" in err or "tokenizers package" in err) and "Traceback" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"turns": [{"prompt_tokens": 5}]}\n')
    assert _cmd([*base, "--dataset", str(bad)]) == ExitCode.USAGE
    assert f"{bad}:2: turns[0]: output_tokens must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing was sent, nothing written


def test_a_run_in_which_no_request_succeeded_fails_the_run_check(tmp_path, capsys):
    """A TCP server that answers garbage, not HTTP: every request fails on the client side (bad_http).
    The run completes its 3 requests, but its health check must not say PASS."""

    def garbage(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"SSH-2.0-not-http\r\n\r\n")

    with ThreadServer(garbage) as server:
        out = tmp_path / "run"
        code = _cmd(["--url", f"{server.url}/v1", "--model", "m",
                     "--number", "3", "--output-dir", str(out), "--no-server-metrics"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.FAILED
    health = (out / "health_checks.txt").read_text()
    assert "[PASS] run:" not in health and "[FAIL] run: complete; 3 measured requests, 0 succeeded" in health
    assert "[PASS] run:" not in err
