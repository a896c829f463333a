"""Seed 001's math-style prompts: the first 40 problems of GSM8K's test split, shipped in `bench/data` with
their origin and MIT licence (`gsm8k_NOTICE.txt`)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

PROBLEMS_FILE = "gsm8k_test_first40.jsonl"
INSTRUCTION = "Think step by step, then give the final answer as a number."


@dataclass(frozen=True, slots=True)
class MathProblem:
    """One shipped problem: its id in the source, the question and the final answer."""

    id: str
    question: str
    answer: str


def math_problems() -> tuple[MathProblem, ...]:
    """The shipped problems, in file order."""
    text = resources.files("tokwatch.bench").joinpath("data", PROBLEMS_FILE).read_text(encoding="utf-8")
    return tuple(MathProblem(**json.loads(line)) for line in text.splitlines() if line.strip())


def reasoning_prompt(problem: MathProblem, fresh: str) -> str:
    """The user message of a reasoning request: a few fresh words (so a prefix cache cannot serve a problem
    another request already sent), the problem, then the instruction."""
    return f"{fresh}\n{problem.question}\n{INSTRUCTION}"


def pick(problems: Sequence[MathProblem], rng: random.Random) -> MathProblem:
    """A problem drawn uniformly."""
    return problems[rng.randrange(len(problems))]
