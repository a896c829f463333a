"""The command line as a user runs it: real processes, real signals, real loopback HTTP."""

from __future__ import annotations

import http.server
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli_processes import runs_total, stop, tokwatch, wait_http
from tests.support.postgres import LocalPostgres, stored_runs
from tests.support.thread_server import ThreadServer


def write_config(tmp_path: Path, sim_url: str) -> Path:
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(f"""
probe: {{max_tokens: 8}}
schedule: {{interval: 1h, offset: 0s}}
storage: {{sqlite_path: '{tmp_path}/tw.db', outbox_path: '{tmp_path}/outbox'}}
endpoints:
  - {{name: good, kind: openai, base_url: '{sim_url}/oa/v1', model: m}}
  - {{name: limited, kind: openai, base_url: '{sim_url}/oa/v1', model: limited}}
""")
    return cfg


def test_probe_command_prints_table_and_fails_on_non_ok(sim_url: str, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, sim_url)
    proc = subprocess.run(
        [sys.executable, "-m", "tokwatch", "probe", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "good" in proc.stdout and "ok" in proc.stdout and "rate_limited" in proc.stdout
    # Below the table, each failed run with its error message (the table has only the class).
    assert any(
        line.startswith("limited: rate_limited (http_429): ") and len(line) > 40
        for line in proc.stdout.splitlines()
    ), proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "tokwatch", "probe", "--config", str(cfg), "good"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "client_stream" in proc.stdout


def test_probe_command_unknown_endpoint_is_usage_error(sim_url: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tokwatch", "probe", "--config", str(write_config(tmp_path, sim_url)), "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no endpoint named nope" in proc.stderr and "Traceback" not in proc.stderr


def test_serve_scrapes_then_exits_cleanly_on_sigterm(
    sim_url: str, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    cfg = write_config(tmp_path, sim_url)
    port = free_port()
    proc = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready")
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline and 'status="ok",workload="seed000"} 1.0' not in body:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                body = resp.read().decode()
            time.sleep(0.2)
        assert 'tokwatch_probe_runs_total{endpoint="good",status="ok",workload="seed000"} 1.0' in body
        os.kill(proc.pid, signal.SIGHUP)  # unchanged file: reload is a no-op, process keeps running
        time.sleep(0.3)
        assert proc.poll() is None
    finally:
        code, _out, err = stop(proc)
    assert code == 0, err
    assert "Traceback" not in err


def test_serve_with_bad_config_exits_2_without_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yml"
    cfg.write_text("schedule:\n  interval: often\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tokwatch", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert f"{cfg}:2: schedule.interval: invalid duration 'often'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_demo_runs_a_round_and_exits(tmp_path: Path, free_port: Callable[[], int]) -> None:
    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokwatch",
            "demo",
            "--rounds",
            "1",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"metrics at http://127.0.0.1:{port}/metrics" in out
    for name in ("openai-fast", "ollama-local", "llamacpp-local", "vllm-reasoning", "flaky-cloud"):
        assert name in out
    assert "engine" in out  # ollama / llama.cpp report engine timings


def test_sigterm_cancels_a_probe_in_flight_and_exits_cleanly(
    sim_url: str, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    cfg = tmp_path / "stuck.yml"
    cfg.write_text(f"""
schedule: {{interval: 1h, offset: 0s}}
storage: {{sqlite_path: '{tmp_path}/tw.db', outbox_path: '{tmp_path}/outbox'}}
endpoints:
  - {{name: stuck, kind: openai, base_url: '{sim_url}/oa/v1', model: stuck, timeout: 60s}}
""")
    port = free_port()
    proc = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready")
        deadline = time.monotonic() + 20
        body = ""
        while time.monotonic() < deadline and "tokwatch_probes_in_flight 1.0" not in body:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                body = resp.read().decode()
            time.sleep(0.1)
        assert "tokwatch_probes_in_flight 1.0" in body
        t0 = time.monotonic()
    finally:
        code, _out, err = stop(proc)
    assert code == 0, err
    assert time.monotonic() - t0 < 10  # the 60 s probe was cancelled, not waited for
    assert "Traceback" not in err


async def test_log_redaction_follows_keys_added_by_a_reload(tmp_path: Path) -> None:
    from tokwatch.cli import RedactingFilter
    from tokwatch.service.app import App
    from tokwatch.settings.config import load_config

    def config(key: str) -> str:
        return (
            "endpoints:\n"
            f"  - {{name: a, kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m, api_key: {key}}}\n"
        )

    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(config("sk-first-key-0001"))
    app = App(load_config(cfg), str(cfg))
    redacting = RedactingFilter()
    redacting.follow(lambda: app.keys.redactor)
    cfg.write_text(config("sk-second-key-0002"))
    assert (await app.reload())[0]
    record = logging.LogRecord(
        "tokwatch", logging.INFO, __file__, 1, "sent %s", ("sk-second-key-0002",), None
    )
    redacting.filter(record)
    assert "sk-second-key-0002" not in record.getMessage() and "***" in record.getMessage()


@pytest.mark.slow
def test_kill_9_of_serve_during_a_database_outage_loses_no_run(
    sim_url: str, tmp_path: Path, free_port: Callable[[], int], pg_server: LocalPostgres, pg_dsn: str
) -> None:

    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(f"""
probe: {{max_tokens: 8}}
schedule: {{interval: 1s, offset: 0s}}
storage: {{dsn: '{pg_dsn}', outbox_path: '{tmp_path}/outbox'}}
endpoints:
  - {{name: good, kind: openai, base_url: '{sim_url}/oa/v1', model: m}}
""")


    port = free_port()
    proc = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(stored_runs(pg_dsn)) < 2:
            time.sleep(0.2)
        assert len(stored_runs(pg_dsn)) >= 2
        pg_server.stop()
        time.sleep(4.5)  # runs go on while the database is down; kill at an arbitrary moment
        before_kill = runs_total(port)
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
        pg_server.start()
    assert before_kill >= 5
    # Restart: the outbox is replayed into the database that is back.
    proc = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(stored_runs(pg_dsn, killed_at)) < before_kill:
            time.sleep(0.2)
    finally:
        code, _out, err = stop(proc)
    assert code == 0, err
    rows = stored_runs(pg_dsn)
    assert all(n == 1 for _, n in rows)  # exactly once
    # Every run the killed process had recorded is stored (one being measured at the kill may be lost).
    assert len(stored_runs(pg_dsn, killed_at)) >= before_kill
    assert "Traceback" not in err


def test_probe_command_scrapes_only_the_probed_endpoints_servers(sim_url: str, tmp_path: Path) -> None:
    hits: list[str] = []

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b"vllm:generation_tokens_total 1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with ThreadServer(Metrics) as server:
        cfg = write_config(tmp_path, sim_url)
        other = server.url
        cfg.write_text(
            cfg.read_text()
            + f"  - {{name: other, kind: vllm, base_url: '{other}/v1', model: m,"
            "     api_key_env: TW_UNSET_KEY}\n"
        )
        proc = subprocess.run(
            [sys.executable, "-m", "tokwatch", "probe", "--config", str(cfg), "good"],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k != "TW_UNSET_KEY"},
        )
    # `other` is neither probed nor scraped, and its missing key does not stop probing `good`.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hits == []
