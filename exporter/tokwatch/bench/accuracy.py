"""Seed 002's `accuracy_lmeval` evaluator: its settings, tokwatch's shipped lm-eval tasks, and how one
lm-eval generation request becomes one bench request (docs/bench.md, "Accuracy (accuracy_lmeval)").

The lm-eval package itself is only imported by `tokwatch.bench.lmeval_run` (the `accuracy` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from tokwatch.bench.workload import Message, RequestSpec
from tokwatch.settings.strict_yaml import ConfigError, StrictModel

# Tasks tokwatch ships (lm-eval YAML configs with their data), one directory per task.
SHIPPED_TASKS_DIR = Path(__file__).parent / "lmeval_tasks"
# lm-eval's own default for a task that names no max_gen_toks (its API models' `max_gen_toks`).
DEFAULT_MAX_GEN_TOKS = 256
# Load settings that would send a task item twice, never or under another schedule: refused with accuracy.
_REFUSED_OPTIONS = {
    "duration": "a measured duration could cut task items off",
    "number": "the number of requests is the number of task items",
    "warmup": "warm-up requests would be unscored copies of task items",
    "dataset": "the task items are the prompts",
    "multi_turn": "each task item is one request",
    "sweep": "one load point per accuracy run",
    "search": "one load point per accuracy run",
    "segment": "the whole task runs in one process",
}

# The command line's accuracy flags, by evaluator field (tokwatch.bench.commands).
_FLAG_NAMES = {
    "tasks": "--accuracy-task",
    "num_fewshot": "--num-fewshot",
    "limit": "--accuracy-limit",
    "bootstrap_iters": "--bootstrap-iters",
    "include_path": "--lmeval-include-path",
}


class AccuracyLmevalEvaluator(StrictModel):
    """`evaluators: [{type: accuracy_lmeval, ...}]`: lm-eval-harness tasks sent as the run's requests and
    scored by lm-eval (seed 002)."""

    type: Literal["accuracy_lmeval"] = "accuracy_lmeval"
    # lm-eval task names, or tokwatch's shipped ones; none here: the session generator's (seed 002's shape)
    tasks: tuple[str, ...] = ()
    num_fewshot: int | None = Field(None, ge=0)  # None: each task's own
    limit: int | float | None = Field(None, gt=0)  # lm-eval's: items per task, or a share of them when < 1
    bootstrap_iters: int = Field(100_000, ge=0)  # lm-eval's default; 0: no standard errors
    include_path: str | None = None  # a directory of your own lm-eval task YAMLs
    apply_chat_template: bool = False  # lm-eval's: few-shot turns as chat messages instead of one prompt
    system_instruction: str | None = None
    log_samples: bool = True  # write lm-eval's per-item samples beside its results


class LmevalSessionGenerator(StrictModel):
    """Seed 002's `session_generator: {type: lmeval, tasks, num_fewshot}`: the lm-eval tasks as the run's
    requests; scored by the `accuracy_lmeval` evaluator (added with its defaults when the file has none)."""

    type: Literal["lmeval"]
    tasks: tuple[str, ...] = Field(min_length=1)
    num_fewshot: int | None = Field(None, ge=0)
    limit: int | float | None = Field(None, gt=0)


def accuracy_evaluator(
    evaluators: tuple[Any, ...], generator: LmevalSessionGenerator | None = None
) -> AccuracyLmevalEvaluator | None:
    """The run's accuracy evaluator, if it has one, with the session generator's tasks, few-shot count and
    limit where it names none of its own; raises ConfigError when it has no task at all."""
    found = [e for e in evaluators if isinstance(e, AccuracyLmevalEvaluator)]
    if len(found) > 1:
        raise ConfigError("evaluators: at most one accuracy_lmeval evaluator per run")
    if not found and generator is None:
        return None
    evaluator = found[0] if found else AccuracyLmevalEvaluator.model_validate({})
    if generator is not None:
        given = evaluator.model_fields_set
        evaluator = evaluator.model_copy(
            update={
                "tasks": evaluator.tasks or generator.tasks,
                "num_fewshot": evaluator.num_fewshot if "num_fewshot" in given else generator.num_fewshot,
                "limit": evaluator.limit if "limit" in given else generator.limit,
            }
        )
    if not evaluator.tasks:
        raise ConfigError(
            "accuracy_lmeval: no task: give its tasks, or session_generator: {type: lmeval, tasks: [...]}"
        )
    return evaluator


def refused_options(values: dict[str, Any]) -> list[str]:
    """`option: why` for every set load option an accuracy run cannot honour."""
    out = []
    for name, why in _REFUSED_OPTIONS.items():
        value = values.get(name)
        if value not in (None, False, 0, ""):
            out.append(f"{name} ({why})")
    if (values.get("workers") or 1) > 1:
        out.append("workers (the task items are sent by one process)")
    return out


def shipped_task_config(name: str) -> dict[str, Any] | None:
    """A shipped task's lm-eval config, its relative `data_files` resolved against its own directory (lm-eval
    would resolve them against the working directory); None: not a shipped task."""
    path = SHIPPED_TASKS_DIR / name / f"{name}.yaml"
    if not path.is_file():
        return None
    config: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, dict):
        config["dataset_kwargs"]["data_files"] = {
            split: str(path.parent / f) if "://" not in f else f for split, f in files.items()
        }
    return config


def request_spec(context: Any, gen_kwargs: dict[str, Any], *, chat_json: bool) -> RequestSpec:
    """One lm-eval `generate_until` request as a bench request: the context as one user message (or, with a
    chat template applied, the JSON message list tokwatch's `apply_chat_template` made), `max_gen_toks` as
    max_tokens; never a fixed output length, the answer must be free to stop."""
    if chat_json:
        messages: tuple[Message, ...] = tuple(
            {"role": str(m["role"]), "content": str(m["content"])} for m in json.loads(str(context))
        )
    else:
        messages = ({"role": "user", "content": str(context)},)
    max_tokens = gen_kwargs.get("max_gen_toks") or gen_kwargs.get("max_tokens") or DEFAULT_MAX_GEN_TOKS
    return RequestSpec("dataset", messages, int(max_tokens), fixed_output=False)


def cut_at_stops(text: str, until: Any) -> str:
    """The reply before its first stop sequence (lm-eval's `until`), as lm-eval's API models cut it."""
    stops = [until] if isinstance(until, str) else list(until or ())
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    return text


def accuracy_limit(text: str) -> int | float:
    """`--accuracy-limit`: a whole number of items, or a share of them below 1 (lm-eval's `limit`)."""
    value = float(text)
    return int(value) if value >= 1 and value.is_integer() else value


def accuracy_flag_values(values: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """Bench-file option values with the command line's accuracy flags applied: with --accuracy-task a new
    accuracy_lmeval evaluator (replacing the file's); the other flags set fields of the file's evaluator."""
    if not flags:
        return values
    evaluators = [dict(e) if isinstance(e, dict) else e for e in values.get("evaluators") or ()]
    index = next(
        (i for i, e in enumerate(evaluators) if isinstance(e, dict) and e.get("type") == "accuracy_lmeval"),
        None,
    )
    if "tasks" in flags:
        fields = {"type": "accuracy_lmeval", **flags, "tasks": list(flags["tasks"])}
        if index is None:
            evaluators.append(fields)
        else:
            evaluators[index] = fields
    elif index is not None:
        evaluators[index] = {**evaluators[index], **flags}
    else:
        names = ", ".join(_FLAG_NAMES[k] for k in flags)
        raise ConfigError(f"{names}: needs --accuracy-task (or an accuracy_lmeval evaluator in --bench-file)")
    return {**values, "evaluators": evaluators}
