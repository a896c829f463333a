"""Local dataset files (docs/datasets.md): JSONL or one JSON array; prompts, OpenAI messages, both ShareGPT
styles and token-length traces, told apart entry by entry. A bad entry is a WorkloadError naming its line."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokwatch.bench.workload import Conversation, LengthRange, Message, RequestSpec, Turn, WorkloadError
from tokwatch.figures.tokens import CharEstimate, TokenCounter, count_messages

# ShareGPT `from` values: every name seen for the user and the assistant side.
_USER_NAMES = frozenset({"human", "user"})
_ASSISTANT_NAMES = frozenset({"gpt", "assistant", "chatgpt", "bing", "model"})
_WS = " \t\r\n"


@dataclass(frozen=True, slots=True)
class TraceTurn:
    """One turn of a token-length trace: new prompt tokens, output tokens, pause before the next turn."""

    prompt_tokens: int
    output_tokens: int
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Entry:
    """One dataset entry, whatever its format; `where` is `file:line` (and the entry index in an array)."""

    where: str
    index: int
    system: str | None = None
    users: tuple[str, ...] = ()
    messages: tuple[Message, ...] | None = None  # single-turn formats: the messages as given
    trace: tuple[TraceTurn, ...] | None = None
    max_tokens: int | None = None


# --- reading ------------------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such dataset file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read: {exc}") from None


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _scan_array(text: str) -> list[tuple[int, Any]] | None:
    """The elements of a whole-file JSON array with the line each starts on; None if text follows the
    array (then the file is JSONL whose first line is an array). Raises JSONDecodeError."""
    decoder = json.JSONDecoder()
    i = _skip_ws(text, 0) + 1  # past "["
    line, counted = 1, 0
    out: list[tuple[int, Any]] = []
    i = _skip_ws(text, i)
    if i < len(text) and text[i] == "]":
        return out if _skip_ws(text, i + 1) == len(text) else None
    while True:
        value, end = decoder.raw_decode(text, i)
        line += text.count("\n", counted, i)  # counted incrementally: linear in the file size
        counted = i
        out.append((line, value))
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "]":
            return out if _skip_ws(text, i + 1) == len(text) else None
        raise json.JSONDecodeError("expected ',' or ']' after an array element", text, i)


def _is_messages(values: list[Any]) -> bool:
    return bool(values) and all(isinstance(v, dict) and "role" in v for v in values)


def read_entries(path: str | Path) -> list[tuple[str, Any]]:
    """(`where`, JSON value) of every entry: one per non-empty JSONL line, or per element of a JSON array."""
    p = Path(path)
    text = _read_text(p)
    rows: list[tuple[str, Any]] | None = None
    if text.lstrip(_WS).startswith("["):
        try:
            elements = _scan_array(text)
        except json.JSONDecodeError as exc:
            first = text.lstrip(_WS).splitlines()[0]
            try:
                json.loads(first)
            except json.JSONDecodeError:
                raise WorkloadError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg}") from None
            elements = None  # JSONL: its own line-by-line errors follow
        if elements is not None and not _is_messages([v for _, v in elements]):
            rows = [(f"{p}:{line}: entry {k}", v) for k, (line, v) in enumerate(elements)]
    if rows is None:
        rows = []
        for lineno, line_text in enumerate(text.splitlines(), 1):
            if not line_text.strip():
                continue
            try:
                rows.append((f"{p}:{lineno}", json.loads(line_text)))
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{p}:{lineno}: invalid JSON: {exc.msg}") from None
    if not rows:
        raise WorkloadError(f"{p}: the dataset is empty")
    return rows


# --- one entry -------------------------------------------------------------------------------------------


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


def _positive_int(value: Any, what: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise WorkloadError(f"{where}: {what} must be a positive integer, got {value!r}")
    return value


def _system(row: dict[str, Any], where: str) -> str | None:
    value = row.get("system")
    if value is not None and not isinstance(value, str):
        raise WorkloadError(f"{where}: system must be a string")
    return value or None


def _sharegpt_pairs(row: dict[str, Any], where: str) -> tuple[str, ...]:
    """`{"conversation": [{"human": ..., "assistant": ...}]}`: the human side of every pair."""
    users = []
    for i, pair in enumerate(row["conversation"]):
        if not isinstance(pair, dict) or not isinstance(pair.get("human"), str):
            raise WorkloadError(f"{where}: conversation[{i}] needs a string 'human' field")
        users.append(pair["human"])
    if not users:
        raise WorkloadError(f"{where}: conversation is empty")
    return tuple(users)


def _sharegpt_messages(row: dict[str, Any], where: str) -> tuple[str | None, tuple[str, ...]]:
    """`{"conversations": [{"from": "human", "value": ...}]}`: (system prompt, user turns)."""
    system = [_system(row, where)] if row.get("system") else []
    users: list[str] = []
    for i, msg in enumerate(row["conversations"]):
        if not isinstance(msg, dict) or not isinstance(msg.get("from"), str):
            raise WorkloadError(f"{where}: conversations[{i}] needs a string 'from' field")
        if not isinstance(msg.get("value"), str):
            raise WorkloadError(f"{where}: conversations[{i}] needs a string 'value' field")
        who = msg["from"].lower()
        if who in _USER_NAMES:
            users.append(msg["value"])
        elif who == "system":
            if not users:  # a system message after the first user turn is not sent
                system.append(msg["value"])
        elif who not in _ASSISTANT_NAMES:
            names = "/".join(sorted(_USER_NAMES | _ASSISTANT_NAMES | {"system"}))
            raise WorkloadError(f"{where}: conversations[{i}] has from {msg['from']!r} (use {names})")
    if not users:
        raise WorkloadError(f"{where}: conversations has no human/user turn")
    return "\n".join(s for s in system if s) or None, tuple(users)


def _trace(row: dict[str, Any], where: str) -> tuple[TraceTurn, ...]:
    turns = row["turns"]
    if not isinstance(turns, list) or not turns:
        raise WorkloadError(f"{where}: turns must be a non-empty JSON array")
    out = []
    for i, t in enumerate(turns):
        at = f"{where}: turns[{i}]"
        if not isinstance(t, dict):
            raise WorkloadError(f"{at} must be an object with prompt_tokens and output_tokens")
        wait = t.get("wait_s", 0.0)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < float("inf"):
            raise WorkloadError(f"{at}: wait_s must be a number of seconds >= 0, got {wait!r}")
        out.append(
            TraceTurn(
                _positive_int(t.get("prompt_tokens"), "prompt_tokens", at),
                _positive_int(t.get("output_tokens"), "output_tokens", at),
                float(wait),
            )
        )
    return tuple(out)


def parse_entry(where: str, index: int, row: Any) -> Entry:
    """Recognise one entry's format by its keys (docs/datasets.md); raises WorkloadError naming `where`."""
    max_tokens = None
    if isinstance(row, dict) and "max_tokens" in row:
        max_tokens = _positive_int(row["max_tokens"], "max_tokens", where)
    if isinstance(row, list):
        msgs = _messages(row, where)
    elif not isinstance(row, dict):
        raise WorkloadError(f"{where}: expected a JSON object or a messages array")
    elif isinstance(row.get("prompt"), str):
        msgs = [{"role": "user", "content": row["prompt"]}]
    elif "messages" in row:
        msgs = _messages(row["messages"], where)
    elif "conversation" in row:
        if not isinstance(row["conversation"], list):
            raise WorkloadError(f"{where}: conversation must be a JSON array of human/assistant pairs")
        users = _sharegpt_pairs(row, where)
        return Entry(where, index, _system(row, where), users, max_tokens=max_tokens)
    elif "conversations" in row:
        if not isinstance(row["conversations"], list):
            raise WorkloadError(f"{where}: conversations must be a JSON array of from/value messages")
        system, users = _sharegpt_messages(row, where)
        return Entry(where, index, system, users, max_tokens=max_tokens)
    elif "turns" in row:
        return Entry(where, index, trace=_trace(row, where))
    else:
        raise WorkloadError(
            f"{where}: expected prompt, messages, conversation, conversations (ShareGPT) or turns (trace)"
        )
    system = msgs[0]["content"] if msgs[0]["role"] == "system" else None
    users = tuple(m["content"] for m in msgs if m["role"] == "user")
    return Entry(where, index, system, users, messages=tuple(msgs), max_tokens=max_tokens)


