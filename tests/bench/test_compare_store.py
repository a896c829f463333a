"""`tokwatch bench compare` of stored runs: store vs store and store vs directory give the directory figures,
on SQLite and a real PostgreSQL; unknown ids, ambiguous prefixes, no store and an old schema are exit 2."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.bench.processes import bench_ran, tokwatch_cli
from tokwatch.bench.commands import run_compare
from tokwatch.bench.compare import CompareError
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.outputs import write_run
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.storing import store_outcome
from tokwatch.cli import main
from tokwatch.figures.result import Status
from tokwatch.settings.config import load_config
from tokwatch.sim.testing import RunningSim
from tokwatch.storage.schema import known_version

T0 = 1_790_000_000.0


def _records(seed: int, gap_ms: float, n: int = 60) -> list[RequestRecord]:
    """n measured requests in shuffled (completion) order, plus a warm-up and a failure to be left out."""
    rng = random.Random(seed)
    out = []
    for i in range(n + 2):
        sent = 0.05 * i
        r = RequestRecord(i, "chat", warmup=i == 0, sent_at_s=sent, started_at_s=sent, dispatched_at_s=sent)
        if i == 1:
            r.status, r.error_class, r.completed_at_s = Status.PROVIDER_ERROR, "http_5xx", sent + 0.01
        else:
            tokens = rng.choice((1, 8, 16))  # one-token answers: no gaps, no TPOT
            r.ttft_s = rng.gauss(0.1, 0.01)
            r.tbt_s = [max(1e-4, rng.gauss(gap_ms, gap_ms * 0.1)) / 1e3 for _ in range(tokens - 1)]
            r.e2e_s = r.ttft_s + sum(r.tbt_s)
            r.tpot_s = sum(r.tbt_s) / (tokens - 1) if tokens > 1 else None
            r.decode_tokens_per_s = 1 / r.tpot_s if r.tpot_s else None
            r.output_tokens, r.think_tokens, r.prompt_tokens = tokens, 0, 50
            r.fluidity_index = rng.uniform(0.8, 1.0)
            r.completed_at_s = sent + r.e2e_s
        out.append(r)
    rng.shuffle(out)  # files are in completion order, the store reads by request id
    return out


def _save(
    tmp_path: Path,
    config: Path,
    name: str,
    seed: int,
    gap_ms: float,
    run_id: str | None = None,
    load: dict[str, Any] | None = None,
) -> tuple[Path, str]:
    """One run as `tokwatch bench --config` leaves it: a result directory and the stored run."""
    options = {"target": "http://127.0.0.1:9/v1", "model": "m", "kind": "openai", "load": "closed loop 2"}
    outcome = BenchOutcome(
        options={**options, **(load or {"concurrency": 2})},
        records=_records(seed, gap_ms),
        started_at_unix=T0 + seed,
        wall_s=4.0,
        complete=True,
        stop_reason="finished",
    )
    if run_id is not None:
        outcome.run_id = run_id
    out = tmp_path / name
    write_run(outcome, out, plots_enabled=False)
    line = asyncio.run(store_outcome(outcome, load_config(config)))
    assert line.startswith(f"stored: bench run {outcome.run_id} (61 requests)")
    return out, outcome.run_id


@pytest.fixture(params=["sqlite", "postgres"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A tokwatch.yml whose store is a SQLite file or a database on the session's PostgreSQL."""
    if request.param == "sqlite":
        storage = f"  sqlite_path: {tmp_path / 'state' / 'tw.db'}"
    else:
        storage = f"  dsn: {request.getfixturevalue('pg_dsn')}"
    path = tmp_path / "tokwatch.yml"
    path.write_text(f"storage:\n{storage}\n")
    return path


def _compare(a: str, b: str, config: Path | None = None) -> tuple[int, dict[str, Any]]:
    code, text = run_compare(
        a, b, threshold=0.05, gate=["ttft:p50", "tpot:p50", "tbt:p99"], resamples=200, seed=0, as_json=True,
        config=str(config) if config else None,
    )  # fmt: skip
    return code, json.loads(text)


