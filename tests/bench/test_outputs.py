import csv
import json

from tokwatch.bench.outcome import SCHEMA_VERSION, BenchOutcome
from tokwatch.bench.outputs import default_output_dir, write_run
from tokwatch.bench.slo import parse_slo
from tokwatch.figures.result import Status

FILES = (
    "request_level_metrics.jsonl",
    "summary.json",
    "throughput.json",
    "slo_results.json",
    "prefill_stats.json",
    "report.md",
    "health_checks.txt",
    "ttft.csv",
    "tbt.csv",
    "server_metrics_before.txt",
    "server_metrics_after.txt",
)


def test_run_directory_has_every_file_with_schema_version(tmp_path, make_record):
    records = [make_record(i) for i in range(5)] + [make_record(5, status=Status.PROVIDER_ERROR)]
    records[0].reply_text = "never written"
    outcome = BenchOutcome(
        options={"model": "m", "target": "http://x"},
        records=records,
        started_at_unix=1.0,
        wall_s=6.0,
        complete=False,
        stop_reason="interrupted",
        slos=[parse_slo("ttft:p99<=0.5")],
        metrics_before="a 1\n",
        metrics_after="a 2\n",
    )
    write_run(outcome, tmp_path / "run")
    d = tmp_path / "run"
    for name in FILES:
        assert (d / name).is_file(), name
    lines = (d / "request_level_metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6
    first = json.loads(lines[0])
    assert first["ttft_s"] == 0.1 and first["status"] == "ok" and "reply_text" not in first
    assert json.loads(lines[5])["status"] == "provider_error"
    summary = json.loads((d / "summary.json").read_text())
    assert summary["schema_version"] == SCHEMA_VERSION
    assert summary["complete"] is False
    assert summary["requests"]["errored"] == 1
    slo = json.loads((d / "slo_results.json").read_text())
    assert slo["all_slos_met"] is True and slo["complete"] is False
    assert slo["results"][0]["observed_value"] == 0.1
    rows = dict(csv.reader((d / "ttft.csv").open()))
    assert float(rows["p99"]) == 0.1
    assert "INCOMPLETE" in (d / "report.md").read_text()
    assert "[WARN] errors: 1/6 failed" in (d / "health_checks.txt").read_text()
    assert (d / "ttft.png").is_file()  # matplotlib is installed in the test environment


def test_default_output_dir_is_path_safe():
    p = default_output_dir("org/model:7b", now=0)
    assert str(p) == "bench-results/19700101T000000Z-org_model_7b"