def load_entries(path: str | Path, offset: int = 0) -> list[Entry]:
    """Every entry of the file, validated, then the first `offset` dropped (--dataset-offset)."""
    entries = [parse_entry(where, k, row) for k, (where, row) in enumerate(read_entries(path))]
    if offset >= len(entries):
        raise WorkloadError(
            f"{path}: --dataset-offset {offset} skips all {len(entries)} entries of the dataset"
        )
    return entries[offset:]


# --- requests and conversations ---------------------------------------------------------------------------


def _trace_rng(seed: int, entry: Entry) -> random.Random:
    return random.Random(f"{seed}:trace:{entry.index}")


def load_prompts(
    path: str | Path,
    output_tokens: LengthRange,
    seed: int,
    *,
    counter: TokenCounter | None = None,
    offset: int = 0,
    fixed_output: bool = True,
    entries_of: Callable[[str | Path, int], list[Entry]] | None = None,
) -> list[RequestSpec]:
    """Single-turn requests: prompts and messages as given; of a conversation, its first user turn (with
    its system prompt); of a trace, its first turn synthesised to the recorded lengths."""
    counter = counter or CharEstimate()
    rng = random.Random(seed)
    specs = []
    for e in (entries_of or load_entries)(path, offset):
        if e.trace is not None:
            first = e.trace[0]
            text = counter.text_of(first.prompt_tokens, _trace_rng(seed, e))
            msgs: tuple[Message, ...] = ({"role": "user", "content": text},)
            specs.append(RequestSpec("dataset", msgs, first.output_tokens, first.prompt_tokens, fixed_output))
            continue
        if e.messages is not None:
            msgs = e.messages
        else:
            system = ({"role": "system", "content": e.system},) if e.system else ()
            msgs = (*system, {"role": "user", "content": e.users[0]})
        specs.append(
            RequestSpec(
                "dataset",
                msgs,
                max_tokens=e.max_tokens or output_tokens.sample(rng),
                prompt_tokens_target=count_messages(msgs, counter),
            )
        )
    return specs


def load_conversations(
    path: str | Path,
    output_tokens: LengthRange,
    seed: int,
    max_turns: int | None = None,
    *,
    counter: TokenCounter | None = None,
    offset: int = 0,
    fixed_output: bool = True,
    entries_of: Callable[[str | Path, int], list[Entry]] | None = None,
) -> list[Conversation]:
    """Multi-turn conversations (seed 003): the user turns of every entry (dataset assistant replies are
    never sent), a trace's turns synthesised to its token lengths; at most `max_turns` turns each."""
    counter = counter or CharEstimate()
    rng = random.Random(seed)
    out: list[Conversation] = []
    for e in (entries_of or load_entries)(path, offset):
        if e.trace is not None:
            trng = _trace_rng(seed, e)
            turns = tuple(
                Turn(counter.text_of(t.prompt_tokens, trng), t.output_tokens, fixed_output, t.prompt_tokens,
                     t.wait_s)
                for t in e.trace
            )  # fmt: skip
        else:
            max_tokens = e.max_tokens or output_tokens.sample(rng)
            turns = tuple(Turn(text, max_tokens) for text in e.users)
        if max_turns is not None:
            turns = turns[:max_turns]
        out.append(Conversation(e.index, turns, e.system))
    return out
