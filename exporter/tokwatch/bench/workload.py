"""What each benchmark request asks for: synthetic lengths, a chat/reasoning mix, synthetic conversations.

Dataset files are read by `tokwatch.bench.datasets`.
"""

from __future__ import annotations

import random
import sys
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, overload

from tokwatch.bench.math_prompts import MathProblem, math_problems, pick, reasoning_prompt
from tokwatch.figures.tokens import (
    CharEstimate,
    TokenCounter,
    WorkloadError,
    estimate_tokens,
    synthetic_prompt,
)

Message = dict[str, str]
Category = Literal["chat", "reasoning", "dataset"]

FRESH_WORDS = 3  # random words before a reasoning prompt's problem: no two requests share a prefix
# Seed 001's reference mix: chat answers of 40-240 tokens, reasoning with 600-6000 think tokens.
CHAT_OUTPUT_RANGE = (40, 240)
REASONING_THINK_RANGE = (600, 6000)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request's content and length targets."""

    category: Category
    messages: tuple[Message, ...]
    max_tokens: int
    prompt_tokens_target: int | None = None
    fixed_output: bool = False  # ask the server to emit exactly max_tokens (ignore_eos/min_tokens)
    # A reasoning request's think budget drawn from --reasoning-tokens; max_tokens is it plus the answer's.
    think_budget: int | None = None


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn of a conversation and what its request asks for."""

    text: str
    max_tokens: int
    fixed_output: bool = False  # ask for exactly max_tokens (ignore_eos/min_tokens where the kind has them)
    tokens: int | None = None  # the text's known token length (synthetic text); None: counted by the client
    wait_s: float = 0.0  # pause after this turn's reply before the next turn is sent (trace replay)


@dataclass(frozen=True, slots=True)
class Conversation:
    """A multi-turn conversation: the user turns only; assistant turns come from the model at run time."""

    conversation_id: int
    turns: tuple[Turn, ...]
    system: str | None = None  # sent first in every turn

    @property
    def user_turns(self) -> tuple[str, ...]:
        """The user messages, in order."""
        return tuple(t.text for t in self.turns)


@dataclass(frozen=True, slots=True)
class LengthRange:
    """An inclusive integer range MIN:MAX."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str, what: str) -> LengthRange:
        """`N` or `MIN:MAX`; raises WorkloadError naming the option."""
        parts = str(text).split(":")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise WorkloadError(f"{what}: expected N or MIN:MAX integers, got {text!r}") from None
        if len(values) == 1:
            values = values * 2
        if len(values) != 2 or values[0] < 1 or values[1] < values[0]:
            raise WorkloadError(f"{what}: expected 1 <= MIN <= MAX, got {text!r}")
        return cls(values[0], values[1])

    def sample(self, rng: random.Random) -> int:
        """A uniform integer in the range."""
        return rng.randint(self.low, self.high)


