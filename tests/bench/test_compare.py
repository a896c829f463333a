"""`tokwatch bench compare`: bootstrap intervals, the regression gate, and bad input."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tokwatch.bench.compare import CompareError, compare, load_run, parse_gate, regressions


def write_run(root: Path, ttft_ms: float, tpot_ms: float, n: int = 200, seed: int = 1) -> Path:
    """A result directory with n ok requests (plus a warm-up and a failure that must be ignored)."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    lines = [json.dumps({"status": "ok", "warmup": True, "ttft_s": 9.0, "tpot_s": 9.0, "tbt_s": [9.0]})]
    lines.append(json.dumps({"status": "timeout", "warmup": False, "ttft_s": 9.0}))
    for _ in range(n):
        ttft = rng.gauss(ttft_ms, ttft_ms * 0.1) / 1e3
        tpot = rng.gauss(tpot_ms, tpot_ms * 0.05) / 1e3
        lines.append(
            json.dumps(
                {
                    "status": "ok",
                    "warmup": False,
                    "ttft_s": ttft,
                    "tpot_s": tpot,
                    "e2e_s": ttft + 63 * tpot,
                    "tbt_s": [tpot] * 8,
                    "decode_tokens_per_s": 1 / tpot,
                }
            )
        )
    (root / "request_level_metrics.jsonl").write_text("\n".join(lines) + "\n")
    (root / "throughput.json").write_text(json.dumps({"overall": {"generated_tokens_per_s": 1000 / tpot_ms}}))
    return root


def test_same_distribution_is_not_a_regression(tmp_path: Path) -> None:
    a = load_run(write_run(tmp_path / "a", 100, 20, seed=1))
    b = load_run(write_run(tmp_path / "b", 100, 20, seed=2))
    assert a.count() == 200  # warm-up and failed requests left out
    rows = compare(a, b, threshold=0.05, gate=parse_gate(["ttft:p50", "tpot:p99"]))
    assert regressions(rows) == []
    ttft = next(r for r in rows if (r.figure, r.stat) == ("ttft", "p50"))
    assert ttft.a is not None and ttft.a_ci is not None
    assert ttft.a_ci[0] <= ttft.a <= ttft.a_ci[1] and ttft.a_ci[1] - ttft.a_ci[0] < 0.01  # ~1.4 ms expected


def test_a_slower_run_b_fails_the_gate_on_the_figures_that_got_worse(tmp_path: Path) -> None:
    a = load_run(write_run(tmp_path / "a", 100, 20))
    b = load_run(write_run(tmp_path / "b", 130, 20, seed=3))
    rows = compare(a, b, threshold=0.05, gate=parse_gate(["ttft:p50", "tpot:p50"]))
    assert [(r.figure, r.stat) for r in regressions(rows)] == [("ttft", "p50")]
    faster = compare(b, a, threshold=0.05, gate=parse_gate(["ttft:p50"]))
    assert regressions(faster) == []  # better is never a regression


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", 100, 20)
    b = write_run(tmp_path / "b", 100, 30, seed=4)

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tokwatch", "bench", "compare", *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )

    worse = run(str(a), str(b), "--format", "json")
    assert worse.returncode == 1, worse.stderr
    doc = json.loads(worse.stdout)
    assert "tpot:p50" in doc["regressions"]
    same = run(str(a), str(a), "--threshold", "10%")
    assert same.returncode == 0 and "no gated figure is worse" in same.stdout
    bad = run(str(a), str(tmp_path / "missing"))
    assert bad.returncode == 2 and "request_level_metrics.jsonl: not found" in bad.stderr
    unknown = run(str(a), str(b), "--gate", "ttfb:p50")
    assert unknown.returncode == 2 and "unknown figure 'ttfb'" in unknown.stderr


def test_a_broken_line_is_reported_with_its_number(tmp_path: Path) -> None:
    root = write_run(tmp_path / "a", 100, 20, n=3)
    with (root / "request_level_metrics.jsonl").open("a") as f:
        f.write("{not json\n")
    with pytest.raises(CompareError, match=r"request_level_metrics.jsonl:6: not JSON"):
        load_run(root)