def test_stored_runs_compare_exactly_as_their_directories(tmp_path: Path, config: Path) -> None:
    dir_a, id_a = _save(tmp_path, config, "a", seed=1, gap_ms=20)
    dir_b, id_b = _save(tmp_path, config, "b", seed=2, gap_ms=30)  # slower decode: B is worse
    code, from_dirs = _compare(str(dir_a), str(dir_b))
    assert code == 1 and {"tpot:p50", "tbt:p99"} <= set(from_dirs["regressions"])
    assert "ttft:p50" not in from_dirs["regressions"]
    rows = from_dirs["rows"]
    assert all(r["a"] is not None and r["a_ci"] is not None for r in rows)  # every figure, intervals too
    for a, b in ((id_a, id_b), (f"store:{id_a[:6]}", str(dir_b)), (str(dir_a), id_b[:10])):
        code, doc = _compare(a, b, config)
        assert code == 1, (a, b)
        assert doc["rows"] == rows  # same values, same bootstrap intervals, same verdicts
        assert doc["regressions"] == from_dirs["regressions"]
        assert doc["a"]["requests"] == doc["b"]["requests"] == 60 and doc["a"]["missing"] == []
        for side in "ab":
            assert doc[side]["generated_tokens_per_s"] == from_dirs[side]["generated_tokens_per_s"]
    _, doc = _compare(id_a, str(dir_b), config)
    assert doc["a"]["name"] == f"store:{id_a}" and doc["b"]["name"] == "b"
    code, same = _compare(id_a, id_a, config)
    assert code == 0 and same["regressions"] == []


def test_stored_runs_under_different_loads_are_refused(tmp_path: Path, config: Path) -> None:
    _, closed = _save(tmp_path, config, "a", seed=1, gap_ms=20)
    opened, _ = _save(tmp_path, config, "b", seed=2, gap_ms=20, load={"rate": 3.0, "arrivals": "poisson"})
    with pytest.raises(CompareError, match="A closed loop, concurrency 2, B open loop 3/s poisson"):
        _compare(closed, str(opened), config)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["bench", "compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_store_table_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "tw.db"
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(f"storage:\n  sqlite_path: {db}\n")
    missing_cfg = tmp_path / "none.yml"
    missing_cfg.write_text(f"storage:\n  sqlite_path: {tmp_path / 'never.db'}\n")
    code, _, err = _cli(capsys, "abc", "def", "-c", str(missing_cfg))
    assert code == 2 and "no store at" in err and "Traceback" not in err
    assert not (tmp_path / "never.db").exists()  # reading never creates a database

    # Ids as `tokwatch bench` makes them (uuid4 hex), sharing their first two characters.
    _, id_a = _save(tmp_path, cfg, "a", seed=1, gap_ms=20, run_id="ab1" + uuid.uuid4().hex[3:])
    _, id_b = _save(tmp_path, cfg, "b", seed=2, gap_ms=30, run_id="ab2" + uuid.uuid4().hex[3:])
    code, out, err = _cli(capsys, id_a, id_b, "-c", str(cfg), "--gate", "tpot:p50")
    assert code == 1, err
    assert f"A: store:{id_a} (60 requests)" in out and "B is worse than A on tpot p50" in out
    assert "| tbt | p99 |" in out and "generated throughput: A" in out

    cases = [
        (["feedface", id_b, "-c", str(cfg)], "no stored bench run with id 'feedface'"),
        (["ab", id_b, "-c", str(cfg)], f"run id prefix 'ab' is ambiguous in sqlite {db}: {id_a}, {id_b};"),
        (["store:", id_b, "-c", str(cfg)], "give a stored run id"),
        ([f"store:{id_a}", id_b], "a stored run needs --config"),
        ([id_a, id_b], "a stored run id needs --config"),
        ([id_a, id_b, "-c", str(tmp_path / "absent.yml")], "absent.yml"),
    ]
    for argv, message in cases:
        code, _, err = _cli(capsys, *argv)
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)
    # A directory wins over a stored id of the same spelling; store: says the store.
    (tmp_path / "ab1").mkdir()
    code, _, err = _cli(capsys, str(tmp_path / "ab1"), id_b, "-c", str(cfg))
    assert code == 2 and "ab1/request_level_metrics.jsonl: not found" in err
    code, _, err = _cli(capsys, "store:ab1", id_b, "-c", str(cfg))
    assert code == 1, err

    # A run stored before the gap lists were: its other figures compare, the note says what is missing.
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE bench_requests SET tbt_s = NULL, normalized_latency_s = NULL, decode_tokens_per_s = NULL "
            "WHERE bench_run_id = ?",
            (id_a,),
        )
    code, out, err = _cli(capsys, id_a, id_b, "-c", str(cfg), "--gate", "tpot:p50")
    assert code == 1, err
    assert f"A store:{id_a}: tbt, normalized_latency, decode_tokens_per_s not stored" in out
    code, _, err = _cli(capsys, id_a, id_b, "-c", str(cfg), "--gate", "tbt:p99")
    assert code == 2 and "gated figure tbt not stored for this run" in err

    # A database at an older schema is not migrated by compare.
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM tokwatch_schema WHERE version = ?", (known_version("sqlite"),))
    code, _, err = _cli(capsys, id_a, id_b, "-c", str(cfg))
    assert code == 2 and f"older than this tokwatch's {known_version('sqlite')}" in err
    assert "tokwatch db migrate" in err
    with sqlite3.connect(db) as conn:
        latest = conn.execute("SELECT max(version) FROM tokwatch_schema").fetchone()
    assert latest == (known_version("sqlite") - 1,)


