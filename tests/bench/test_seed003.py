"""Seed 003 (evalscope perf) habits: named datasets in their published formats, paired --number/--parallel
rungs, the Performance Overview / Per-Request / Workload Throughput tables, workload_*.json."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rich.console import Console

from tests.bench.processes import bench_ran, sim_process, tokwatch_cli
from tokwatch.bench.commands import add_commands, rung_options_from_args
from tokwatch.bench.config import build_options
from tokwatch.bench.named_datasets import CACHE_ENV, named_loader, resolve_path
from tokwatch.bench.rungs import paired_rungs
from tokwatch.bench.session import run_bench
from tokwatch.bench.workload import WorkloadError
from tokwatch.bench.workload_throughput import workload_throughput
from tokwatch.figures.tokens import CharEstimate
from tokwatch.settings.strict_yaml import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets"
SIM = """listen: 127.0.0.1:{port}
servers:
  - name: oa
    dialect: openai
    models: [{{name: m, decode_tps: 800, prefill_tps: 40000}}]
  - name: vl
    dialect: vllm
    models: [{{name: m, decode_tps: 800, prefill_tps: 40000}}]
"""


def _loader(name: str, **kw):
    settings = {"multi_turn_args": {}, "min_turns": 1, "max_turns": None, "seed": 0, "counter": None,
                "number": None, **kw}  # fmt: skip
    return named_loader(name, **settings)


# --- loaders --------------------------------------------------------------------------------------------


def test_trie_trace_becomes_num_turns_plus_one_turns() -> None:
    entries = _loader("trie_agentic_coding")(DATA / "trie_agentic.jsonl", 0)
    first = entries[0].trace
    assert first is not None and len(first) == 3  # num_turns 2 + the final reply
    # turn 0: the initial prompt, capped by assistant_response_length[0]; the wait after it is latency[0]
    assert [(t.prompt_tokens, t.output_tokens, t.wait_s) for t in first] == [
        (60, 6, 0.05), (20, 4, 0.02), (12, 8, 0.0),
    ]  # fmt: skip
    assert entries[1].trace is not None and len(entries[1].trace) == 1  # num_turns 0: the final reply only


def test_trie_trace_errors_name_the_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text(
        '{"input_prompt_length": 5, "num_turns": 2, "assistant_response_length": [1], '
        '"tool_call_output_length": [1, 1], "tool_call_latency": [0, 0], '
        '"final_assistant_response_length": 1}\n'
    )
    message = r"t\.jsonl:1: assistant_response_length must be a list of num_turns"
    with pytest.raises(WorkloadError, match=message):
        _loader("trie_code_qa")(bad, 0)


def test_swe_smith_prebuilt_and_raw_trajectories() -> None:
    pre = _loader("swe_smith")(DATA / "swe_smith_agentic_dataset.json", 0)
    assert [len(e.users) for e in pre] == [3, 2]
    assert "Ran 12 tests" in pre[0].users[2]  # a turn's two delta messages are sent as one
    args = {"first_turn_length": 60, "subsequent_turn_length": 40}
    raw = _loader("swe_smith", multi_turn_args=args, min_turns=2, max_turns=3)(
        DATA / "swe_smith_trajectories.jsonl", 0
    )
    counter = CharEstimate()
    assert raw and all(2 <= len(e.users) <= 3 for e in raw)
    for e in raw:
        assert counter.count(e.users[0]) <= 60 and all(counter.count(u) <= 40 for u in e.users[1:])
        assert "OBSERVATION" in "".join(e.users[1:])  # tool outputs are the later turns' content
        assert "Let me look" not in "".join(e.users)  # assistant messages are never sent
    too_long = _loader("swe_smith", multi_turn_args={"first_turn_length": 100000})
    with pytest.raises(WorkloadError, match="no trajectory is long enough"):
        too_long(DATA / "swe_smith_trajectories.jsonl", 0)


def test_swe_smith_reads_the_published_parquet(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [json.loads(x) for x in (DATA / "swe_smith_trajectories.jsonl").read_text().splitlines()]
    path = tmp_path / "tool-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    args = {"first_turn_length": 60, "subsequent_turn_length": 40}
    from_parquet = _loader("swe_smith", multi_turn_args=args, min_turns=2)(path, 0)
    jsonl = DATA / "swe_smith_trajectories.jsonl"
    from_jsonl = _loader("swe_smith", multi_turn_args=args, min_turns=2)(jsonl, 0)
    assert [e.users for e in from_parquet] == [e.users for e in from_jsonl]


def test_math_500_and_missing_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _loader("math_500")(DATA / "math_500.jsonl", 0)
    assert rows[0].users[0].startswith("Convert the point $(0,3)$") and len(rows) == 2
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(WorkloadError, match=r"trie_office_work: no local file: .*office_work_8k\.jsonl"):
        resolve_path("trie_office_work", None)
    (tmp_path / "office_work_8k.jsonl").write_text((DATA / "trie_agentic.jsonl").read_text())
    assert resolve_path("trie_office_work", None) == tmp_path / "office_work_8k.jsonl"  # the local cache


def test_multi_turn_args_and_dataset_path_are_checked() -> None:
    base = {"url": "http://127.0.0.1:1/v1", "model": "m"}
    with pytest.raises(ConfigError, match="multi_turn_args: unknown key 'first_turn'"):
        build_options({**base, "dataset": "swe_smith", "multi_turn_args": '{"first_turn": 5}'})
    with pytest.raises(ConfigError, match="dataset_path goes with a named dataset"):
        build_options({**base, "dataset": "x.jsonl", "dataset_path": "y.jsonl"})
    opts = build_options({**base, "dataset": "random_multi_turn", "multi_turn": True, "max_turns": 2})
    assert opts.dataset == "random-multi-turn"  # evalscope's spelling


def test_paired_rungs() -> None:
    assert paired_rungs({"number": [10, 20], "parallel": [5, 10]}) == [
        {"number": 10, "parallel": 5}, {"number": 20, "parallel": 10},
    ]  # fmt: skip
    assert paired_rungs({"number": [10]}) == [{"number": 10}]
    assert paired_rungs({}) == [{}]
    with pytest.raises(ConfigError, match="--number has 2 values and --parallel 1"):
        paired_rungs({"number": [10, 20], "parallel": [5]})


def test_rungs_from_flags_and_from_a_bench_file(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    target = ["--url", "http://127.0.0.1:1/v1", "--model", "m"]
    args = parser.parse_args(["bench", *target, "--number", "10", "20", "--parallel", "5", "10"])
    assert [(o.number, o.parallel) for o in rung_options_from_args(args)] == [(10, 5), (20, 10)]
    bench = tmp_path / "bench.yml"
    bench.write_text("url: http://127.0.0.1:1/v1\nmodel: m\nnumber: [4, 8, 16]\nparallel: [1, 2, 4]\n")
    args = parser.parse_args(["bench", "--bench-file", str(bench)])
    assert [(o.number, o.parallel) for o in rung_options_from_args(args)] == [(4, 1), (8, 2), (16, 4)]
    args = parser.parse_args(["bench", "--bench-file", str(bench), "--number", "7"])  # flags win
    with pytest.raises(ConfigError, match="--number has 1 value and --parallel 3"):
        rung_options_from_args(args)


def test_workload_throughput_windows(make_record) -> None:
    # 40 requests, one completing each second, 100 prompt tokens of which 30 cached, 11 generated
    records = [make_record(i, sent=float(i), cached_tokens=30) for i in range(40)]
    wt = workload_throughput(records)
    rows = {r["metric"]: r for r in wt["rows"]}
    assert wt["n_samples"] == 40 and wt["last_window_s"] == 30.0 and wt["warmup_frac"] == 0.2
    assert wt["schema_version"] == 1
    end = records[-1].completed_at_s
    assert end is not None and wt["wall_time_s"] == pytest.approx(end, abs=1e-4)
    assert rows["Total Prompt tok/s"]["overall"] == pytest.approx(4000 / end)
    assert rows["Cached Prompt tok/s"]["overall"] == pytest.approx(1200 / end)
    assert rows["New Prompt tok/s"]["overall"] == pytest.approx(2800 / end)
    # the tail window: from the latest completion at or before wall - 30 s to the last one, 30 requests
    assert rows["Completion tok/s"]["last_window"] == pytest.approx(30 * 11 / 30.0)
    total = rows["Total Prompt tok/s"]
    parts = rows["New Prompt tok/s"]["overall"] + rows["Cached Prompt tok/s"]["overall"]
    assert total["overall"] == pytest.approx(parts)
    assert total["steady_state"] > 0


# --- against the simulator ----------------------------------------------------------------------------------


@pytest.fixture
async def sim_root(tmp_path: Path) -> AsyncIterator[str]:
    """`python -m tokwatch sim`: oa (OpenAI dialect, prefix cache, cached_tokens) and vl (vLLM dialect)."""
    async with sim_process(tmp_path, SIM) as (_, port):
        yield f"http://127.0.0.1:{port}"


async def test_trie_replay_against_the_simulator(sim_root: str, tmp_path: Path) -> None:
    opts = build_options({
        "url": f"{sim_root}/vl/v1", "kind": "vllm", "model": "m", "dataset": "trie_office_work",
        "dataset_path": str(DATA / "trie_agentic.jsonl"), "multi_turn": True, "parallel": 2, "number": 3,
        "plots": False, "live_interval": 60, "server_metrics": False, "repeat_prompts": True,
    })  # fmt: skip
    _, out = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "trie")
    lines = [json.loads(x) for x in (out / "request_level_metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3 + 1 + 2 and all(r["status"] == "ok" for r in lines)
    by_conv: dict[int, list[dict]] = {}
    for r in lines:
        by_conv.setdefault(r["conversation_id"], []).append(r)
    first = sorted(by_conv[0], key=lambda r: r["turn"])
    # the recorded reply lengths are requested with fixed output and honoured by the server
    assert [r["max_tokens"] for r in first] == [6, 4, 8] == [r["output_tokens"] for r in first]
    assert first[0]["prompt_tokens_target"] == 60  # the recorded initial prompt, synthesised to its length
    assert [r["wait_before_s"] for r in first[1:]] == pytest.approx([0.05, 0.02])
    assert first[1]["sent_at_s"] - first[0]["completed_at_s"] >= 0.05
    timeline = json.loads((out / "workload_timeline.json").read_text())
    assert len(timeline["points"]) == 6 and timeline["wall_start"] > 1e9
    cum = [p["cum_completion"] for p in timeline["points"]]
    assert cum == sorted(cum) and cum[-1] == sum(r["output_tokens"] for r in lines)
    assert timeline["points"][-1]["cum_cached_prompt"] == 0  # the vLLM dialect reports no cached tokens


async def test_rungs_tables_and_cached_rows_from_the_command_line(sim_root: str, tmp_path: Path) -> None:
    out = tmp_path / "ladder"
    code, _, err = await tokwatch_cli(
        "bench", "--url", f"{sim_root}/oa/v1", "--model", "m", "--dataset", "swe_smith",
        "--dataset-path", str(DATA / "swe_smith_agentic_dataset.json"), "--multi-turn",
        "--number", "2", "4", "--parallel", "1", "2", "--output-tokens", "6", "--output-dir", str(out),
        "--no-server-metrics", "--live-interval", "60",
    )  # fmt: skip
    assert bench_ran(code, err), err
    assert sorted(p.name for p in out.iterdir()) == ["parallel_1_number_2", "parallel_2_number_4"]
    for title in ("Performance Overview", "Per-Request Metrics", "Per-Trace Metrics", "Workload Throughput"):
        assert title in err
    for row in ("Latency (s)", "TTFT (ms)", "TPOT (ms)", "Input Tokens", "Output Tokens", "Turns/Req",
                "Cache Hit (%)", "First-Turn TTFT (ms)", "Subsequent-Turn TTFT (ms)", "Total Prompt tok/s",
                "New Prompt tok/s", "Cached Prompt tok/s", "Completion tok/s", "TTFAT (s)", "Decode TPS",
                "Eligible Cache Hit Rate (%)"):  # fmt: skip
        assert row in err, row
    overview = err[err.index("Performance Overview") : err.index("Per-Request Metrics")]
    lines = [line for line in overview.splitlines() if line.count("│") == 7]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines]
    assert [c[:3] for c in cells] == [["1", "-", "2"], ["2", "-", "4"]]
    assert all(c[5] == "100.0%" for c in cells)
    for rung, row in zip(("parallel_1_number_2", "parallel_2_number_4"), cells, strict=True):
        overall = json.loads((out / rung / "throughput.json").read_text())["overall"]
        assert row[3] == f"{overall['requests_per_s']:.2f}"
        assert row[4] == f"{overall['generated_tokens_per_s']:.2f}"
    # rung 2: 4 conversations of 3 and 2 turns; the server's prefix cache answers their history
    wt = json.loads((out / "parallel_2_number_4" / "workload_throughput.json").read_text())
    rows = {r["metric"]: r for r in wt["rows"]}
    assert wt["n_samples"] == 10
    assert rows["Cached Prompt tok/s"]["overall"] > 0
    summary = json.loads((out / "parallel_2_number_4" / "summary.json").read_text())
    prompt, cached = summary["prompt_cache"]["prompt_tokens"], summary["prompt_cache"]["cached_tokens"]
    assert cached > 0
    assert rows["Cached Prompt tok/s"]["overall"] / rows["Total Prompt tok/s"]["overall"] == pytest.approx(
        cached / prompt
    )


async def test_unequal_lists_and_single_turn_math_500(sim_root: str, tmp_path: Path) -> None:
    code, _, err = await tokwatch_cli(
        "bench", "--url", f"{sim_root}/oa/v1", "--model", "m", "--number", "10", "20", "--parallel", "5",
    )  # fmt: skip
    assert code == 2 and err.strip().count("\n") == 0
    assert "--number has 2 values and --parallel 1" in err
    opts = build_options({
        "url": f"{sim_root}/oa/v1", "model": "m", "dataset": "math_500",
        "dataset_path": str(DATA / "math_500.jsonl"),
        "number": 2, "output_tokens": "4", "plots": False, "live_interval": 60, "server_metrics": False,
        "repeat_prompts": True,
    })  # fmt: skip
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "math")
    assert [r.ok for r in outcome.records] == [True, True]
    assert outcome.records[0].prompt_tokens_target == CharEstimate().count(
        json.loads((DATA / "math_500.jsonl").read_text().splitlines()[0])["problem"]
    )


async def test_raw_swe_smith_and_cached_share_gpt_against_the_simulator(
    sim_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {"url": f"{sim_root}/oa/v1", "model": "m", "multi_turn": True, "output_tokens": "4",
            "plots": False, "live_interval": 60, "server_metrics": False, "repeat_prompts": True}  # fmt: skip
    opts = build_options({
        **base, "dataset": "swe_smith", "dataset_path": str(DATA / "swe_smith_trajectories.jsonl"),
        "multi_turn_args": '{"first_turn_length": 60, "subsequent_turn_length": 40}', "min_turns": 2,
        "max_turns": 3, "number": 3, "parallel": 3,
    })  # fmt: skip
    outcome, out = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "swe")
    assert all(r.ok for r in outcome.records)
    turns = {r.conversation_id: r.conversation_turns for r in outcome.records}
    assert len(turns) == 3 and all(t is not None and 2 <= t <= 3 for t in turns.values())
    # turn 1 carries at most first_turn_length tokens of trajectory text (4 characters per token here)
    assert all(r.prompt_tokens_target is not None and r.prompt_tokens_target <= 60 for r in outcome.records
               if r.turn == 0)  # fmt: skip
    assert (out / "workload_throughput.json").exists()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "ShareGPT_V3_unfiltered_cleaned_split.json").write_text(
        (DATA / "sharegpt.json").read_text()
    )
    opts = build_options({**base, "dataset": "share_gpt", "number": 2, "parallel": 1})
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "sharegpt")
    assert outcome.records and all(r.ok for r in outcome.records)
    assert outcome.records[0].prompt_tokens_target == CharEstimate().count("What is a prefix cache?")
