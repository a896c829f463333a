"""Seed 002 (Veeksha) compatibility against the simulator: its bench files as written, its `metrics/` files,
its live line and its health checks (intra-session arrival, prompt length, lifecycle delays)."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import re
from pathlib import Path
from typing import Annotated, Literal, Union

import pytest
from pydantic import Discriminator, Tag, TypeAdapter
from rich.console import Console

from tests.bench.processes import bench_ran
from tokwatch.bench.commands import add_commands
from tokwatch.bench.config import build_options, load_bench_file
from tokwatch.bench.evaluators import EVALUATOR_TYPES, PerformanceEvaluator, _evaluator_type, _tags
from tokwatch.bench.health import _intra_session_arrival, _lifecycle
from tokwatch.bench.outcome import ExitCode
from tokwatch.bench.session import run_bench
from tokwatch.settings.strict_yaml import StrictModel

DATA = Path(__file__).resolve().parents[1] / "data" / "veeksha"
# Every field the seed lists for a request_level_metrics.jsonl line.
SEED_FIELDS = {
    "request_id", "session_id", "session_total_requests", "scheduler_ready_at", "scheduler_dispatched_at",
    "client_picked_up_at", "client_completed_at", "result_processed_at", "num_delta_prompt_tokens",
    "num_total_prompt_tokens", "target_num_delta_prompt_tokens", "num_output_tokens",
    "num_requested_output_tokens", "num_total_tokens", "is_stream", "tpot", "ttfc", "end_to_end_latency",
    "normalized_end_to_end_latency", "output_throughput", "tbc",
}  # fmt: skip
SEED_LINE = re.compile(
    r"^\[\d+\.\ds\] Completed: \d+ \| TTFC p99: (\d+ms|-) \| TBC p99: (\d+ms|-) \| Throughput: \d+ tok/s$"
)
# `exact` and `templated` count one token per common word, as the simulator and a real tokenizer do for the
# bench's prompts; `longer` counts 1.3 per word, as a tokenizer that splits the bench's words would.
SIM = """
servers:
  - name: exact
    dialect: openai
    models:
      - {name: m, decode_tps: 400, prefill_tps: 100000}
  - name: templated
    dialect: openai
    chat_template_tokens: 30
    models:
      - {name: m, decode_tps: 4000, prefill_tps: 100000}
  - name: longer
    dialect: openai
    prompt_token_scale: 1.3
    models:
      - {name: m, decode_tps: 4000, prefill_tps: 100000}
