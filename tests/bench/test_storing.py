"""`tokwatch bench --config` writes the run and its requests to the configured store (real simulator, real
SQLite file, the command run as a user runs it in a separate process)."""

import json
import sqlite3

from tests.bench.processes import bench_ran, tokwatch_cli

SIM = """
servers:
  - name: fast
    dialect: openai
    models:
      - name: m
        decode_tps: 2000
        prefill_tps: 100000
"""


def _config(tmp_path, sim, storage):
    path = tmp_path / "tokwatch.yml"
    path.write_text(
        "endpoints:\n  - name: simfast\n    kind: openai\n"
        f"    base_url: {sim.base_url('fast')}/v1\n    model: m\n"
        f"storage:\n{storage}\n"
    )
    return str(path)


async def _bench(*argv):
    """Run `python -m tokwatch bench ...`; returns (exit code, stderr)."""
    code, _, err = await tokwatch_cli(
        "bench", *argv, "--no-server-metrics", "--output-tokens", "6", "--input-tokens", "16",
        "--live-interval", "60",
    )  # fmt: skip
    return code, err


def _tables(db):
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT id, endpoint, complete, requests_measured, all_slos_met FROM bench_runs")
        runs = runs.fetchall()
        requests = conn.execute(
            "SELECT bench_run_id, request_id, status, ttft_s FROM bench_requests"
        ).fetchall()
        probe_runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    return runs, requests, probe_runs


async def test_run_and_requests_are_stored(tmp_path, sim):
    db = tmp_path / "state" / "tw.db"
    cfg = _config(tmp_path, sim, f"  sqlite_path: {db}")
    out = tmp_path / "run"
    code, err = await _bench("-c", cfg, "--endpoint", "simfast", "--number", "6", "--warmup", "2",
                             "--concurrency", "2", "--slo", "ttft:p99<=5",
                             "--output-dir", str(out))  # fmt: skip
    assert bench_ran(code, err), err
    run_id = json.loads((out / "summary.json").read_text())["run_id"]
    assert f"stored: bench run {run_id} (6 requests) in sqlite" in err
    runs, requests, probe_runs = _tables(db)
    assert runs == [(run_id, "simfast", 1, 6, 1)]
    assert len(requests) == 6 and {r[0] for r in requests} == {run_id}
    assert all(r[2] == "ok" and r[3] > 0 for r in requests)
    assert len({r[1] for r in requests}) == 6  # warm-up requests are not stored
    assert probe_runs == 0  # bench requests never land in the probe runs table


async def test_no_store_and_no_config_store_nothing(tmp_path, sim):
    db = tmp_path / "tw.db"
    cfg = _config(tmp_path, sim, f"  sqlite_path: {db}")
    code, err = await _bench("-c", cfg, "--endpoint", "simfast", "--number", "2", "--no-store",
                             "--output-dir", str(tmp_path / "a"))  # fmt: skip
    assert bench_ran(code, err), err
    assert "stored" not in err and not db.exists()
    code, err = await _bench("--url", f"{sim.base_url('fast')}/v1", "--model", "m", "--number", "2",
                             "--output-dir", str(tmp_path / "b"))  # fmt: skip
    assert bench_ran(code, err) and "stored" not in err and not db.exists()


async def test_store_failure_warns_and_keeps_files_and_exit_code(tmp_path, sim):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    cfg = _config(tmp_path, sim, f"  sqlite_path: {blocker / 'tw.db'}")
    out = tmp_path / "run"
    code, err = await _bench("-c", cfg, "--endpoint", "simfast", "--number", "2",
                             "--slo", "ttft:p99<=0.000001", "--output-dir", str(out))  # fmt: skip
    # the SLO verdict (or a busy host's client timing), not the store failure
    assert code == 1 or (code == 6 and bench_ran(code, err)), err
    assert "warning: run not stored: cannot open SQLite database" in err and "Traceback" not in err
    assert (out / "summary.json").exists()


async def test_postgres_password_never_shown_when_the_store_is_down(tmp_path, sim):
    cfg = _config(tmp_path, sim, "  dsn: postgresql://bench:s3cret-pw-42@127.0.0.1:9/tw\n  write_timeout: 2s")
    code, err = await _bench("-c", cfg, "--endpoint", "simfast", "--number", "2",
                             "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert bench_ran(code, err), err
    assert "warning: run not stored: database postgresql://bench@127.0.0.1:9/tw" in err
    assert "s3cret-pw-42" not in err and "Traceback" not in err


async def test_bad_storage_config_is_a_usage_error_before_anything_is_sent(tmp_path, sim):
    cfg = _config(tmp_path, sim, "  sqlite_pth: x.db")
    code, err = await _bench("-c", cfg, "--endpoint", "simfast", "--number", "2",
                             "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 2 and "sqlite_pth" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
