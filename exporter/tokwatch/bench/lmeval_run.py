"""An accuracy run (seed 002's `accuracy_lmeval`): lm-eval-harness builds the task requests and scores the
answers; the bench sends them, under the run's own load, through its own request path (tokwatch.bench.client)
and measures them as any run's requests. Needs the `accuracy` extra (the `lm-eval` package).

lm-eval runs in a thread, its own synchronous way; when it asks for generations the thread hands them to the
event loop as one bench run and waits, so nothing of lm-eval runs while the requests are measured.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable
from rich.console import Console

from tokwatch.bench.accuracy import (
    AccuracyLmevalEvaluator,
    cut_at_stops,
    refused_options,
    request_spec,
    shipped_task_config,
)
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.session import run_bench
from tokwatch.bench.workload import RequestSpec
from tokwatch.settings.strict_yaml import ConfigError

RESULTS_FILE = "lmeval_results.json"  # lm-eval's results document (its CLI's results_<time>.json)
SAMPLES_FILE = "lmeval_samples_{task}.jsonl"  # lm-eval's per-item samples (its CLI's samples_<task>_<time>)
_CHAT_TEMPLATE = "tokwatch-json-messages"  # the chat template's name in lm-eval's request-cache keys

Send = Callable[[list[RequestSpec]], list[str]]


class AccuracyAborted(Exception):
    """The bench run behind lm-eval's requests did not complete, so there is nothing to score."""


class BenchLM(LM):  # type: ignore[misc,unused-ignore]  # lm-eval is untyped: LM is Any
    """lm-eval's model interface answered by a bench run: `generate_until` only (an API endpoint gives no
    log-likelihoods)."""

    def __init__(self, send: Send, model: str, *, chat_template: bool) -> None:
        super().__init__()
        self._send = send
        self._model = model
        self._chat = chat_template

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Send every request as one bench run; each reply cut at its task's stop sequences."""
        specs = [request_spec(r.args[0], r.args[1], chat_json=self._chat) for r in requests]
        replies = self._send(specs)
        pairs = zip(replies, requests, strict=True)
        return [cut_at_stops(reply, r.args[1].get("until")) for reply, r in pairs]

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Not served by a chat/completions endpoint's streamed text."""
        raise AccuracyAborted(_NO_LOGLIKELIHOOD)

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Not served by a chat/completions endpoint's streamed text."""
        raise AccuracyAborted(_NO_LOGLIKELIHOOD)

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The messages as JSON; `request_spec` sends them as the request's messages (as lm-eval's
        local-chat-completions does)."""
        return json.dumps(chat_history, ensure_ascii=False)

    @property
    def tokenizer_name(self) -> str:
        """The chat template's name, for lm-eval's cache keys."""
        return _CHAT_TEMPLATE

    def chat_template(self, chat_template: bool | str = False) -> str:
        """Recorded by lm-eval in its results; the server applies the model's real template."""
        return _CHAT_TEMPLATE


_NO_LOGLIKELIHOOD = (
    "accuracy_lmeval: this task scores log-likelihoods (multiple choice or perplexity); tokwatch sends "
    "generation requests only: use generate_until tasks"
)


@dataclass(slots=True)
class AccuracyRun:
    """An accuracy run's bench outcome and directory, and lm-eval's results (None when not scored)."""

    outcome: BenchOutcome | None
    out_dir: Path | None
    results: dict[str, Any] | None
    error: str | None = None


def check_options(opts: BenchOptions) -> None:
    """Refuse load settings an accuracy run cannot honour (ConfigError, before anything is sent)."""
    refused = refused_options(opts.model_dump())
    if refused:
        raise ConfigError("accuracy_lmeval: every task item is sent once; leave out " + "; ".join(refused))


def task_list(evaluator: AccuracyLmevalEvaluator) -> list[str | dict[str, Any]]:
    """What lm-eval is given: shipped tasks as their configs (data beside them), other names as they are."""
    return [shipped_task_config(name) or name for name in evaluator.tasks]


