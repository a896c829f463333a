"""Seed 002's `accuracy_lmeval`: lm-eval-harness tasks sent through the bench's load to the simulator, whose
answer table is the known truth, and scored by lm-eval itself (the `accuracy` extra)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.bench.processes import bench_ran, sim_process, tokwatch_cli, until_served
from tokwatch.bench.accuracy import (
    SHIPPED_TASKS_DIR,
    AccuracyLmevalEvaluator,
    accuracy_evaluator,
    accuracy_flag_values,
    accuracy_limit,
)
from tokwatch.bench.config import build_options, load_bench_file
from tokwatch.bench.lmeval_run import RESULTS_FILE, run_accuracy
from tokwatch.settings.strict_yaml import ConfigError

TASK = "tokwatch_arithmetic"
_OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}


def _items(split: str) -> list[dict[str, str]]:
    path = SHIPPED_TASKS_DIR / TASK / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _truth(question: str) -> str:
    """The answer worked out here from the question, not read from the shipped file."""
    m = re.fullmatch(r"What is (\d+) (plus|minus|times) (\d+)\?", question)
    assert m, question
    return str(_OPS[m[2]](int(m[1]), int(m[3])))


def _answer_table() -> tuple[dict[str, str], float]:
    """The simulator's answers for the shipped test split: 14 right, 3 wrong, 3 missing (those get the
    simulator's random words); and the exact-match score they must give (14/20)."""
    table: dict[str, str] = {}
    for i, item in enumerate(_items("test")):
        right = _truth(item["question"])
        assert item["answer"] == right  # the shipped data is right
        if i < 14:
            table[item["question"]] = f" {right}" if i % 2 else right  # a leading space is ignored
        elif i < 17:
            table[item["question"]] = str(int(right) + 1)
    # The few-shot examples' own questions are in the table too: a few-shot prompt holds them first, and the
    # simulator answers the key found last (the item's own question).
    for item in _items("train"):
        table[item["question"]] = "999999"
    return table, 14 / 20


def _sim_yaml(port: str = "{port}") -> str:
    table, _ = _answer_table()
    answers = "\n".join(f"          {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items())
    listen = f"listen: 127.0.0.1:{port}\n" if port else ""
    return (
        f"{listen}servers:\n  - name: oa\n    dialect: openai\n    models:\n      - name: m\n"
        f"        decode_tps: 2000\n        prefill_tps: 100000\n        answers:\n{answers}\n"
    )


def _mean_stderr(score: float, n: int) -> float:
    """lm-eval's closed-form standard error of a mean of 0/1 scores (sample standard deviation / sqrt n)."""
    return math.sqrt(score * (1 - score) * n / (n - 1) / n)


@pytest.mark.slow  # a tokwatch process importing lm-eval, and a simulator process
async def test_the_cli_sends_the_task_through_the_bench_and_writes_lm_evals_results(tmp_path: Path) -> None:
    _, expected = _answer_table()
    out = tmp_path / "run"
    async with sim_process(tmp_path, _sim_yaml()) as (_, port):
        code, _, err = await tokwatch_cli(
            "bench", "--url", f"http://127.0.0.1:{port}/oa/v1", "--model", "m", "--concurrency", "4",
            "--accuracy-task", TASK, "--bootstrap-iters", "200", "--output-dir", str(out),
            "--no-server-metrics",
            limit_s=240,
        )  # fmt: skip
    assert bench_ran(code, err), err
    doc = json.loads((out / RESULTS_FILE).read_text())
    # lm-eval's own results document
    for key in ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "config"):
        assert key in doc, key
    figures = doc["results"][TASK]
    assert figures["exact_match,remove_whitespace"] == pytest.approx(expected)
    assert figures["exact_match_stderr,remove_whitespace"] == pytest.approx(_mean_stderr(expected, 20))
    assert doc["n-samples"][TASK] == {"original": 20, "effective": 20}
    assert doc["config"]["bootstrap_iters"] == 200
    assert doc["higher_is_better"][TASK] == {"exact_match": True}
    assert doc["tokwatch"]["requests"] == 20 and doc["tokwatch"]["failed_requests"] == 0
    assert f"accuracy {TASK} exact_match,remove_whitespace 0.7000" in err
    # the same requests are the run's measured requests, in the performance files beside it
    records = [json.loads(line) for line in (out / "request_level_metrics.jsonl").read_text().splitlines()]
    assert sorted(r["request_id"] for r in records) == list(range(20))
    assert all(r["status"] == "ok" and r["ttft_s"] is not None for r in records)
    assert json.loads((out / "summary.json").read_text())["requests"]["ok"] == 20
    samples = [json.loads(line) for line in (out / f"lmeval_samples_{TASK}.jsonl").read_text().splitlines()]
    by_doc = {s["doc_id"]: s for s in samples}
    assert by_doc[0]["filtered_resps"] == [_truth(by_doc[0]["doc"]["question"])]
    assert by_doc[0]["exact_match"] == 1.0 and by_doc[15]["exact_match"] == 0.0


