"""Prompt token counting and deterministic output words for the simulator."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# A fixed vocabulary: output text depends only on the token index, so two runs produce identical bodies.
_WORDS = (
    "the",
    "speed",
    "of",
    "light",
    "is",
    "constant",
    "for",
    "every",
    "observer",
    "and",
    "time",
    "runs",
    "slower",
    "when",
    "you",
    "move",
    "fast",
    "relative",
    "to",
    "someone",
    "else",
    "mass",
    "bends",
    "space",
    "so",
    "objects",
    "fall",
    "along",
    "curved",
    "paths",
    "energy",
    "equals",
    "squared",
    "clocks",
    "near",
    "heavy",
    "stars",
    "tick",
    "more",
    "slowly",
    "than",
    "far",
    "away",
    "simple",
    "idea",
    "with",
    "deep",
    "consequences",
)
_THINK_WORDS = ("let", "me", "think", "about", "this", "step", "by", "carefully", "first", "then", "check")
# One token per whitespace word: what a BPE tokenizer counts for the common English words tokwatch's prompts
# are made of (SmolLM2's tokenizer, llama.cpp /tokenize: 1,024 bench words -> 1,024 tokens).
PROMPT_TOKENS_PER_WORD = 1.0


def count_prompt_tokens(texts: Iterable[str]) -> int:
    """Whitespace-separated words of all texts x PROMPT_TOKENS_PER_WORD, rounded, at least 1
    (docs/simulator.md)."""
    words = sum(len(t.split()) for t in texts)
    return max(1, round(words * PROMPT_TOKENS_PER_WORD))


def message_texts(messages: Any) -> list[str]:
    """The text of every chat message content, including OpenAI content-part lists."""
    out: list[str] = []
    if not isinstance(messages, list):
        return out
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
    return out


def find_answer(answers: Mapping[str, str], texts: Iterable[str]) -> str | None:
    """The answer of the table key found last in the prompt texts (the longer key on a tie); None: no key."""
    if not answers:
        return None
    prompt = "\n".join(texts)
    best: tuple[int, int, str] | None = None
    for key, answer in answers.items():
        at = prompt.rfind(key)
        if at >= 0 and (best is None or (at, len(key)) > best[:2]):
            best = (at, len(key), answer)
    return None if best is None else best[2]


def answer_tokens(answer: str) -> tuple[str, ...]:
    """An answer's text as tokens: each word with the whitespace before it."""
    return tuple(re.findall(r"\s*\S+", answer))


def output_word(index: int) -> str:
    """Text of output token `index`: a leading-space word, the first without the space."""
    word = _WORDS[index % len(_WORDS)]
    return word.capitalize() if index == 0 else " " + word


def think_word(index: int) -> str:
    """Text of reasoning token `index`."""
    word = _THINK_WORDS[index % len(_THINK_WORDS)]
    return word.capitalize() if index == 0 else " " + word