"""


def _cmd(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *argv])
    return int(args.func(args))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_seeds_evaluators_file_runs_as_written(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = _cmd(["--bench-file", str(DATA / "evaluators.yml"), "--url", f"{sim_url}/oa/v1", "--model", "m",
                 "--number", "20", "--concurrency", "2", "--output-dir", str(out),
                 "--no-server-metrics"])  # fmt: skip
    assert bench_ran(code, (out / "health_checks.txt").read_text())
    metrics = out / "metrics"
    # tokwatch's own files stay; the seed's are written beside them
    assert (out / "summary.json").is_file() and (out / "health_checks.txt").is_file()
    rows = _jsonl(metrics / "request_level_metrics.jsonl")
    assert len(rows) == 20 and all(set(r) >= SEED_FIELDS for r in rows)
    for r in rows:
        assert r["is_stream"] is True and r["status"] == "ok"
        assert r["num_total_tokens"] == r["num_total_prompt_tokens"] + r["num_output_tokens"]
        assert r["num_output_tokens"] == r["num_requested_output_tokens"] == 128
        assert r["target_num_delta_prompt_tokens"] == 128 and r["session_total_requests"] == 1
        assert r["scheduler_dispatched_at"] <= r["client_picked_up_at"] <= r["client_completed_at"]
        assert r["client_completed_at"] <= r["result_processed_at"]
        assert r["output_throughput"] == pytest.approx(r["num_output_tokens"] / r["end_to_end_latency"])
        assert r["normalized_end_to_end_latency"] == pytest.approx(r["end_to_end_latency"] / 128)
        assert r["tpot"] == pytest.approx((r["end_to_end_latency"] - r["ttfc"]) / 127)
        assert len(r["tbc"]) == 127
    summary = json.loads((metrics / "summary_stats.json").read_text())
    assert summary["Number of Requests"] == summary["Number of Completed Requests"] == 20
    assert summary["Number of Errored Requests"] == 0 and summary["Error Rate"] == 0.0
    assert summary["Observed Session Dispatch Rate"] > 0
    thr = json.loads((metrics / "throughput_metrics.json").read_text())
    tpots = [r["tpot"] for r in rows]
    tbcs = [v for r in rows for v in r["tbc"]]
    assert thr["tpot_based_throughput"] == pytest.approx(1 / (math.fsum(tpots) / len(tpots)))
    assert thr["tbc_based_throughput"] == pytest.approx(1 / (math.fsum(tbcs) / len(tbcs)))
    prefill = json.loads((metrics / "prefill_stats.json").read_text())
    assert prefill["metric"] == "ttfc" and prefill["group_by"] == "target_num_delta_prompt_tokens"
    assert prefill["groups"]["128"]["count"] == 20
    slo = json.loads((metrics / "slo_results.json").read_text())
    assert slo["all_slos_met"] and [r["name"] for r in slo["results"]] == ["P99 TTFC", "P90 TBC"]
    # the seed's names (tokwatch's own slo_results.json says ttft_p99 and tbt_p90)
    keys = [(r["metric"], r["slo_metric_key"]) for r in slo["results"]]
    assert keys == [("ttfc", "ttfc_p99"), ("tbc", "tbc_p90")]
    ttfc_csv = (metrics / "ttfc.csv").read_text().splitlines()
    assert ttfc_csv[0] == "statistic,value" and ttfc_csv[1] == "count,20"
    if importlib.util.find_spec("matplotlib") is not None:  # the plots extra
        assert {p.name for p in metrics.glob("*.png")} >= {"ttfc.png", "tbc.png", "tpot.png", "e2e.png"}
    health = (out / "health_check_results.txt").read_text()
    assert health == (out / "health_checks.txt").read_text()
    # judged (PASS, or WARN on a loaded machine): the two connections of --concurrency 2 set apart
    lifecycle = r"^\[(PASS|WARN)\] lifecycle delays: send delay .* p99 [0-9.]+ ms \(limit 5 ms\); connect "
    assert re.search(lifecycle + r"time .* over 2 requests that opened a connection", health, re.M)
    # the simulator counts one token per common word, as a real tokenizer does: the prompts are as asked
    assert re.search(r"^\[PASS\] prompt length: .* median 1\.00 over 20 requests", health, re.M)


def test_the_seeds_slo_list_runs_as_written(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = _cmd(["--bench-file", str(DATA / "slo_definitions.yml"), "--url", f"{sim_url}/oa/v1", "--model",
                 "m", "--number", "4", "--output-dir", str(out), "--no-server-metrics"])  # fmt: skip
    assert bench_ran(code, (out / "health_checks.txt").read_text())
    slo = json.loads((out / "slo_results.json").read_text())
    assert [r["name"] for r in slo["results"]] == ["P99 TTFC under 500ms"] and slo["all_slos_met"]
    assert not (out / "metrics").exists()  # no performance evaluator: tokwatch's files only


def test_an_unknown_evaluator_type_is_one_line_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = tmp_path / "bench.yml"
    bench.write_text("evaluators:\n  - type: performance\n  - type: accuracy_helm\n    tasks: [x]\n")
    code = _cmd(["--bench-file", str(bench), "--url", "http://127.0.0.1:9/v1", "--model", "m"])
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.USAGE
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{bench}:3: evaluators[1].type: unknown evaluator type 'accuracy_helm'" in err
    bench.write_text("evaluators:\n  - type: performance\n    stream_metrics_interval: 0\n")
    assert _cmd(["--bench-file", str(bench), "--url", "http://127.0.0.1:9/v1", "--model", "m"]) == 2
    assert f"{bench}:3: evaluators[0].stream_metrics_interval:" in capsys.readouterr().err
    bench.write_text(
        "evaluators:\n  - type: performance\n    slos:\n      - {metric: ttfx, percentile: 0.9, value: 1}\n"
    )
    assert _cmd(["--bench-file", str(bench), "--url", "http://127.0.0.1:9/v1", "--model", "m"]) == 2
    assert f"{bench}:4: evaluators[0].slos[0]: unknown SLO metric 'ttfx'" in capsys.readouterr().err


async def _seed_run(tmp_path: Path, url: str, name: str, stream_metrics: bool) -> str:
    values, doc = load_bench_file(DATA / "streaming_metrics.yml")
    # The seed's file, its interval shortened so that a short run prints several lines.
    values["evaluators"][0]["stream_metrics"] = stream_metrics
    values["evaluators"][0]["stream_metrics_interval"] = 0.2
    values.update(url=url, model="m", number=12, output_tokens="128", plots=False, server_metrics=False)
    opts = build_options(values, source="streaming_metrics.yml", doc=doc)
    text = io.StringIO()
    outcome, _ = await run_bench(opts, console=Console(file=text, width=200), out_dir=tmp_path / name)
    assert outcome.complete and all(r.ok for r in outcome.records)
    return text.getvalue()


@pytest.mark.slow
async def test_stream_metrics_print_the_seeds_live_line(start_sim, tmp_path: Path) -> None:
    sim = await start_sim(SIM)
    printed = await _seed_run(tmp_path, f"{sim.url}/exact/v1", "on", stream_metrics=True)
    lines = [line for line in printed.splitlines() if line.startswith("[")]
    assert len(lines) >= 2 and all(SEED_LINE.match(line) for line in lines), printed
    assert "Completed: 0" not in lines[-1]
    quiet = await _seed_run(tmp_path, f"{sim.url}/exact/v1", "off", stream_metrics=False)
    assert not [line for line in quiet.splitlines() if line.startswith("[")]


async def _prompt_check(tmp_path: Path, url: str, name: str) -> str:
    opts = build_options({"url": url, "model": "m", "number": 8, "output_tokens": "4", "plots": False,
                          "server_metrics": False, "live_interval": 60})  # fmt: skip
    outcome, out = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / name)
    assert outcome.complete
    (line,) = [x for x in (out / "health_checks.txt").read_text().splitlines() if "prompt length" in x]
    return line


async def test_prompt_length_fails_a_1_3x_mismatch_at_the_default_length(start_sim, tmp_path: Path) -> None:
    sim = await start_sim(SIM)
    # a server that counts the default 128-token prompts as 1.3 x 128: the prompts are not the length asked
    longer = await _prompt_check(tmp_path, f"{sim.url}/longer/v1", "longer")
    assert longer.startswith("[FAIL] prompt length:") and "median 1.30" in longer
    # a 30-token chat template on correct prompts (1.23 x) is still taken for the template
    templated = await _prompt_check(tmp_path, f"{sim.url}/templated/v1", "templated")
    assert templated.startswith("[PASS] prompt length:") and "excess of 30 tokens" in templated
    exact = await _prompt_check(tmp_path, f"{sim.url}/exact/v1", "exact")
    assert exact.startswith("[PASS] prompt length:") and "median 1.00" in exact


async def test_intra_session_arrival_against_the_simulator(start_sim, tmp_path: Path, make_record) -> None:
    sim = await start_sim(SIM)
    opts = build_options({
        "url": f"{sim.url}/exact/v1", "model": "m", "dataset": "random-multi-turn", "multi_turn": True,
        "min_turns": 3, "max_turns": 3, "input_tokens": "40", "output_tokens": "8", "parallel": 2,
        "number": 3, "plots": False, "live_interval": 60, "server_metrics": False,
    })  # fmt: skip
    outcome, out = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "conv")
    health = (out / "health_checks.txt").read_text()
    assert "[PASS] intra-session arrival: 6/6 follow-up turns in 3 conversations" in health
    # the same records with one follow-up turn released before its previous turn completed
    records = outcome.measured
    later = next(r for r in records if r.turn == 1)
    first = next(r for r in records if r.conversation_id == later.conversation_id and r.turn == 0)
    assert first.completed_at_s is not None
    later.dispatched_at_s = first.completed_at_s - 0.01
    (check,) = _intra_session_arrival(records)
    assert check.verdict == "FAIL" and check.detail.startswith("5/6 follow-up turns")


def test_lifecycle_judges_send_delay_and_connect_time(make_record) -> None:
    def records(send_delay: float, connect: float | None) -> list:
        out = []
        for i in range(20):
            r = make_record(i)
            r.connect_time_s = connect if i == 0 else None
            r.started_at_s = r.sent_at_s - send_delay - (r.connect_time_s or 0.0)  # set-up is inside it
            out.append(r)
        return out

    (ok,) = _lifecycle(records(0.001, 0.002))
    assert ok.verdict == "PASS" and "over 1 request that opened a connection" in ok.detail
    (slow_send,) = _lifecycle(records(0.02, None))
    assert slow_send.verdict == "WARN" and "p99 20.00 ms (limit 5 ms)" in slow_send.detail
    assert "every request reused an open connection" in slow_send.detail
    # a slow connection set-up is judged on its own, and is not counted as the client's send delay
    (slow_connect,) = _lifecycle(records(0.001, 0.5))
    assert slow_connect.verdict == "WARN" and "connect time p50 500.00 ms" in slow_connect.detail


def test_one_more_evaluator_type_is_one_more_union_line() -> None:
    """The shape another evaluator module extends: its tag is known to the errors and its entries validate."""

    class Other(StrictModel):
        type: Literal["other"]
        bootstrap_iters: int = 100

    extended = Annotated[
        Union[  # noqa: UP007 - as in tokwatch.bench.evaluators
            Annotated[PerformanceEvaluator, Tag("performance")],
            Annotated[Other, Tag("other")],
        ],
        Discriminator(_evaluator_type),
    ]
    assert EVALUATOR_TYPES == ("performance", "accuracy_lmeval")
    assert _tags(extended) == ("performance", "other")
    parsed = TypeAdapter(tuple[extended, ...]).validate_python(
        [{"type": "other", "bootstrap_iters": 200}, {"type": "performance", "stream_metrics": True}]
    )
    assert parsed[0] == Other(type="other", bootstrap_iters=200) and parsed[1].stream_metrics is True
