"""Seed 003's named datasets (`--dataset swe_smith`, `trie_office_work`, `math_500`, ...): each read from a
local file in its published format (`--dataset-path`, or the file under the local dataset cache), never
fetched. Every one becomes the entries of tokwatch.bench.datasets (docs/datasets.md, Named datasets)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokwatch.bench.datasets import Entry, TraceTurn, load_entries, read_entries
from tokwatch.bench.workload import WorkloadError
from tokwatch.figures.tokens import CharEstimate, TokenCounter

CACHE_ENV = "TOKWATCH_DATASET_CACHE"
DEFAULT_CACHE = "~/.cache/tokwatch/datasets"


@dataclass(frozen=True, slots=True)
class Named:
    """One named dataset: its published file (looked for in the cache), where it is published, its reader."""

    file: str
    source: str
    reader: str  # "trie", "swe_smith", "math_500" or "generic" (the formats of datasets.py)


_TRIE = "evalscope/trie-workloads (applied-compute/trie)"
_SHAREGPT = "swift/sharegpt (ModelScope)"
NAMED: dict[str, Named] = {
    "swe_smith": Named(
        "agentic_dataset.json",
        "SWE-bench/SWE-smith-trajectories (Hugging Face; evalscope's build_swe_smith_dataset.py "
        "output, or the raw trajectories as parquet or JSONL)",
        "swe_smith",
    ),
    "trie_agentic_coding": Named("agentic_coding_8k.jsonl", _TRIE, "trie"),
    "trie_code_qa": Named("code_qa_8k.jsonl", _TRIE, "trie"),
    "trie_office_work": Named("office_work_8k.jsonl", _TRIE, "trie"),
    "share_gpt": Named(
        "ShareGPT_V3_unfiltered_cleaned_split.json", "anon8231489123/ShareGPT_Vicuna_unfiltered", "generic"
    ),
    "share_gpt_en_multi_turn": Named("common_en_70k.jsonl", _SHAREGPT, "generic"),
    "share_gpt_zh_multi_turn": Named("common_zh_70k.jsonl", _SHAREGPT, "generic"),
    "custom_multi_turn": Named("", "your own OpenAI-messages JSONL", "generic"),
    "math_500": Named("test.jsonl", "HuggingFaceH4/MATH-500 (Hugging Face)", "math_500"),
}  # fmt: skip


class MultiTurnArgs:
    """evalscope's `multi_turn_args` for swe_smith built from raw trajectories (defaults as the seed)."""

    KEYS = {
        "first_turn_length": 65000,
        "subsequent_turn_length": 500,
        "chars_per_token": 3.0,
        "num_workers": 4,
    }

    def __init__(self, values: Mapping[str, Any]) -> None:
        unknown = sorted(set(values) - set(self.KEYS))
        if unknown:
            raise WorkloadError(f"multi_turn_args: unknown key {unknown[0]!r} (use {', '.join(self.KEYS)})")
        merged = {**self.KEYS, **values}
        for key in ("first_turn_length", "subsequent_turn_length", "num_workers"):
            v = merged[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise WorkloadError(f"multi_turn_args: {key} must be a positive integer, got {v!r}")
        cpt = merged["chars_per_token"]
        if isinstance(cpt, bool) or not isinstance(cpt, int | float) or not 0 < cpt < 100:
            raise WorkloadError(f"multi_turn_args: chars_per_token must be a number above 0, got {cpt!r}")
        self.first_turn_length: int = merged["first_turn_length"]
        self.subsequent_turn_length: int = merged["subsequent_turn_length"]
        self.chars_per_token = float(cpt)
        self.num_workers: int = merged["num_workers"]  # accepted for evalscope's commands; one process here


def cache_dir() -> Path:
    """The local dataset cache: $TOKWATCH_DATASET_CACHE, else ~/.cache/tokwatch/datasets."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def resolve_path(name: str, dataset_path: str | None) -> Path:
    """The local file of a named dataset: `--dataset-path`, else its published file in the cache."""
    if dataset_path:
        return Path(dataset_path)
    spec = NAMED[name]
    if not spec.file:
        raise WorkloadError(f"--dataset {name} needs --dataset-path (a local JSONL file)")
    cached = cache_dir() / spec.file
    if not cached.is_file():
        raise WorkloadError(
            f"--dataset {name}: no local file: give --dataset-path, or put {spec.file} (from "
            f"{spec.source}) in {cache_dir()} (${CACHE_ENV}); nothing is downloaded"
        )
    return cached


# --- trie traces ------------------------------------------------------------------------------------------


def _trie_int(row: Mapping[str, Any], key: str, where: str, minimum: int) -> int:
    v = row.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise WorkloadError(f"{where}: {key} must be an integer >= {minimum}, got {v!r}")
    return v


def _trie_list(row: Mapping[str, Any], key: str, where: str, n: int) -> list[Any]:
    v = row.get(key)
    if not isinstance(v, list) or len(v) != n:
        got = len(v) if isinstance(v, list) else type(v).__name__
        raise WorkloadError(f"{where}: {key} must be a list of num_turns ({n}) values, got {got}")
    return v


def trie_entry(where: str, index: int, row: Any) -> Entry:
    """One trie trace (input_prompt_length, num_turns, assistant_response_length, tool_call_output_length,
    tool_call_latency, final_assistant_response_length) as num_turns + 1 trace turns: turn 0 the initial
    prompt, turn i the i-th tool output; the wait after turn i is tool_call_latency[i]."""
    if not isinstance(row, dict):
        raise WorkloadError(f"{where}: a trie trace must be a JSON object")
    first = _trie_int(row, "input_prompt_length", where, 1)
    n = _trie_int(row, "num_turns", where, 0)
    replies = _trie_list(row, "assistant_response_length", where, n)
    tools = _trie_list(row, "tool_call_output_length", where, n)
    waits = _trie_list(row, "tool_call_latency", where, n)
    final = _trie_int(row, "final_assistant_response_length", where, 1)
    for key, values in (("assistant_response_length", replies), ("tool_call_output_length", tools)):
        for i, v in enumerate(values):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise WorkloadError(f"{where}: {key}[{i}] must be a positive integer, got {v!r}")
    for i, w in enumerate(waits):
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w < float("inf"):
            raise WorkloadError(f"{where}: tool_call_latency[{i}] must be seconds >= 0, got {w!r}")
    outputs = [*replies, final]  # the reply cap of turn i
    prompts = [first, *tools]  # the new tokens of turn i
    turns = tuple(TraceTurn(prompts[i], outputs[i], float(waits[i]) if i < n else 0.0) for i in range(n + 1))
    return Entry(where, index, trace=turns)


# --- SWE-smith -------------------------------------------------------------------------------------------


def _content(value: Any) -> str:
    if isinstance(value, list):  # OpenAI content parts
        parts = [
            p if isinstance(p, str) else str(p.get("text", ""))
            for p in value
            if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text")
        ]
        return "\n".join(parts)
    return value if isinstance(value, str) else ""


def _prebuilt(where: str, index: int, conversation: Any) -> Entry:
    """One conversation of agentic_dataset.json: a list of turns, each `{"messages": [delta user messages],
    "prompt_tokens": N}`; a turn's delta messages are sent as one user message."""
    if not isinstance(conversation, list) or not conversation:
        raise WorkloadError(f"{where}: a conversation must be a non-empty list of turns")
    users = []
    for t, turn in enumerate(conversation):
        msgs = turn.get("messages") if isinstance(turn, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise WorkloadError(f"{where}: turn {t} needs a non-empty 'messages' list")
        text = "\n\n".join(_content(m.get("content")) for m in msgs if isinstance(m, dict))
        if not text:
            raise WorkloadError(f"{where}: turn {t} has no message content")
        users.append(text)
    return Entry(where, index, users=tuple(users))


def _trajectory_users(raw: Any, where: str) -> list[str]:
    """The user side of a raw SWE-smith trajectory (`messages`: a JSON string or a list): user and tool
    messages, in order (tool outputs are what the agent is sent back)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: messages is not valid JSON: {exc.msg}") from None
    if not isinstance(raw, list):
        raise WorkloadError(f"{where}: messages must be a list (or a JSON string of one)")
    return [
        text
        for m in raw
        if isinstance(m, dict) and m.get("role") in ("user", "tool") and (text := _content(m.get("content")))
    ]


def truncate_to(text: str, tokens: int, counter: TokenCounter) -> str:
    """The longest prefix of `text` (at a character) of at most `tokens` tokens."""
    lo, hi = 0, len(text)
    while lo < hi:  # binary search on the prefix length: O(log n) counts
        mid = (lo + hi + 1) // 2
        if counter.count(text[:mid]) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def build_swe_conversation(
    users: list[str], turns: int, args: MultiTurnArgs, counter: TokenCounter
) -> tuple[str, ...] | None:
    """evalscope's live construction: turn 1 takes trajectory messages up to first_turn_length tokens, each
    later turn the next ones up to subsequent_turn_length (the last message of a turn cut to fit); None
    when the trajectory runs out before `turns` turns are filled."""
    out: list[str] = []
    i = 0
    for t in range(turns):
        budget = args.first_turn_length if t == 0 else args.subsequent_turn_length
        parts: list[str] = []
        used = 0
        while i < len(users):
            n = counter.count(users[i])
            if used + n <= budget:
                parts.append(users[i])
                used += n
                i += 1
                continue
            if budget - used > 0:
                parts.append(truncate_to(users[i], budget - used, counter))
                i += 1
            break
        if not parts or not any(parts):
            return None
        out.append("\n\n".join(parts))
    return tuple(out)


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    """(`where`, row) of a JSON/JSONL file, or of a parquet file (the Hugging Face layout; needs pyarrow)."""
    if path.suffix != ".parquet":
        try:  # a whole-file JSON object (agentic_dataset.json, often pretty-printed)
            whole = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            whole = None
        if isinstance(whole, dict):
            return [(str(path), whole)]
        return read_entries(path)
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # optional: only parquet files need it (extra `datasets`)
    except ImportError:
        raise WorkloadError(
            f"{path}: reading parquet needs pyarrow: pip install 'tokwatch[datasets]'"
        ) from None
    if not path.is_file():
        raise WorkloadError(f"{path}: no such dataset file")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises its own classes for a file that is not parquet
        raise WorkloadError(f"{path}: cannot read parquet: {exc}") from None
    if not rows:
        raise WorkloadError(f"{path}: the dataset is empty")
    return [(f"{path}: row {k}", row) for k, row in enumerate(rows)]


def swe_smith_entries(
    path: Path,
    *,
    args: MultiTurnArgs,
    min_turns: int,
    max_turns: int | None,
    seed: int,
    counter: TokenCounter,
    number: int | None,
) -> list[Entry]:
    """agentic_dataset.json (`{"conversations": [...]}`, pre-built) as it is; raw trajectories (rows with
    `messages`) built into conversations of min..max turns as evalscope's live construction does."""
    rows = _read_rows(path)
    if len(rows) == 1 and isinstance(rows[0][1], dict) and "conversations" in rows[0][1]:
        convs = rows[0][1]["conversations"]
        if not isinstance(convs, list) or not convs:
            raise WorkloadError(f"{path}: conversations must be a non-empty list")
        return [_prebuilt(f"{path}: conversation {k}", k, c) for k, c in enumerate(convs)]
    top = max_turns or min_turns
    rng = random.Random(f"{seed}:swe_smith")
    # The pre-filter of evalscope: a trajectory needs about the characters of every turn's budget.
    min_chars = (args.first_turn_length + args.subsequent_turn_length * (top - 1)) * args.chars_per_token
    out: list[Entry] = []
    for where, row in rows:
        if not isinstance(row, dict) or "messages" not in row:
            raise WorkloadError(
                f"{where}: expected a trajectory with 'messages' or a {{\"conversations\"}} file"
            )
        users = _trajectory_users(row["messages"], where)
        if sum(len(u) for u in users) < min_chars:
            continue
        turns = rng.randint(min_turns, top)
        built = build_swe_conversation(users, turns, args, counter)
        if built is not None:
            out.append(Entry(where, len(out), users=built))
        if number is not None and len(out) >= number:
            break
    if not out:
        raise WorkloadError(
            f"{path}: no trajectory is long enough for {min_turns}..{top} turns of first_turn_length "
            f"{args.first_turn_length} and subsequent_turn_length {args.subsequent_turn_length} "
            "(lower them with --multi-turn-args)"
        )
    return out


# --- MATH-500 --------------------------------------------------------------------------------------------


def math_500_entry(where: str, index: int, row: Any) -> Entry:
    """One MATH-500 row (`problem`, `solution`, `answer`, `subject`, `level`, `unique_id`): its problem."""
    if not isinstance(row, dict) or not isinstance(row.get("problem"), str) or not row["problem"]:
        raise WorkloadError(f"{where}: a MATH-500 row needs a string 'problem' field")
    return Entry(where, index, users=(row["problem"],))


# --- one loader per name ----------------------------------------------------------------------------------


def named_loader(
    name: str,
    *,
    multi_turn_args: Mapping[str, Any],
    min_turns: int,
    max_turns: int | None,
    seed: int,
    counter: TokenCounter | None,
    number: int | None,
) -> Callable[[str | Path, int], list[Entry]]:
    """The entry reader of a named dataset, with the signature of datasets.load_entries(path, offset)."""
    reader = NAMED[name].reader
    mt_args = MultiTurnArgs(multi_turn_args)
    counter = counter or CharEstimate()

    def parsed(path: str | Path, offset: int) -> list[Entry]:
        p = Path(path)
        if reader == "generic":
            return load_entries(p, offset)
        if reader == "swe_smith":
            # offset entries are skipped before the number is reached, so build offset + number of them
            want = None if number is None else number + offset
            entries = swe_smith_entries(
                p, args=mt_args, min_turns=min_turns, max_turns=max_turns, seed=seed, counter=counter,
                number=want,
            )  # fmt: skip
        else:
            parse = trie_entry if reader == "trie" else math_500_entry
            entries = [parse(where, k, row) for k, (where, row) in enumerate(read_entries(p))]
        if offset >= len(entries):
            raise WorkloadError(
                f"{p}: --dataset-offset {offset} skips all {len(entries)} entries of the dataset"
            )
        return entries[offset:]

    return parsed
