"""Client-side token counts and prompts of a given token length: a 4-characters-per-token estimate, or a
local HuggingFace `tokenizer.json` for exact lengths (the bench's `--tokenizer`, an endpoint's `tokenizer:`).

Below both the bench and the probe, which count with it. `WorkloadError` lives here, in the lowest module
that raises it (a tokenizer that cannot load); `tokwatch.bench.workload` hands it on with the rest of the
workload's vocabulary."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

_WORD_TEXT = (
    "the of and to in is was for on are with as at be by this have from or one had not but what all were "
    "when we there can an your which their said if do will each about how up out them then she many some so "
    "these would other into has more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just where"
)
# Short common words: each is about one token for BPE tokenizers, so N words ~ N prompt tokens.
WORDS = tuple(_WORD_TEXT.split())
_MIN_WORDS = 16  # fewer single-token words than this: take more from the tokenizer's vocabulary
_FIT_ROUNDS = 64


class WorkloadError(ValueError):
    """A dataset, tokenizer or workload option that cannot be used; the message names file and line."""


class TokenCounter(Protocol):
    """Counts tokens of text and writes text of an exact (or estimated) token length."""

    name: str

    def count(self, text: str) -> int: ...
    def text_of(self, tokens: int, rng: random.Random) -> str: ...


def estimate_tokens(text: str) -> int:
    """Client-side token estimate (about 4 characters per token) used when the server reports none."""
    return max(1, round(len(text) / 4)) if text else 0


def synthetic_prompt(tokens: int, rng: random.Random) -> str:
    """About `tokens` tokens of filler text; random words so a prefix cache cannot serve it whole."""
    return " ".join(rng.choices(WORDS, k=max(1, tokens)))  # one call: a third of `choice` per word


class CharEstimate:
    """No tokenizer: 4 characters per token for counts, one common word per token for prompts."""

    name = "estimate"

    def count(self, text: str) -> int:
        """About len(text)/4."""
        return estimate_tokens(text)

    def text_of(self, tokens: int, rng: random.Random) -> str:
        """`tokens` random common words."""
        return synthetic_prompt(tokens, rng)


class HFTokenizer:
    """A local HuggingFace `tokenizer.json` (the `tokenizers` package); counts exclude special tokens."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise WorkloadError(
                "a tokenizer.json (--tokenizer, an endpoint's tokenizer:) needs the tokenizers package: "
                "pip install 'tokwatch[tokenizer]'"
            ) from None
        try:
            self._tok: Any = Tokenizer.from_file(path)
        except Exception as exc:  # the Rust library raises plain Exception for unreadable/invalid files
            raise WorkloadError(f"{path}: cannot load as a HuggingFace tokenizer.json: {exc}") from None
        self.name = path
        self._words = self._single_token_words()
        if not self._words:
            raise WorkloadError(f"{path}: the tokenizer has no word that encodes to one token")

    def count(self, text: str) -> int:
        """Tokens of `text` without special tokens (the chat template adds its own)."""
        return len(self._tok.encode(text, add_special_tokens=False).ids) if text else 0

    def _single_token_words(self) -> tuple[str, ...]:
        words = [w for w in WORDS if self.count(w) == 1 and self.count(f"{w} {w}") == 2]
        if len(words) < _MIN_WORDS:
            # Vocabulary entries as text (byte-level and sentencepiece entries carry a space marker).
            vocab = sorted({self._tok.decode([i]).strip() for i in self._tok.get_vocab(False).values()})
            words += [w for w in vocab if w.isalpha() and w not in words and self.count(f"{w} {w}") == 2]
        return tuple(words[:1000])

    def text_of(self, tokens: int, rng: random.Random) -> str:
        """Random words that encode to exactly `tokens` tokens (adjusted word by word)."""
        tokens = max(1, tokens)
        words = [rng.choice(self._words) for _ in range(tokens)]
        text = " ".join(words)
        for _ in range(_FIT_ROUNDS):
            diff = self.count(text) - tokens
            if diff == 0:
                return text
            if diff > 0:
                del words[max(1, len(words) - diff) :]
            else:
                words.extend(rng.choice(self._words) for _ in range(-diff))
            text = " ".join(words)
        # Words that merge across spaces: cut the token ids themselves.
        ids = self._tok.encode(text, add_special_tokens=False).ids[:tokens]
        return str(self._tok.decode(ids))


def count_messages(messages: Iterable[Mapping[str, str]], counter: TokenCounter | None = None) -> int:
    """Client count of a prompt's tokens, message contents only (the chat template adds its own): the
    --tokenizer's, else about 4 characters per token."""
    counter = counter or CharEstimate()
    return sum(counter.count(m["content"]) for m in messages)


@functools.lru_cache(maxsize=4)
def token_counter(path: str | None) -> TokenCounter:
    """The counter for `--tokenizer PATH` (loaded once per process), or the 4-chars estimate."""
    return CharEstimate() if path is None else HFTokenizer(path)
