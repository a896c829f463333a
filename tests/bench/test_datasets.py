"""Dataset files: every format of tests/data/datasets, JSON arrays and JSONL, offsets, and bad entries
reported with their file and line."""

import json
from pathlib import Path

import pytest

from tokwatch.bench.datasets import load_conversations, load_prompts, read_entries
from tokwatch.bench.workload import LengthRange, WorkloadError

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets"
OUT = LengthRange(32, 32)


def test_sharegpt_json_array_both_styles():
    convs = load_conversations(DATA / "sharegpt.json", OUT, seed=0)
    assert [c.user_turns for c in convs] == [
        ("What is a prefix cache?", "Why does it help a chat?"),
        ("Name a prime number above ten.", "And one above twenty?", "Which of the two is larger?"),
        ("Translate 'good morning' into French.",),
    ]
    assert [c.system for c in convs] == [None, "You answer in one sentence.", None]
    assert all("Eleven" not in t for c in convs for t in c.user_turns)  # dataset replies are never sent
    assert all(t.max_tokens == 32 and not t.fixed_output for c in convs for t in c.turns)


def test_sharegpt_jsonl_both_styles_and_max_turns():
    convs = load_conversations(DATA / "sharegpt.jsonl", OUT, seed=0, max_turns=2)
    assert convs[0].user_turns == ("Hello", "Write me a short poem about rain")
    assert convs[1].user_turns == ("What is the capital of France?", "Tell me one landmark there.")
    assert convs[2].system == "Be brief." and convs[2].user_turns == ("Give me a colour.", "Another one.")


def test_single_turn_takes_the_first_user_turn_of_a_conversation():
    specs = load_prompts(DATA / "sharegpt.json", OUT, seed=0)
    assert specs[0].messages == ({"role": "user", "content": "What is a prefix cache?"},)
    assert specs[1].messages == (
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "Name a prime number above ten."},
    )
    assert specs[0].prompt_tokens_target == round(len("What is a prefix cache?") / 4)


def test_openai_messages_conversations():
    convs = load_conversations(DATA / "conversations.jsonl", OUT, seed=0)
    assert convs[0].user_turns == ("Hello", "Write me a poem", "Write another one")
    assert convs[1].system == "You are terse."
    assert [t.max_tokens for t in convs[2].turns] == [16, 16]  # the line's own max_tokens


def test_prompts_file():
    specs = load_prompts(DATA / "prompts.jsonl", OUT, seed=0)
    assert [s.max_tokens for s in specs] == [12, 32, 32]
    assert specs[1].messages[0] == {"role": "system", "content": "Be brief."}


def test_trace_turns_are_synthesised_to_their_token_lengths():
    convs = load_conversations(DATA / "trace.jsonl", OUT, seed=3)
    first = convs[0].turns
    assert [(t.tokens, t.max_tokens, t.wait_s) for t in first] == [(60, 8, 0.3), (20, 6, 0.2), (15, 5, 0.0)]
    assert [len(t.text.split()) for t in first] == [
        60,
        20,
        15,
    ]  # one common word per token without --tokenizer
    assert all(t.fixed_output for c in convs for t in c.turns)
    again = load_conversations(DATA / "trace.jsonl", OUT, seed=3)
    assert again == convs  # seeded
    assert load_conversations(DATA / "trace.jsonl", OUT, seed=4)[0].turns[0].text != first[0].text
    single = load_prompts(DATA / "trace.jsonl", OUT, seed=3)
    assert [(s.prompt_tokens_target, s.max_tokens, s.fixed_output) for s in single] == [
        (60, 8, True),
        (40, 6, True),
    ]
    assert single[0].messages[0]["content"] == first[0].text


def test_dataset_offset_skips_entries():
    convs = load_conversations(DATA / "sharegpt.jsonl", OUT, seed=0, offset=2)
    assert len(convs) == 1 and convs[0].system == "Be brief."
    assert (
        load_prompts(DATA / "prompts.jsonl", OUT, seed=0, offset=1)[0].messages[0]["content"] == "Be brief."
    )
    with pytest.raises(WorkloadError, match=r"prompts.jsonl: --dataset-offset 3 skips all 3 entries"):
        load_prompts(DATA / "prompts.jsonl", OUT, seed=0, offset=3)