def test_disabled_storage_and_down_postgres_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    off = tmp_path / "off.yml"
    off.write_text("storage:\n  enabled: false\n")
    code, _, err = _cli(capsys, "abc", "def", "-c", str(off))
    assert code == 2 and "storage.enabled is false" in err
    down = tmp_path / "down.yml"
    down.write_text("storage:\n  dsn: postgresql://u:s3cret-pw@127.0.0.1:9/tw\n  write_timeout: 1s\n")
    code, _, err = _cli(capsys, "abc", "def", "-c", str(down))
    assert code == 2 and "postgresql://u@127.0.0.1:9/tw" in err
    assert "s3cret-pw" not in err and "Traceback" not in err


SIM = """
servers:
  - name: fast
    dialect: openai
    models:
      - {name: m, decode_tps: 2000, prefill_tps: 100000}
  - name: slow
    dialect: openai
    models:
      - {name: m, decode_tps: 200, prefill_tps: 100000}
"""


@pytest.mark.slow
async def test_real_bench_runs_compare_from_the_store(sim: RunningSim, tmp_path: Path) -> None:
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(
        "endpoints:\n"
        + "".join(
            f"  - {{name: {n}, kind: openai, base_url: '{sim.base_url(n)}/v1', model: m}}\n"
            for n in ("fast", "slow")
        )
        + f"storage:\n  sqlite_path: {tmp_path / 'tw.db'}\n"
    )
    ids = []
    for name in ("fast", "slow"):
        code, _, err = await tokwatch_cli(
            "bench", "-c", str(cfg), "--endpoint", name, "--number", "12", "--concurrency", "2",
            "--output-tokens", "8", "--input-tokens", "16", "--no-server-metrics",
            "--live-interval", "60", "--output-dir", str(tmp_path / name),
        )  # fmt: skip
        assert bench_ran(code, err), err
        ids.append(json.loads((tmp_path / name / "summary.json").read_text())["run_id"])
    gate = ("--gate", "tpot:p50", "--format", "json")
    fast, slow = str(tmp_path / "fast"), str(tmp_path / "slow")
    code, out, err = await tokwatch_cli("bench", "compare", fast, slow, *gate)
    assert code == 1, err
    from_dirs = json.loads(out)
    assert from_dirs["regressions"] == ["tpot:p50"]  # 200 vs 2000 tok/s decode
    for a, b in ((ids[0], ids[1]), (f"store:{ids[0][:8]}", slow)):
        code, out, err = await tokwatch_cli("bench", "compare", a, b, "-c", str(cfg), *gate)
        assert code == 1, err
        doc = json.loads(out)
        assert doc["rows"] == from_dirs["rows"] and doc["regressions"] == ["tpot:p50"]
        assert doc["a"]["requests"] == doc["b"]["requests"] == 12
