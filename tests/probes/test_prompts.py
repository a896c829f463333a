"""Fresh prompts: natural-language filler from the packaged word list, reproducible from the run id, sharing
no prefix between runs, and sized to a number of server-counted tokens (estimated, or by a tokenizer)."""

from __future__ import annotations

import itertools
import uuid

import pytest

from tokwatch.figures.tokens import HFTokenizer
from tokwatch.probes.prompts import (
    INSTRUCTION,
    RECENT_STARTS,
    TOKENS_PER_WORD_PRIOR,
    WORDS,
    PromptSizer,
    RecentStarts,
    filler,
    first_word,
    fresh_prefix,
    fresh_seed,
    sized_prompt,
)

RUN_IDS = [uuid.UUID(int=i).hex for i in range(1, 41)]  # fixed run ids: the same prompts every test run


def _words(text: str) -> list[str]:
    return [w.strip(".").lower() for w in text.split()]


def test_the_word_list_is_packaged_plain_words() -> None:
    assert len(WORDS) >= 500 and len(set(WORDS)) == len(WORDS)
    assert all(w.isalpha() and w.islower() for w in WORDS)


def test_filler_is_sentences_of_listed_words_reproducible_from_the_seed() -> None:
    text = filler(RUN_IDS[0], 200)
    assert text == filler(RUN_IDS[0], 200)  # the stored run id regenerates the prompt
    assert len(text.split()) == 200 and set(_words(text)) <= set(WORDS)
    sentences = [s for s in text.split(". ") if s]
    assert len(sentences) > 10 and all(s[0].isupper() for s in sentences) and text.endswith(".")
    assert sized_prompt(RUN_IDS[0], 200) == f"{text}\n\n{INSTRUCTION}"  # the fixed part comes last


def test_consecutive_runs_share_no_prefix_not_even_a_first_word() -> None:
    """Two run ids start their filler with the same word about once in len(WORDS) runs: the endpoint's
    latest starts are avoided, so its recent prompts never share even that one word."""
    starts = RecentStarts()
    run_ids = [uuid.uuid4().hex for _ in range(2000)]  # random: the guarantee holds for any ids
    seeds = [starts.seed_for(run_id) for run_id in run_ids]
    firsts = [first_word(seed) for seed in seeds]
    for i in range(len(firsts)):
        assert firsts[i] not in firsts[max(0, i - RECENT_STARTS) : i]
    pairs = list(zip(seeds, run_ids, strict=True))
    assert sum(seed != run_id for seed, run_id in pairs) > 0  # it had to step aside
    for seed, run_id in pairs:  # stored with the run, the seed regenerates the prompt
        assert seed == run_id or seed.startswith(f"{run_id}/")
        assert _words(sized_prompt(seed, 20))[0] == first_word(seed)
    prefixes = [fresh_prefix(seed) for seed in seeds[:40]]
    assert all(len(p.split()) == 3 for p in prefixes)
    assert all(_words(a)[0] != _words(b)[0] for a, b in itertools.pairwise(prefixes))
    # the text the fresh sentence leads is avoided too (seed000's "Explain theory of relativity simply")
    assert first_word(fresh_seed(RUN_IDS[0], [first_word(RUN_IDS[0])])) != first_word(RUN_IDS[0])


def test_estimated_sizing_learns_tokens_per_word_from_the_server() -> None:
    sizer = PromptSizer(1000)
    first = sizer.build(RUN_IDS[0])
    assert not sizer.calibrated
    # before any server count: the prior (1.3 tokens per word of common English)
    assert len(first.text.split()) == pytest.approx(1000 / TOKENS_PER_WORD_PRIOR, abs=1)
    # this server counts 1.6 tokens per word (its template's share included): the next prompt is shorter
    sizer.observe(first, round(1.6 * len(first.text.split())))
    assert sizer.calibrated
    second = sizer.build(RUN_IDS[1])
    assert 1.6 * len(second.text.split()) == pytest.approx(1000, abs=2)
    sizer.observe(first, None)  # a server that gives no count teaches nothing
    assert sizer.build(RUN_IDS[2]).words == second.words


def test_tokenizer_sizing_counts_the_filler_and_learns_the_template_share(tokenizer_json: str) -> None:
    counter = HFTokenizer(tokenizer_json)
    sizer = PromptSizer(300, counter)
    first = sizer.build(RUN_IDS[0])
    assert first.counted == counter.count(first.text)
    assert abs(first.counted - 300) <= 3  # the word count whose text the tokenizer puts closest
    sizer.observe(first, first.counted + 25)  # the server adds its chat template: 25 tokens
    second = sizer.build(RUN_IDS[1])
    assert second.counted is not None and abs(second.counted + 25 - 300) <= 3