def task_manager(evaluator: AccuracyLmevalEvaluator) -> TaskManager:
    """lm-eval's task index: only the user's directory when every task is shipped or found there, else
    lm-eval's whole catalogue as well (it takes seconds to index)."""
    include = evaluator.include_path
    if include is not None and not Path(include).is_dir():
        raise ConfigError(f"accuracy_lmeval: include_path {include}: not a directory")
    named = [t for t in evaluator.tasks if shipped_task_config(t) is None]
    if not named:
        return TaskManager(include_path=include, include_defaults=False)
    if include is not None:
        local = TaskManager(include_path=include, include_defaults=False)
        if all(t in local.all_tasks for t in named):
            return local
    manager = TaskManager(include_path=include)
    unknown = [t for t in named if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(
            f"accuracy_lmeval: unknown task {', '.join(unknown)} (lm-eval's tasks, tokwatch's shipped "
            "tokwatch_arithmetic, or your YAMLs in include_path)"
        )
    return manager


def evaluate(evaluator: AccuracyLmevalEvaluator, lm: BenchLM) -> dict[str, Any]:
    """lm-eval's simple_evaluate over the evaluator's tasks; its results document, samples included."""
    manager = task_manager(evaluator)
    results = simple_evaluate(
        model=lm,
        tasks=task_list(evaluator),
        num_fewshot=evaluator.num_fewshot,
        limit=evaluator.limit,
        bootstrap_iters=evaluator.bootstrap_iters,
        task_manager=manager,
        log_samples=evaluator.log_samples,
        apply_chat_template=evaluator.apply_chat_template,
        fewshot_as_multiturn=evaluator.apply_chat_template,
        system_instruction=evaluator.system_instruction,
    )
    if results is None:  # lm-eval returns None on ranks other than 0; tokwatch runs one
        raise AccuracyAborted("accuracy_lmeval: lm-eval returned no results")
    return dict(results)


async def run_accuracy(
    opts: BenchOptions, evaluator: AccuracyLmevalEvaluator, console: Console
) -> AccuracyRun:
    """The accuracy run: lm-eval's requests sent as one bench run, scored, and written beside its files.

    Raises ConfigError for bad settings or tasks, before anything is sent."""
    check_options(opts)
    loop = asyncio.get_running_loop()
    run = AccuracyRun(None, None, None)
    bench: list[asyncio.Task[tuple[BenchOutcome, Path]]] = []
    stopping = False

    async def measure(specs: list[RequestSpec]) -> tuple[BenchOutcome, Path]:
        task = asyncio.create_task(run_bench(opts.model_copy(update={"number": len(specs)}), console=console,
                                             requests=specs))  # fmt: skip
        bench.append(task)
        return await task

    def send(specs: list[RequestSpec]) -> list[str]:
        if stopping or run.outcome is not None:
            raise AccuracyAborted("accuracy_lmeval: run stopped before its requests were sent")
        console.print(f"accuracy_lmeval: {len(specs)} task requests", highlight=False)
        run.outcome, run.out_dir = asyncio.run_coroutine_threadsafe(measure(specs), loop).result()
        if not run.outcome.complete:
            why = run.outcome.stop_reason
            raise AccuracyAborted(f"accuracy_lmeval: not scored, the run stopped early ({why})")
        # A failed request's answer is empty, so lm-eval scores it wrong; the results say how many there were.
        replies = {r.request_id: r.reply_text if r.ok else "" for r in run.outcome.records}
        return [replies.get(i, "") for i in range(len(specs))]

    lm = BenchLM(send, opts.model or "", chat_template=evaluator.apply_chat_template)
    work = asyncio.create_task(asyncio.to_thread(_quiet(evaluate), evaluator, lm))
    try:
        run.results = await asyncio.shield(work)
    except asyncio.CancelledError:
        stopping = True  # Ctrl-C: the bench run keeps what it measured; nothing is scored
        for task in bench:
            task.cancel()
        await asyncio.gather(work, return_exceptions=True)
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        run.error = "accuracy_lmeval: interrupted, not scored"
    except AccuracyAborted as exc:
        if run.outcome is None:  # refused before anything was sent (a log-likelihood task): bad input
            raise ConfigError(str(exc)) from None
        run.error = str(exc)
    except ConfigError:
        raise
    except Exception as exc:  # lm-eval's own errors: a bad task or config, one line
        if run.outcome is None:
            raise ConfigError(f"accuracy_lmeval: {type(exc).__name__}: {exc}") from None
        run.error = f"accuracy_lmeval: not scored: {type(exc).__name__}: {exc}"
    if run.results is not None and run.out_dir is not None and run.outcome is not None:
        run.results["tokwatch"] = _run_facts(run.outcome)
        write_results(run.results, run.out_dir)
    return run


def _run_facts(outcome: BenchOutcome) -> dict[str, Any]:
    """What lm-eval's document does not say: which bench run answered, and how many answers failed."""
    failed = [r.request_id for r in outcome.records if not r.ok]
    return {
        "run_id": outcome.run_id,
        "model": outcome.options.get("model"),
        "target": outcome.options.get("target"),
        "load": outcome.options.get("load"),
        "requests": len(outcome.records),
        "failed_requests": len(failed),
        "failed_request_ids": failed,  # scored as wrong answers (empty text)
    }


def _quiet(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """`fn` with lm-eval's INFO chatter off the console (its warnings stay)."""

    def call(*args: Any) -> dict[str, Any]:
        logging.getLogger("lm_eval").setLevel(logging.WARNING)
        return fn(*args)

    return call


def write_results(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """lm-eval's results document (its CLI's JSON, samples apart) and one samples JSONL per task."""
    doc = {k: v for k, v in results.items() if k != "samples"}
    path = out_dir / RESULTS_FILE
    text = json.dumps(doc, indent=2, default=handle_non_serializable, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    written = [path]
    for task, samples in (results.get("samples") or {}).items():
        sample_path = out_dir / SAMPLES_FILE.format(task=task)
        with sample_path.open("w", encoding="utf-8") as fh:
            for sample in samples:
                fh.write(json.dumps(sample, default=handle_non_serializable, ensure_ascii=False) + "\n")
        written.append(sample_path)
    return written


def headline(results: dict[str, Any]) -> list[str]:
    """One line per task and metric: `task metric,filter value ± stderr`."""
    lines = []
    for task, figures in (results.get("results") or {}).items():
        for key, value in figures.items():
            if "," not in key or "_stderr," in key or not isinstance(value, int | float):
                continue
            metric, _, flt = key.partition(",")
            err = figures.get(f"{metric}_stderr,{flt}")
            spread = f" ± {err:.4f}" if isinstance(err, int | float) else ""
            lines.append(f"{task} {key} {value:.4f}{spread}")
    return lines