@dataclass(slots=True)
class SyntheticWorkload:
    """Synthetic requests: prompt/output lengths from ranges, a share of them reasoning requests."""

    input_tokens: LengthRange
    output_tokens: LengthRange
    seed: int
    reasoning_ratio: float = 0.0
    reasoning_tokens: LengthRange = field(default_factory=lambda: LengthRange(*REASONING_THINK_RANGE))
    fixed_output: bool = True
    counter: TokenCounter = field(default_factory=CharEstimate)  # exact lengths with --tokenizer
    salt: str | None = None  # the run's prompt salt (tokwatch.bench.prompt_salt); None: text from the seed
    _rng: random.Random = field(init=False)
    _text_rng: random.Random = field(init=False)
    _problems: tuple[MathProblem, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.reasoning_ratio <= 1.0:
            raise WorkloadError("--reasoning-ratio must be between 0 and 1")
        self._problems = math_problems() if self.reasoning_ratio > 0 else ()
        self._rng = random.Random(self.seed)
        # Words from their own stream: the lengths and the mix are the seed's whatever the salt.
        self._text_rng = random.Random(_text_key(self.seed, self.salt, "text"))

    def request_at(self, index: int) -> RequestSpec:
        """Request `index` of the run, from the seed, the salt and the index alone: any process builds any
        request, so segments of one schedule send its very requests (tokwatch.bench.segments). Reseeds
        `next_request`."""
        self._rng.seed(f"{self.seed}:request:{index}")
        self._text_rng.seed(_text_key(self.seed, self.salt, "text", index))
        return self.next_request()

    def next_request(self) -> RequestSpec:
        """The next request; lengths and mix are fixed by the seed, the words by seed and salt."""
        rng = self._rng
        reasoning = self.reasoning_ratio > 0 and rng.random() < self.reasoning_ratio
        n_in = self.input_tokens.sample(rng)
        prompt = self.counter.text_of(n_in, self._text_rng)
        if reasoning:
            # Seed 001: a math problem; the think budget is requested from the server (the kind's own
            # field) and max_tokens covers it plus the answer. The model may stop thinking sooner.
            budget = self.reasoning_tokens.sample(rng)
            problem = pick(self._problems, rng)
            text = reasoning_prompt(problem, self.counter.text_of(FRESH_WORDS, self._text_rng))
            # The fresh words are FRESH_WORDS tokens by construction: the same target whatever the salt.
            target = FRESH_WORDS + self.counter.count(reasoning_prompt(problem, "").lstrip("\n"))
            return RequestSpec(
                "reasoning",
                ({"role": "user", "content": text},),
                max_tokens=budget + self.output_tokens.sample(rng),
                prompt_tokens_target=target,
                fixed_output=False,
                think_budget=budget,
            )
        return RequestSpec(
            "chat",
            ({"role": "user", "content": prompt},),
            max_tokens=self.output_tokens.sample(rng),
            prompt_tokens_target=n_in,
            fixed_output=self.fixed_output,
        )


class EndlessConversations(Sequence[Conversation]):
    """Conversations built on demand, without end: item i is `conversation(i)`; a slice stops at 2**20."""

    offset = 0  # items skipped at the start (--dataset-offset)

    @abstractmethod
    def conversation(self, index: int) -> Conversation:
        """Conversation `index` (0-based, after the offset)."""

    def __len__(self) -> int:
        return sys.maxsize - self.offset

    @overload
    def __getitem__(self, index: int) -> Conversation: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Conversation]: ...
    def __getitem__(self, index: int | slice) -> Conversation | Sequence[Conversation]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(min(len(self), 1 << 20)))]
        if index < 0:
            raise IndexError("these conversations are endless: no negative index")
        return self.conversation(index)


class SyntheticConversations(EndlessConversations):
    """Seed 003's random_multi_turn: [min_turns, max_turns] user turns of `input_tokens` random words each.

    Conversation k is built from the seed and k alone, so the sequence is endless and its lengths the same in
    every run with the same seed; the words also depend on `salt` (the run's; None: the seed alone);
    `offset` skips the first conversations (--dataset-offset).
    """

    def __init__(
        self,
        input_tokens: LengthRange,
        output_tokens: LengthRange,
        turns: LengthRange,
        seed: int,
        *,
        fixed_output: bool = True,
        counter: TokenCounter | None = None,
        offset: int = 0,
        salt: str | None = None,
    ) -> None:
        self.input_tokens, self.output_tokens, self.turns = input_tokens, output_tokens, turns
        self.seed, self.fixed_output, self.offset = seed, fixed_output, offset
        self.counter = counter or CharEstimate()
        self.salt = salt

    def conversation(self, index: int) -> Conversation:
        """Conversation `index` after the offset, from the seed, its position and the salt."""
        k = index + self.offset
        rng = random.Random(f"{self.seed}:conversation:{k}")
        words = random.Random(_text_key(self.seed, self.salt, "conversation", k, "text"))
        turns = []
        for _ in range(self.turns.sample(rng)):
            n = self.input_tokens.sample(rng)
            text = self.counter.text_of(n, words)
            turns.append(Turn(text, self.output_tokens.sample(rng), self.fixed_output, tokens=n))
        return Conversation(k, tuple(turns))


def _text_key(seed: int, salt: str | None, *parts: object) -> str:
    """RNG key of synthetic words: the seed's alone without a salt, the run's own with one."""
    return ":".join(str(p) for p in (seed, *(() if salt is None else (salt,)), *parts))


__all__ = [
    "Category",
    "Conversation",
    "EndlessConversations",
    "LengthRange",
    "Message",
    "RequestSpec",
    "SyntheticConversations",
    "SyntheticWorkload",
    "Turn",
    "WorkloadError",
    "estimate_tokens",
    "synthetic_prompt",
]
