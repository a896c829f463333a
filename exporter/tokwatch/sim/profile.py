"""The timing model: a deterministic plan of tokens (phase, text, base gap) for one request."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from tokwatch.figures.result import Phase
from tokwatch.sim.config import ModelProfile
from tokwatch.sim.text import output_word, think_word

FinishReason = Literal["stop", "length"]
# How a request's think phase ended: the model stopped thinking, the requested think budget ended it, or
# max_tokens cut it (no answer followed).
ThinkEnd = Literal["natural", "budget", "length"]
# ASCII placeholder swapped for raw invalid bytes after JSON encoding (json.dumps cannot emit them).
INVALID_UTF8_MARKER = "@@sim-invalid-utf8@@"
INVALID_UTF8_BYTES = b"\xff\xfe\xc3("
_MIN_GAP_FACTOR = 0.05  # a jittered gap never drops below 5% of the mean, so time never runs backwards


def request_rng(seed: int, server: str, seq: int, stream: str) -> random.Random:
    """An RNG for one purpose of one request; string seeds hash with SHA-512, stable across processes."""
    return random.Random(f"{seed}:{server}:{seq}:{stream}")


@dataclass(frozen=True, slots=True)
class Limits:
    """What the request asked for, already parsed from its dialect."""

    max_tokens: int | None
    ignore_eos: bool = False
    min_tokens: int = 0
    # The request asks the model to think (a think budget, Anthropic `thinking`, Ollama `think`, OpenAI
    # `reasoning_effort`), and the budget it sets (None: none; only max_tokens bounds thinking).
    think: bool = False
    think_budget: int | None = None


@dataclass(frozen=True, slots=True)
class TokenPlan:
    """Planned tokens of one request. `n` is None for an endless stream."""

    n: int | None
    think_tokens: int
    finish_reason: FinishReason
    mean_gap: float
    jitter: float
    rng_seed: str
    think_tags: bool = False
    first_output_text: str | None = None  # hostile bodies: a huge or invalid-UTF-8 first output token
    answer: tuple[str, ...] = ()  # the output's first tokens, from the model's answer table
    think_end: ThinkEnd | None = None  # how the think phase ended (None: the request had none planned)
    natural_think_tokens: int | None = None  # what the model would have thought unbounded (natural_think)

    def phase(self, i: int) -> Phase:
        """Phase of token i."""
        return "think" if i < self.think_tokens else "output"

    def text(self, i: int) -> str:
        """Text of token i; think_tags wraps the reasoning phase in <think>...</think> tokens."""
        if i < self.think_tokens:
            if self.think_tags:
                if i == 0:
                    return "<think>" + ("</think>\n\n" if self.think_tokens == 1 else "")
                if i == self.think_tokens - 1:
                    return "</think>\n\n"
            return think_word(i)
        if i == self.think_tokens and self.first_output_text is not None:
            return self.first_output_text
        j = i - self.think_tokens
        return self.answer[j] if j < len(self.answer) else output_word(j)

    def gaps(self) -> GapStream:
        """A fresh deterministic stream of single-stream decode gaps (seconds) for tokens 1, 2, ..."""
        return GapStream(random.Random(self.rng_seed), self.mean_gap, self.jitter)

    @property
    def output_tokens(self) -> int | None:
        """Tokens of the output phase (None when endless)."""
        return None if self.n is None else self.n - self.think_tokens


class GapStream:
    """Jittered gaps around the mean: mean x max(0.05, 1 + jitter x N(0, 1))."""

    def __init__(self, rng: random.Random, mean_gap: float, jitter: float) -> None:
        self._rng = rng
        self._mean = mean_gap
        self._jitter = jitter

    def next(self) -> float:
        """The next gap in seconds."""
        if self._jitter == 0.0:
            return self._mean
        return self._mean * max(_MIN_GAP_FACTOR, 1.0 + self._jitter * self._rng.gauss(0.0, 1.0))


def plan_tokens(
    profile: ModelProfile,
    limits: Limits,
    rng_seed: str,
    *,
    answer: tuple[str, ...] = (),
    think_seed: str | None = None,
) -> TokenPlan:
    """How many tokens of each phase the request produces and why it stops; a known `answer` (the answer
    table's tokens) is the output, and the model stops after it unless told to ignore EOS; a request that
    asks a `natural_think` model to think thinks as `_plan_thinking` says."""
    mean_gap = 1.0 / profile.decode_tps
    tags = profile.reasoning_format == "think_tags"
    first: str | None = None
    if profile.huge_body_bytes:
        first = "x" * profile.huge_body_bytes
    elif profile.invalid_utf8:
        first = INVALID_UTF8_MARKER
    if profile.endless_stream:
        return TokenPlan(
            None, profile.think_tokens, "length", mean_gap, profile.jitter, rng_seed, tags, first
        )
    max_tokens = limits.max_tokens if limits.max_tokens is not None else profile.default_max_tokens
    if profile.natural_think is not None and limits.think:
        shape = (mean_gap, rng_seed, tags, first)
        return _plan_thinking(profile, limits, max_tokens, think_seed or rng_seed, shape)
    n = max_tokens
    finish: FinishReason = "length"
    if profile.natural_stop_tokens is not None and not limits.ignore_eos:
        natural = max(profile.natural_stop_tokens, limits.min_tokens)
        if natural < max_tokens:
            n, finish = natural, "stop"
    if answer and not limits.ignore_eos:
        natural = max(profile.think_tokens + len(answer), limits.min_tokens)
        if natural <= max_tokens:
            n, finish = natural, "stop"
    n = max(1, n)
    think = min(profile.think_tokens, n, n if limits.think_budget is None else limits.think_budget)
    return TokenPlan(n, think, finish, mean_gap, profile.jitter, rng_seed, tags, first, answer)


def _plan_thinking(
    profile: ModelProfile,
    limits: Limits,
    max_tokens: int,
    think_seed: str,
    shape: tuple[float, str, bool, str | None],
) -> TokenPlan:
    """A request that asks a `natural_think` model to think: the natural think length is uniform in the
    profile's range (drawn from `think_seed`); the requested budget ends it earlier, max_tokens cuts it.
    The answer then runs `natural_stop_tokens` (unless ignore_eos) or to max_tokens."""
    assert profile.natural_think is not None
    low, high = profile.natural_think
    natural = random.Random(think_seed).randint(low, high)
    think = natural
    end: ThinkEnd = "natural"
    if limits.think_budget is not None and limits.think_budget <= natural:
        think, end = limits.think_budget, "budget"
    if think >= max_tokens:
        think, end = max_tokens, "length"
    remaining = max_tokens - think
    answer = None if limits.ignore_eos else profile.natural_stop_tokens
    if answer is not None:
        answer = max(answer, limits.min_tokens - think)
    n = max_tokens
    finish: FinishReason = "length"
    if answer is not None and answer < remaining:
        n, finish = think + answer, "stop"
    mean_gap, rng_seed, tags, first = shape
    return TokenPlan(
        max(1, n), think, finish, mean_gap, profile.jitter, rng_seed, tags, first,
        think_end=end, natural_think_tokens=natural,
    )  # fmt: skip