async def test_a_bench_file_in_seed_002s_shape_with_few_shot_and_no_bootstrap(
    start_sim, tmp_path: Path
) -> None:
    sim = await start_sim(_sim_yaml(port=""))
    (tmp_path / "bench.yml").write_text(
        f"url: {sim.base_url('oa')}/v1\nmodel: m\nrate: 50\nserver_metrics: false\nplots: false\n"
        f"output_dir: {tmp_path / 'run'}\n"
        # seed 002's shape: the tasks in the session generator, the evaluator's own settings beside
        "session_generator:\n"
        "  type: lmeval\n"
        f"  tasks: [{TASK}]\n"
        "  num_fewshot: 2\n"
        "evaluators:\n"
        "  - type: performance\n"
        '    target_channels: ["text"]\n'
        "  - type: accuracy_lmeval\n"
        "    limit: 10\n"
        "    bootstrap_iters: 0\n"
    )
    values, doc = load_bench_file(tmp_path / "bench.yml")
    opts = build_options(values, source="bench.yml", doc=doc)
    evaluator = accuracy_evaluator(opts.evaluators, opts.session_generator)
    assert evaluator is not None and evaluator.tasks == (TASK,) and evaluator.num_fewshot == 2
    run = await run_accuracy(opts, evaluator, Console(stderr=True, quiet=True))
    assert run.results is not None and run.out_dir is not None, run.error
    doc = json.loads((run.out_dir / RESULTS_FILE).read_text())
    assert doc["n-shot"][TASK] == 2
    # the performance evaluator beside it: the seed's files of the same run, one line per scored item
    levels = (run.out_dir / "metrics" / "request_level_metrics.jsonl").read_text().splitlines()
    assert len(levels) == 10
    figures = doc["results"][TASK]
    assert figures["exact_match,remove_whitespace"] == pytest.approx(1.0)  # the first 10 items are all right
    assert figures["exact_match_stderr,remove_whitespace"] == "N/A"  # bootstrap_iters 0: no standard error
    truths = sim.state.truth.recent()
    assert len(truths) == 10 and all(
        t.finish_reason == "stop" for t in truths
    )  # each stopped after its answer
    samples = [
        json.loads(line) for line in (run.out_dir / f"lmeval_samples_{TASK}.jsonl").read_text().splitlines()
    ]
    prompt = samples[0]["arguments"][0][0]
    assert prompt.count("Question:") == 3  # two examples, then the item: the item's question answered


