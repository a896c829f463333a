"""One owner per state (issue 37): a second exporter on the same state directory, outbox or SQLite file
refuses to start with one line naming the path and the holder's PID; a kill -9 leaves no stale lock; the
read-only commands work beside a running exporter. Real processes, real signals, real loopback HTTP."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.support.cli_processes import runs_total, stop, tokwatch, wait_http
from tokwatch.storage.state_lock import StateLock, StateLockedError, holder_pid, lock_target

ENDPOINTS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")


def _config(path: Path, sim_url: str, storage: str = "{}", names: tuple[str, ...] = ("good",)) -> Path:
    endpoints = "\n".join(
        f"  - {{name: {n}, kind: openai, base_url: '{sim_url}/oa/v1', model: m}}" for n in names
    )
    path.write_text(f"""
probe: {{max_tokens: 8}}
schedule: {{interval: 1s, offset: 0s}}
storage: {storage}
endpoints:
{endpoints}
""")
    return path


def _env(state_home: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("XDG_STATE_HOME", None)  # the default: ./tokwatch-state in the working directory
    if state_home is not None:
        env["XDG_STATE_HOME"] = str(state_home)
    return env


def _refused(proc: subprocess.Popen[str]) -> str:
    """The one stderr line of an exporter that refused to start (exit 2, no traceback)."""
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.startswith("tokwatch:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _sqlite_runs(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT r.run_id, e.name FROM runs r JOIN endpoints e ON e.id = r.endpoint_id"
        ).fetchall()


def _wait_runs(port: int, at_least: int) -> int:
    import time

    deadline = time.monotonic() + 30
    while (n := runs_total(port)) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    assert n >= at_least
    return n


def test_two_state_locks_on_one_file_exclude_each_other_and_name_the_holder(tmp_path: Path) -> None:
    target = lock_target("outbox", tmp_path / "outbox.jsonl")
    first = StateLock([target, lock_target("outbox", tmp_path / "." / "outbox.jsonl")])
    assert len(first.targets) == 1  # one lock file per real path, else a process would lock itself out
    first.acquire()
    assert holder_pid(target.lock_file) == os.getpid()
    with pytest.raises(
        StateLockedError, match=rf"outbox {tmp_path}/outbox.jsonl is in use .*PID {os.getpid()}"
    ):
        StateLock([target]).acquire()
    first.release()
    second = StateLock([target])
    second.acquire()  # released locks are free at once
    second.release()


@pytest.mark.slow
def test_two_exporters_in_one_working_directory_one_refuses_kill_9_leaves_no_stale_lock(
    sim_url: str, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    cfg = _config(tmp_path / "tokwatch.yml", sim_url)
    env = _env(None)
    port = free_port()
    first = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}", cwd=work, env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        second = tokwatch(
            "serve", "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}", cwd=work, env=env
        )
        line = _refused(second)
        assert "tokwatch-state" in line and f"PID {first.pid}" in line, line
        # The read-only commands still work beside the running exporter.
        for command in (["report"], ["db", "status"]):
            done = subprocess.run(
                [sys.executable, "-m", "tokwatch", *command, "--config", str(cfg)],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
        before_kill = _wait_runs(port, 3)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate(timeout=10)
    # The kernel dropped the dead process's locks: a new exporter takes them at once.
    third = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}", cwd=work, env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        assert holder_pid(work / "tokwatch-state" / "tokwatch.lock") == third.pid
    finally:
        code, _out, err = stop(third)
    assert code == 0, err
    runs = _sqlite_runs(work / "tokwatch-state" / "tokwatch.db")
    assert len(runs) >= before_kill and len({r for r, _ in runs}) == len(runs)


def test_two_configs_naming_one_outbox_with_postgres_one_refuses(
    sim_url: str, tmp_path: Path, free_port: Callable[[], int], pg_dsn: str
) -> None:
    outbox = tmp_path / "shared" / "outbox.jsonl"
    storage = f"{{dsn: '{pg_dsn}', outbox_path: '{outbox}'}}"
    cfg_a = _config(tmp_path / "a.yml", sim_url, storage, ("alpha",))
    cfg_b = _config(tmp_path / "b.yml", sim_url, storage, ("bravo",))
    port = free_port()
    first = tokwatch("serve", "--config", str(cfg_a), "--listen", f"127.0.0.1:{port}")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        line = _refused(tokwatch("serve", "--config", str(cfg_b), "--listen", f"127.0.0.1:{free_port()}"))
        assert f"outbox {outbox} is in use" in line and f"PID {first.pid}" in line, line
        before_stop = _wait_runs(port, 3)
    finally:
        code, _out, err = stop(first)
    assert code == 0, err
    with psycopg.connect(pg_dsn, connect_timeout=5) as conn:
        rows = conn.execute("SELECT run_id, count(*) FROM runs GROUP BY run_id").fetchall()
    assert len(rows) >= before_stop and all(n == 1 for _, n in rows)  # 0 lost, none twice


def test_shards_by_hand_on_one_host_refuse_a_shared_state_and_keep_their_own(
    sim_url: str, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    cfg = _config(tmp_path / "tokwatch.yml", sim_url, names=ENDPOINTS)
    shared = _env(tmp_path / "state")
    ports = [free_port(), free_port()]
    replica_0 = tokwatch(
        "serve", "-c", str(cfg), "--shard", "0/2", "--listen", f"127.0.0.1:{ports[0]}", env=shared
    )
    try:
        wait_http(f"http://127.0.0.1:{ports[0]}/-/ready", 30)
        line = _refused(
            tokwatch(
                "serve", "-c", str(cfg), "--shard", "1/2", "--listen", f"127.0.0.1:{ports[1]}", env=shared
            )
        )
        assert f"PID {replica_0.pid}" in line, line
    finally:
        code, _out, err = stop(replica_0)
    assert code == 0, err
    # What docs/scaling.md says to do: each replica its own state directory.
    procs = [
        tokwatch(
            "serve",
            "-c",
            str(cfg),
            "--shard",
            f"{i}/2",
            "--listen",
            f"127.0.0.1:{ports[i]}",
            env=_env(tmp_path / f"state-{i}"),
        )
        for i in range(2)
    ]
    counted = []
    try:
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        counted = [_wait_runs(port, 2) for port in ports]
    finally:
        for proc in procs:
            code, _out, err = stop(proc)
            assert code == 0, err
    stored = [_sqlite_runs(tmp_path / f"state-{i}" / "tokwatch" / "tokwatch.db") for i in range(2)]
    for runs, at_least in zip(stored, counted, strict=True):
        assert len(runs) >= at_least  # 0 lost
    names = [{name for _, name in runs} for runs in stored]
    assert not names[0] & names[1]  # each endpoint probed by one replica only
