"""dashboards/generate.py: committed JSON matches the generator; --check catches drift and bad metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dashboards import generate
from dashboards.lint import iter_queries, metric_names_in_promql, metric_names_in_template_query

ROOT = Path(__file__).resolve().parents[2]


def _contract_for_everything_queried(path: Path) -> Path:
    """A metrics.md listing every metric the dashboards query, so drift tests do not depend on the lint."""
    names: set[str] = set()
    for text in generate.generate().values():
        for where, expr in iter_queries(json.loads(text)):
            parse = metric_names_in_template_query if where.startswith("variable") else metric_names_in_promql
            names |= parse(expr)
    rows = "\n".join(f"| `{name}` | gauge | | |" for name in sorted(names))
    path.write_text(f"| name | type | labels | meaning |\n|---|---|---|---|\n{rows}\n", encoding="utf-8")
    return path


def test_committed_json_matches_generator() -> None:
    rendered = generate.generate()
    assert set(rendered) == {p.name for p in generate.JSON_DIR.glob("*.json")}
    assert generate.drift(rendered, generate.JSON_DIR) == []


def test_generation_is_deterministic() -> None:
    assert generate.generate() == generate.generate()


def test_check_passes_on_the_repository() -> None:
    """The same command `make dashboards-check` runs: fresh process, script path, real docs/metrics.md."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok: 5 dashboards" in proc.stdout


def test_write_then_check_then_detect_drift_and_stale_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "json"
    doc = str(_contract_for_everything_queried(tmp_path / "metrics.md"))
    assert generate.main(["--out", str(out), "--metrics-doc", doc]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(generate.DASHBOARDS)
    assert generate.main(["--check", "--out", str(out), "--metrics-doc", doc]) == 0

    edited = out / "tokwatch-overview.json"
    model = json.loads(edited.read_text(encoding="utf-8"))
    model["title"] = "hand-edited"
    edited.write_text(json.dumps(model), encoding="utf-8")
    (out / "old-dashboard.json").write_text("{}", encoding="utf-8")
    (out / "tokwatch-health.json").unlink()
    capsys.readouterr()

    assert generate.main(["--check", "--out", str(out), "--metrics-doc", doc]) == 1
    err = capsys.readouterr().err
    assert f"{edited}: differs from the generator output" in err
    assert "old-dashboard.json: not produced by the generator (stale file)" in err
    assert "tokwatch-health.json: missing" in err
    assert "unknown metric" not in err


def test_check_fails_when_a_queried_metric_is_not_in_the_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = ROOT / "docs" / "metrics.md"
    lines = doc.read_text(encoding="utf-8").splitlines()
    trimmed = tmp_path / "metrics.md"
    trimmed.write_text(
        "\n".join(line for line in lines if "`tokwatch_probe_success`" not in line), encoding="utf-8"
    )
    assert generate.main(["--check", "--metrics-doc", str(trimmed)]) == 1
    err = capsys.readouterr().err
    assert "tokwatch-overview: panel" in err
    assert "queries unknown metric 'tokwatch_probe_success'" in err


def test_check_against_a_saved_scrape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scrape = tmp_path / "metrics.txt"
    scrape.write_text('tokwatch_probe_success{endpoint="a"} 1\n', encoding="utf-8")
    assert generate.main(["--check", "--metrics-file", str(scrape)]) == 1
    err = capsys.readouterr().err
    assert "unknown metric 'tokwatch_probe_runs_total'" in err
    assert "unknown metric 'tokwatch_probe_success'" not in err


def test_missing_contract_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.md"
    assert generate.main(["--check", "--metrics-doc", str(missing)]) == 2
    assert f"metrics contract {missing} not found" in capsys.readouterr().err
