"""What each benchmark request asks for: synthetic lengths, a chat/reasoning mix, or JSONL datasets."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Message = dict[str, str]
Category = Literal["chat", "reasoning", "dataset"]

# Seed 001's reference mix: chat answers of 40-240 tokens, reasoning with 600-6000 think tokens.
CHAT_OUTPUT_RANGE = (40, 240)
REASONING_THINK_RANGE = (600, 6000)
# Short common words: each is about one token for BPE tokenizers, so N words ~ N prompt tokens.
_WORD_TEXT = (
    "the of and to in is was for on are with as at be by this have from or one had not but what all were "
    "when we there can an your which their said if do will each about how up out them then she many some so "
    "these would other into has more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just where"
)
_WORDS = _WORD_TEXT.split()


class WorkloadError(ValueError):
    """A dataset or workload option that cannot be used; the message names file and line."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request's content and length targets."""

    category: Category
    messages: tuple[Message, ...]
    max_tokens: int
    prompt_tokens_target: int | None = None
    fixed_output: bool = False  # ask the server to emit exactly max_tokens (ignore_eos/min_tokens)


@dataclass(frozen=True, slots=True)
class Conversation:
    """A multi-turn conversation: only the user turns; assistant turns come from the model at run time."""

    conversation_id: int
    user_turns: tuple[str, ...]
    max_tokens: int


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


def estimate_tokens(text: str) -> int:
    """Client-side token estimate (about 4 characters per token) used when the server reports none."""
    return max(1, round(len(text) / 4)) if text else 0


def synthetic_prompt(tokens: int, rng: random.Random) -> str:
    """About `tokens` tokens of filler text; random words so a prefix cache cannot serve it whole."""
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, tokens)))


@dataclass(slots=True)
class SyntheticWorkload:
    """Synthetic requests: prompt/output lengths from ranges, a share of them reasoning requests."""

    input_tokens: LengthRange
    output_tokens: LengthRange
    seed: int
    reasoning_ratio: float = 0.0
    reasoning_tokens: LengthRange = field(default_factory=lambda: LengthRange(*REASONING_THINK_RANGE))
    fixed_output: bool = True
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.reasoning_ratio <= 1.0:
            raise WorkloadError("--reasoning-ratio must be between 0 and 1")
        self._rng = random.Random(self.seed)

    def next_request(self) -> RequestSpec:
        """The next request; the sequence is fixed by the seed."""
        rng = self._rng
        reasoning = self.reasoning_ratio > 0 and rng.random() < self.reasoning_ratio
        n_in = self.input_tokens.sample(rng)
        prompt = synthetic_prompt(n_in, rng)
        if reasoning:
            # The think phase length is the model's choice; the budget covers think plus answer.
            budget = self.reasoning_tokens.sample(rng) + self.output_tokens.sample(rng)
            return RequestSpec(
                "reasoning",
                ({"role": "user", "content": "Think step by step, then answer. " + prompt},),
                max_tokens=budget,
                prompt_tokens_target=n_in,
                fixed_output=False,
            )
        return RequestSpec(
            "chat",
            ({"role": "user", "content": prompt},),
            max_tokens=self.output_tokens.sample(rng),
            prompt_tokens_target=n_in,
            fixed_output=self.fixed_output,
        )


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such dataset file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read: {exc}") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
    if not rows:
        raise WorkloadError(f"{path}: the dataset is empty")
    return rows


def _messages(value: Any, where: str) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"{where}: messages must be a non-empty JSON array")
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise WorkloadError(f"{where}: message {i} needs string 'role' and 'content' fields")
        if m["role"] not in ("system", "user", "assistant"):
            raise WorkloadError(f"{where}: message {i} has role {m['role']!r} (use system/user/assistant)")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "user" for m in out):
        raise WorkloadError(f"{where}: needs at least one user message")
    return out


def _max_tokens(row: Any, default: int, where: str) -> int:
    value = row.get("max_tokens", default) if isinstance(row, dict) else default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise WorkloadError(f"{where}: max_tokens must be a positive integer")
    return value


def load_prompts(path: str | Path, output_tokens: LengthRange, seed: int) -> list[RequestSpec]:
    """Single-turn dataset: each line `{"prompt": ...}`, `{"messages": [...]}` or a messages array."""
    p = Path(path)
    rng = random.Random(seed)
    specs = []
    for lineno, row in _read_jsonl(p):
        where = f"{p}:{lineno}"
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            messages = [{"role": "user", "content": row["prompt"]}]
        elif isinstance(row, dict) and "messages" in row:
            messages = _messages(row["messages"], where)
        elif isinstance(row, list):
            messages = _messages(row, where)
        else:
            raise WorkloadError(f"{where}: expected a prompt or messages object, or a messages array")
        content = "".join(m["content"] for m in messages)
        specs.append(
            RequestSpec(
                "dataset",
                tuple(messages),
                max_tokens=_max_tokens(row, output_tokens.sample(rng), where),
                prompt_tokens_target=estimate_tokens(content),
            )
        )
    return specs


def load_conversations(
    path: str | Path, output_tokens: LengthRange, seed: int, max_turns: int | None = None
) -> list[Conversation]:
    """Multi-turn dataset (seed 003's custom_multi_turn): one OpenAI messages array per line.

    Only user turns are kept; `{"messages": [...]}` and ShareGPT `{"conversation": [{"human": ...}]}`
    lines are accepted too. Dataset assistant replies are never sent.
    """
    p = Path(path)
    rng = random.Random(seed)
    out: list[Conversation] = []
    for lineno, row in _read_jsonl(p):
        where = f"{p}:{lineno}"
        if isinstance(row, dict) and isinstance(row.get("conversation"), list):
            turns = [t.get("human") for t in row["conversation"] if isinstance(t, dict)]
            if not turns or not all(isinstance(t, str) for t in turns):
                raise WorkloadError(f"{where}: every conversation entry needs a string 'human' field")
            users = [str(t) for t in turns]
        else:
            raw = row.get("messages") if isinstance(row, dict) else row
            users = [m["content"] for m in _messages(raw, where) if m["role"] == "user"]
        if max_turns is not None:
            users = users[:max_turns]
        out.append(Conversation(len(out), tuple(users), _max_tokens(row, output_tokens.sample(rng), where)))
    return out