def test_one_line_files_json_array_or_messages(tmp_path):
    minified = tmp_path / "min.json"
    minified.write_text(json.dumps([{"conversation": [{"human": "a"}]}, {"conversation": [{"human": "b"}]}]))
    assert [c.user_turns for c in load_conversations(minified, OUT, seed=0)] == [("a",), ("b",)]
    one = tmp_path / "one.jsonl"  # a single JSONL line holding one messages array is one conversation
    one.write_text(json.dumps([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]) + "\n")
    assert [c.user_turns for c in load_conversations(one, OUT, seed=0)] == [("x", "y")]
    jsonl = tmp_path / "arrays.jsonl"
    jsonl.write_text('[{"role": "user", "content": "p"}]\n[{"role": "user", "content": "q"}]\n')
    assert [s.messages[0]["content"] for s in load_prompts(jsonl, OUT, seed=0)] == ["p", "q"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"d.jsonl:2: invalid JSON"),
        ('{"foo": 1}', r"d.jsonl:2: expected prompt, messages, conversation, conversations"),
        ('[{"role": "bot", "content": "x"}]', r"d.jsonl:2: message 0 has role 'bot'"),
        ('[{"role": "assistant", "content": "x"}]', r"d.jsonl:2: needs at least one user message"),
        ('{"prompt": "x", "max_tokens": 0}', r"d.jsonl:2: max_tokens must be a positive integer"),
        ('{"conversation": [{"assistant": "x"}]}', r"d.jsonl:2: conversation\[0\] needs a string 'human'"),
        ('{"conversations": [{"from": "robot", "value": "x"}]}',
         r"d.jsonl:2: conversations\[0\] has from 'robot'"),
        ('{"conversations": [{"from": "gpt", "value": "x"}]}',
         r"d.jsonl:2: conversations has no human/user turn"),
        ('{"conversations": [{"from": "human", "value": 3}]}',
         r"d.jsonl:2: conversations\[0\] needs a string 'value'"),
        ('{"turns": []}', r"d.jsonl:2: turns must be a non-empty JSON array"),
        ('{"turns": [{"prompt_tokens": 0, "output_tokens": 4}]}',
         r"d.jsonl:2: turns\[0\]: prompt_tokens must be"),
        ('{"turns": [{"prompt_tokens": 9}]}', r"d.jsonl:2: turns\[0\]: output_tokens must be a positive"),
        ('{"turns": [{"prompt_tokens": 9, "output_tokens": 4, "wait_s": -1}]}',
         r"d.jsonl:2: turns\[0\]: wait_s"),
        ("42", r"d.jsonl:2: expected a JSON object or a messages array"),
    ],
)  # fmt: skip
def test_bad_jsonl_lines_name_file_and_line(tmp_path, line, message):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "ok"}\n' + line + "\n")
    for load in (load_prompts, load_conversations):
        with pytest.raises(WorkloadError, match=message):
            load(p, OUT, seed=0)


def test_bad_json_array_entry_names_its_index_and_line(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(
        '[\n  {"conversation": [{"human": "fine"}]},\n'
        '  {"conversations": [\n    {"from": "human", "value": "ok"},\n'
        '    {"from": "alien", "value": "?"}]}\n]\n'
    )
    with pytest.raises(WorkloadError, match=r"a\.json:3: entry 1: conversations\[1\] has from 'alien'"):
        load_conversations(p, OUT, seed=0)
    p.write_text('[\n  {"prompt": "a"},\n  {"prompt": "b",}\n]\n')
    with pytest.raises(WorkloadError, match=r"a\.json:3: invalid JSON"):
        read_entries(p)


def test_missing_and_empty_dataset(tmp_path):
    with pytest.raises(WorkloadError, match="no such dataset file"):
        load_prompts(tmp_path / "nope.jsonl", OUT, seed=0)
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(WorkloadError, match="empty"):
        load_prompts(tmp_path / "e.jsonl", OUT, seed=0)
    (tmp_path / "e.json").write_text("[]\n")
    with pytest.raises(WorkloadError, match="empty"):
        load_conversations(tmp_path / "e.json", OUT, seed=0)
