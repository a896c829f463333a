"""`bench compare` gives a verdict only for runs under the same load: loop, concurrency or rate, arrivals,
token lengths and the share of prompts the server answered from its cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench.test_compare import write_run
from tokwatch.bench.commands import run_compare
from tokwatch.bench.compare import CompareError
from tokwatch.bench.load_shape import differences, shape_of

CLOSED_4 = {"concurrency": 4, "rate": None, "arrivals": "poisson", "input_tokens": "128",
            "output_tokens": "128"}  # fmt: skip
OPEN_3 = {**CLOSED_4, "concurrency": None, "rate": 3.0}


def _summary(options: dict[str, Any], cached: float | None = 0.0) -> dict[str, Any]:
    return {"options": options, "prompt_cache": {"cached_outside_history_share": cached}}


def _dir(root: Path, options: dict[str, Any], cached: float | None = 0.0, ttft_ms: float = 100) -> Path:
    path = write_run(root, ttft_ms, 20)
    (path / "summary.json").write_text(json.dumps(_summary(options, cached)))
    return path


def test_shapes_and_their_differences() -> None:
    closed, opened = shape_of(_summary(CLOSED_4)), shape_of(_summary(OPEN_3))
    assert closed is not None and opened is not None
    assert closed.describe() == "closed loop, concurrency 4"
    assert opened.describe() == "open loop 3/s poisson"
    assert differences(closed, closed) == []
    assert differences(closed, opened) == ["load: A closed loop, concurrency 4, B open loop 3/s poisson"]
    longer = shape_of(_summary({**CLOSED_4, "input_tokens": "1024"}))
    assert longer is not None
    assert differences(closed, longer) == ["prompt tokens (--input-tokens): A 128, B 1024"]
    gamma = shape_of(_summary({**OPEN_3, "arrivals": "gamma", "burstiness": 0.5}))
    assert gamma is not None and gamma.describe() == "open loop 3/s gamma (burstiness 0.5)"
    cached = shape_of(_summary(CLOSED_4, cached=0.96))
    assert cached is not None
    (line,) = differences(closed, cached)
    assert line.startswith("prompt cache: the server answered 0.0% (A) and 96.0% (B)")
    assert differences(closed, shape_of(_summary(CLOSED_4, cached=None))) == []  # not reported: no claim
    assert shape_of({"metrics": {}}) is None


def _compare(a: Path, b: Path, **kw: Any) -> tuple[int, str]:
    return run_compare(str(a), str(b), threshold=0.05, gate=["ttft:p50"], resamples=100, seed=0,
                       as_json=False, **kw)  # fmt: skip


def test_closed_loop_against_open_loop_gets_no_silent_verdict(tmp_path: Path) -> None:
    """Issue 19: closed loop at concurrency 4 against an open-loop Poisson run at 3/s."""
    a, b = _dir(tmp_path / "a", CLOSED_4), _dir(tmp_path / "b", OPEN_3)
    with pytest.raises(CompareError) as refused:
        _compare(a, b)
    message = str(refused.value)
    assert "different loads" in message and "A closed loop, concurrency 4, B open loop 3/s poisson" in message
    assert "--force" in message
    code, text = _compare(a, b, force=True)
    assert code == 0
    assert "THE RUNS DIFFER IN LOAD SHAPE" in text and "closed loop, concurrency 4" in text
    assert "verdict (the load shapes differ, see above):" in text


def test_a_cached_run_against_a_fresh_one_is_refused(tmp_path: Path) -> None:
    """Issue 19: the second same-seed run found its prompts cached; compare called it -95.6 % with `ok`."""
    a = _dir(tmp_path / "a", CLOSED_4, cached=0.0, ttft_ms=343)
    b = _dir(tmp_path / "b", CLOSED_4, cached=0.99, ttft_ms=15)
    with pytest.raises(CompareError, match=r"prompt cache: the server answered 0.0% \(A\) and 99.0% \(B\)"):
        _compare(a, b)
    both = _dir(tmp_path / "c", CLOSED_4, cached=0.99, ttft_ms=15)
    code, text = _compare(b, both)  # alike, so compared, but both said to measure cache hits
    assert code == 0 and "B: 99.0% of the prompt tokens came from the server's cache" in text


def test_cli_refuses_with_exit_2_and_force_compares(tmp_path: Path) -> None:
    a, b = _dir(tmp_path / "a", CLOSED_4), _dir(tmp_path / "b", OPEN_3)

    def cli(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tokwatch", "bench", "compare", str(a), str(b), *extra],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    refused = cli()
    assert refused.returncode == 2 and "different loads" in refused.stderr
    assert "Traceback" not in refused.stderr
    forced = cli("--force", "--format", "json")
    assert forced.returncode == 0, forced.stderr
    doc = json.loads(forced.stdout)
    assert doc["load_shape_differences"] == ["load: A closed loop, concurrency 4, B open loop 3/s poisson"]


def test_a_run_without_summary_is_compared_with_a_note(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", 100, 20)  # an older result directory: figures only
    b = _dir(tmp_path / "b", OPEN_3)
    code, text = _compare(a, b)
    assert code == 0 and "load shape not recorded for a" in text
