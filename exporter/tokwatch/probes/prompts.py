"""Fresh prompts: natural-language filler from the word list packaged with tokwatch, seeded so a prompt is
reproducible from the run that sent it, and sized to a number of server-counted prompt tokens.

Every seed gives other text from its first word on, so two runs share no prompt prefix and no prefix cache
can serve one from the other (only what every request shares: the chat template's own preamble). Sizing
counts with the endpoint's tokenizer.json when one is configured, else estimates from the server's own
counts of earlier prompts (`PromptSizer`). Below the probe and the bench; docs/methodology.md, "Workloads
and fresh prompts".
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources

from tokwatch.figures.tokens import TokenCounter


def _load_words() -> tuple[str, ...]:
    text = (resources.files("tokwatch.probes") / "prompt_words.txt").read_text(encoding="utf-8")
    return tuple(w for w in (line.strip() for line in text.splitlines()) if w and not w.startswith("#"))


WORDS = _load_words()
# Last in a sized prompt, so it adds nothing to a shared prefix: asks for a long answer from servers that
# cannot be told to ignore the end of sequence.
INSTRUCTION = "Continue the text above."
_INSTRUCTION_WORDS = len(INSTRUCTION.split())
TOKENS_PER_WORD_PRIOR = 1.3  # before any server count: common English words, BPE tokenizers
CALIBRATION_RUNS = 8  # server counts an estimate is taken from (the newest)
# First words of an endpoint's latest prompts that a new prompt does not start with: at least the server's
# slots (llama-server keeps one cached prompt per slot, 4 by default) plus the warm-up.
RECENT_STARTS = 16
_SEED_TRIES = 64
_SENTENCE_WORDS = (6, 14)
_FIT_ROUNDS = 8


def filler(seed: str, words: int) -> str:
    """`words` words of sentences drawn from WORDS, the same text for the same seed."""
    rng = random.Random(f"tokwatch-filler:{seed}")
    out: list[str] = []
    left = 0
    for i in range(max(0, words)):
        word = rng.choice(WORDS)
        if left == 0:
            left = rng.randint(*_SENTENCE_WORDS)
            word = word.capitalize()
        left -= 1
        if left == 0 or i == words - 1:
            word += "."
        out.append(word)
    return " ".join(out)


def first_word(seed: str) -> str:
    """The word a seed's filler starts with (lower case)."""
    return random.Random(f"tokwatch-filler:{seed}").choice(WORDS)


def fresh_seed(run_id: str, avoid: Iterable[str] = ()) -> str:
    """The seed of a run's prompt: the run id, or `run_id/1`, `run_id/2`... when the run id's filler
    would start with a word in `avoid` (the endpoint's latest first words), so no two of its recent
    prompts share even their first word. Stored with the run, it regenerates the prompt."""
    avoided = set(avoid)
    seed = run_id
    for n in range(1, _SEED_TRIES):
        if first_word(seed) not in avoided:
            return seed
        seed = f"{run_id}/{n}"
    return seed


class RecentStarts:
    """The first words of an endpoint's latest prompts (warm-ups included), newest last."""

    def __init__(self, size: int = RECENT_STARTS) -> None:
        self._words: deque[str] = deque(maxlen=size)

    def __iter__(self) -> Iterator[str]:
        return iter(self._words)

    def seed_for(self, run_id: str, also: Iterable[str] = ()) -> str:
        """A fresh seed for `run_id` (`fresh_seed`) avoiding the latest starts and `also` (e.g. the first
        word of the text the filler is put before), remembered as the newest start."""
        seed = fresh_seed(run_id, [*self._words, *(w.lower() for w in also)])
        self._words.append(first_word(seed))
        return seed


def sized_prompt(seed: str, words: int) -> str:
    """A sized workload's user message: `words` words of filler, then INSTRUCTION."""
    return f"{filler(seed, words)}\n\n{INSTRUCTION}"


def fresh_prefix(seed: str) -> str:
    """seed000's fresh start of the timed run's prompt: a three-word sentence (about five tokens)."""
    return filler(seed, 3) + " "


@dataclass(frozen=True, slots=True)
class FreshPrompt:
    """A sized prompt: the text, the filler words it holds (with the seed, enough to regenerate it) and its
    tokens by the tokenizer (None: no tokenizer)."""

    text: str
    words: int
    counted: int | None = None


@dataclass
class PromptSizer:
    """Sizes the fresh prompts of one endpoint and workload to `target` prompt tokens as the server counts
    them (chat template included). With a tokenizer, the filler is counted exactly and the template's
    share learned from the server's counts; without, tokens per word are learned from them (starting at
    TOKENS_PER_WORD_PRIOR). `observe` takes each server count, the warm-up's included."""

    target: int
    counter: TokenCounter | None = None
    _ratios: deque[float] = field(default_factory=lambda: deque(maxlen=CALIBRATION_RUNS))
    _overheads: deque[int] = field(default_factory=lambda: deque(maxlen=CALIBRATION_RUNS))

    @property
    def calibrated(self) -> bool:
        """At least one server count has been taken in."""
        return bool(self._ratios or self._overheads)

    def build(self, seed: str) -> FreshPrompt:
        """The prompt for `seed`, sized by what is known now (with a tokenizer: a few counts of the text,
        milliseconds for 10k tokens; the probe runs it in a worker thread)."""
        if self.counter is None:
            words = self._words_estimated()
            return FreshPrompt(sized_prompt(seed, words), words)
        words = self._words_counted(seed)
        text = sized_prompt(seed, words)
        return FreshPrompt(text, words, self.counter.count(text))

    def observe(self, prompt: FreshPrompt, prompt_tokens: int | None) -> None:
        """Take in the server's count of a prompt this sizer built (None: the server gave none)."""
        if not prompt_tokens or prompt_tokens <= 0:
            return
        if prompt.counted is None:
            self._ratios.append(prompt_tokens / max(1, len(prompt.text.split())))
        else:
            self._overheads.append(prompt_tokens - prompt.counted)

    def _words_estimated(self) -> int:
        ratio = sum(self._ratios) / len(self._ratios) if self._ratios else TOKENS_PER_WORD_PRIOR
        return max(1, round(self.target / ratio) - _INSTRUCTION_WORDS)

    def _words_counted(self, seed: str) -> int:
        """The word count whose prompt the tokenizer puts closest to the target, template share taken off."""
        assert self.counter is not None
        overhead = round(sum(self._overheads) / len(self._overheads)) if self._overheads else 0
        goal = max(1, self.target - overhead)
        words = max(1, round(goal / TOKENS_PER_WORD_PRIOR))
        best: tuple[int, int] | None = None  # (distance from the goal, words)
        for _ in range(_FIT_ROUNDS):
            tokens = self.counter.count(sized_prompt(seed, words))
            best = min(best or (abs(tokens - goal), words), (abs(tokens - goal), words))
            if tokens == goal:
                break
            step = round((goal - tokens) * words / max(1, tokens))
            words = max(1, words + (step or (1 if tokens < goal else -1)))
        assert best is not None
        return best[1]
