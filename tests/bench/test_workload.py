import json

import pytest

from tokwatch.bench.workload import (
    LengthRange,
    SyntheticWorkload,
    WorkloadError,
    load_conversations,
    load_prompts,
)


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
    assert all(50 <= s.prompt_tokens_target <= 60 for s in specs)
    assert all(len(s.messages[0]["content"].split()) == s.prompt_tokens_target for s in chat)
    # Random words: two prompts of the same length differ, so a prefix cache cannot serve them whole.
    assert len({s.messages[0]["content"] for s in chat}) == len(chat)


def test_single_turn_dataset_formats(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "hello there", "max_tokens": 7}),
                json.dumps(
                    {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
                ),
                "",
                json.dumps([{"role": "user", "content": "array form"}]),
            ]
        )
    )
    specs = load_prompts(p, LengthRange(16, 16), seed=0)
    assert [s.max_tokens for s in specs] == [7, 16, 16]
    assert specs[1].messages[0]["role"] == "system"
    assert specs[2].messages == ({"role": "user", "content": "array form"},)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"d.jsonl:2: invalid JSON"),
        ('{"foo": 1}', r"d.jsonl:2: expected a prompt or messages"),
        ('[{"role": "bot", "content": "x"}]', r"d.jsonl:2: message 0 has role 'bot'"),
        ('[{"role": "assistant", "content": "x"}]', r"d.jsonl:2: needs at least one user message"),
        ('{"prompt": "x", "max_tokens": 0}', r"d.jsonl:2: max_tokens must be a positive integer"),
    ],
)
def test_bad_dataset_lines_name_file_and_line(tmp_path, line, message):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=message):
        load_prompts(p, LengthRange(8, 8), seed=0)


def test_missing_and_empty_dataset(tmp_path):
    with pytest.raises(WorkloadError, match="no such dataset file"):
        load_prompts(tmp_path / "nope.jsonl", LengthRange(8, 8), seed=0)
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(WorkloadError, match="empty"):
        load_prompts(tmp_path / "e.jsonl", LengthRange(8, 8), seed=0)


def test_conversations_keep_only_user_turns(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(
        json.dumps(
            [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "dataset reply, never sent"},
                {"role": "user", "content": "Write me a poem"},
                {"role": "assistant", "content": "..."},
                {"role": "user", "content": "Another"},
            ]
        )
        + "\n"
        + json.dumps(
            {"conversation": [{"human": "Hi", "assistant": "x"}, {"human": "Bye", "assistant": "y"}]}
        )
        + "\n"
    )
    convs = load_conversations(p, LengthRange(32, 32), seed=0, max_turns=2)
    assert convs[0].user_turns == ("Hello", "Write me a poem")
    assert convs[1].user_turns == ("Hi", "Bye")
    assert [c.conversation_id for c in convs] == [0, 1]
