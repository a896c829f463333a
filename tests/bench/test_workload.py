import pytest

from tokwatch.bench.workload import LengthRange, SyntheticConversations, SyntheticWorkload, WorkloadError


def test_length_range_parsing():
    assert LengthRange.parse("128", "x") == LengthRange(128, 128)
    assert LengthRange.parse("40:240", "x") == LengthRange(40, 240)
    for bad in ("0", "5:4", "a:b", "1:2:3"):
        with pytest.raises(WorkloadError, match="--output-tokens"):
            LengthRange.parse(bad, "--output-tokens")


def test_synthetic_lengths_mix_and_determinism():
    def make():
        return SyntheticWorkload(
            LengthRange(50, 60), LengthRange(40, 240), seed=5, reasoning_ratio=0.4,
            reasoning_tokens=LengthRange(600, 6000),
        )  # fmt: skip

    a = [make().next_request() for _ in range(1)]
    w = make()
    specs = [w.next_request() for _ in range(2000)]
    assert specs[0] == a[0]
    chat = [s for s in specs if s.category == "chat"]
    reasoning = [s for s in specs if s.category == "reasoning"]
    assert len(reasoning) / len(specs) == pytest.approx(0.4, abs=0.04)
    assert all(40 <= s.max_tokens <= 240 and s.fixed_output for s in chat)
    assert all(640 <= s.max_tokens <= 6240 and not s.fixed_output for s in reasoning)
    assert all(600 <= s.think_budget <= 6000 for s in reasoning)
    assert all(40 <= s.max_tokens - s.think_budget <= 240 for s in reasoning)
    assert all(s.think_budget is None for s in chat)
    assert all(50 <= s.prompt_tokens_target <= 60 for s in chat)
    # Reasoning prompts are seed 001's math problems, at their own length (tokwatch.bench.math_prompts).
    assert all("step by step" in s.messages[0]["content"] for s in reasoning)
    assert all(len(s.messages[0]["content"].split()) == s.prompt_tokens_target for s in chat)
    # Random words: two prompts of the same length differ, so a prefix cache cannot serve them whole.
    assert len({s.messages[0]["content"] for s in chat}) == len(chat)


def test_random_multi_turn_conversations_are_seeded_and_in_range():
    def make(seed=5, offset=0):
        return SyntheticConversations(
            LengthRange(20, 30), LengthRange(8, 12), LengthRange(2, 4), seed, offset=offset
        )

    convs = [make()[k] for k in range(200)]
    assert {len(c.turns) for c in convs} == {2, 3, 4}
    assert all(20 <= t.tokens <= 30 and len(t.text.split()) == t.tokens for c in convs for t in c.turns)
    assert all(8 <= t.max_tokens <= 12 and t.fixed_output for c in convs for t in c.turns)
    assert make()[7] == convs[7] and make(seed=6)[7] != convs[7]
    assert make(offset=3)[0] == convs[3]  # --dataset-offset skips conversations
    texts = [t.text for c in convs for t in c.turns]
    assert len(set(texts)) == len(texts)  # random words: no prefix cache can serve a turn whole