async def test_lm_evals_own_chat_completions_model_scores_the_same_answers(start_sim, tmp_path: Path) -> None:
    """The same task against the same simulator through lm-eval's own API-model interface
    (local-chat-completions, its own HTTP client): the same score, item by item."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from tokwatch.bench.accuracy import shipped_task_config

    sim = await start_sim(_sim_yaml(port=""))
    evaluator = AccuracyLmevalEvaluator(tasks=(TASK,), apply_chat_template=True, bootstrap_iters=100)
    opts = build_options(
        {"url": f"{sim.base_url('oa')}/v1", "model": "m", "concurrency": 3, "server_metrics": False,
         "plots": False, "output_dir": str(tmp_path / "run")}
    )  # fmt: skip
    ours = await run_accuracy(opts, evaluator, Console(stderr=True, quiet=True))
    assert ours.results is not None and ours.out_dir is not None, ours.error

    def lm_eval_alone() -> dict[str, Any]:
        return simple_evaluate(  # type: ignore[no-any-return]
            model="local-chat-completions",
            model_args={
                "model": "m",
                "base_url": f"{sim.base_url('oa')}/v1/chat/completions",
                "num_concurrent": 2,
                "max_retries": 1,
                "tokenizer_backend": None,
            },
            tasks=[shipped_task_config(TASK)],
            task_manager=TaskManager(include_defaults=False),
            apply_chat_template=True,
            bootstrap_iters=100,
        )

    theirs = await asyncio.to_thread(lm_eval_alone)
    key = "exact_match,remove_whitespace"
    _, expected = _answer_table()
    assert float(theirs["results"][TASK][key]) == pytest.approx(expected)
    assert ours.results["results"][TASK][key] == pytest.approx(expected)
    samples = [
        json.loads(line) for line in (ours.out_dir / f"lmeval_samples_{TASK}.jsonl").read_text().splitlines()
    ]
    ours_by_doc = {s["doc_id"]: s["exact_match"] for s in samples}
    theirs_by_doc = {s["doc_id"]: s["exact_match"] for s in theirs["samples"][TASK]}
    assert ours_by_doc == theirs_by_doc
    # both sent the item as chat messages: one user message with the question
    assert json.loads(samples[0]["arguments"][0][0]) == [
        {"role": "user", "content": f"Question: {samples[0]['doc']['question']}\nAnswer:"}
    ]


async def test_a_log_likelihood_task_is_refused_before_anything_is_sent(start_sim, tmp_path: Path) -> None:
    sim = await start_sim(_sim_yaml(port=""))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tasks / "choices.jsonl"
    data.write_text(json.dumps({"q": "2+2?", "choices": ["3", "4"], "gold": 1}) + "\n")
    (tasks / "choices.yaml").write_text(
        "task: my_choices\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\noutput_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{{{q}}}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{gold}}'\nmetric_list:\n  - metric: acc\n"
    )
    opts = build_options(
        {
            "url": f"{sim.base_url('oa')}/v1",
            "model": "m",
            "server_metrics": False,
            "output_dir": str(tmp_path / "run"),
            "evaluators": [{"type": "accuracy_lmeval", "tasks": ["my_choices"], "include_path": str(tasks)}],
        }
    )
    evaluator = accuracy_evaluator(opts.evaluators)
    assert evaluator is not None
    with pytest.raises(ConfigError, match="log-likelihoods"):
        await run_accuracy(opts, evaluator, Console(stderr=True, quiet=True))
    assert sim.state.truth.last() is None  # nothing was sent
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a tokwatch process each (lm-eval's import; the unknown task indexes its catalogue)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--accuracy-task", TASK, "--duration", "5s"], "leave out duration"),
        (["--accuracy-task", TASK, "--number", "5"], "leave out number"),
        (["--accuracy-task", TASK, "--sweep", "rate=1,2"], "leave out sweep"),
        (["--num-fewshot", "2"], "--num-fewshot: needs --accuracy-task"),
        (["--accuracy-task", "no_such_task_anywhere"], "unknown task no_such_task_anywhere"),
        (["--bench-file", "{tmp}/bench.yml"], "accuracy_lmeval: no task"),
    ],
)
async def test_bad_accuracy_input_exits_2_with_one_line(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    (tmp_path / "bench.yml").write_text("evaluators:\n  - type: accuracy_lmeval\n    bootstrap_iters: 10\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, _, err = await tokwatch_cli(
        "bench", "--url", "http://127.0.0.1:9/v1", "--model", "m",
        "--output-dir", str(tmp_path / "run"), *argv,
    )  # fmt: skip
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a tokwatch process importing lm-eval, and a simulator process
async def test_ctrl_c_keeps_the_measured_run_and_scores_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    slow = _sim_yaml().replace("decode_tps: 2000", "decode_tps: 20")  # a 16-token answer takes 0.8 s
    empty_table = slow.split("        answers:")[0]  # no known answer: every reply runs to max_gen_toks
    async with sim_process(tmp_path, empty_table) as (_, port):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tokwatch", "bench", "--url", f"http://127.0.0.1:{port}/oa/v1",
            "--model", "m", "--accuracy-task", TASK, "--output-dir", str(out), "--no-server-metrics",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "MPLBACKEND": "Agg"},
        )  # fmt: skip
        try:
            await until_served(port, 2)
            proc.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = err.decode()
    assert proc.returncode == 3, text
    assert "accuracy_lmeval: interrupted, not scored" in text and "Traceback" not in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["stop_reason"] == "interrupted"
    assert summary["requests"]["ok"] >= 2
    assert not (out / RESULTS_FILE).exists()


def test_the_session_generator_gives_the_evaluator_what_it_leaves_out() -> None:
    generator = {"type": "lmeval", "tasks": ["a", "b"], "num_fewshot": 3, "limit": 5}
    alone = build_options({"url": "http://127.0.0.1:9/v1", "model": "m", "session_generator": generator})
    evaluator = accuracy_evaluator(alone.evaluators, alone.session_generator)
    assert evaluator is not None  # scored with the evaluator's defaults
    assert (evaluator.tasks, evaluator.num_fewshot, evaluator.limit, evaluator.bootstrap_iters) == (
        ("a", "b"), 3, 5, 100_000,
    )  # fmt: skip
    own = {"type": "accuracy_lmeval", "tasks": ["c"], "num_fewshot": 0, "bootstrap_iters": 7}
    both = build_options(
        {"url": "http://127.0.0.1:9/v1", "model": "m", "session_generator": generator, "evaluators": [own]}
    )
    evaluator = accuracy_evaluator(both.evaluators, both.session_generator)
    assert evaluator is not None
    assert (evaluator.tasks, evaluator.num_fewshot, evaluator.limit, evaluator.bootstrap_iters) == (
        ("c",), 0, 5, 7,
    )  # fmt: skip
    neither = build_options({"url": "http://127.0.0.1:9/v1", "model": "m"})
    assert accuracy_evaluator(neither.evaluators, neither.session_generator) is None


def test_the_accuracy_flags_set_the_bench_files_evaluator() -> None:
    values = {"evaluators": [{"type": "accuracy_lmeval", "tasks": ["a"], "bootstrap_iters": 9}]}
    assert accuracy_flag_values(values, {"num_fewshot": 2})["evaluators"] == [
        {"type": "accuracy_lmeval", "tasks": ["a"], "bootstrap_iters": 9, "num_fewshot": 2}
    ]
    assert accuracy_flag_values(values, {"tasks": ("b",)})["evaluators"] == [
        {"type": "accuracy_lmeval", "tasks": ["b"]}
    ]
    assert values["evaluators"][0]["tasks"] == ["a"]  # the file's values are not changed in place
    with pytest.raises(ConfigError, match="--accuracy-limit: needs --accuracy-task"):
        accuracy_flag_values({}, {"limit": 3})
    # lm-eval reads a whole number as items and a share below 1 as a fraction of them
    assert accuracy_limit("5") == 5 and isinstance(accuracy_limit("5.0"), int)
    assert accuracy_limit("0.5") == 0.5
