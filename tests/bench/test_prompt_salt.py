"""Fresh prompts per run: the salt and the nonces by hand, what reaches a server, and the prefix cache of
the simulator (a subprocess): two identical default runs measure prefill, `--repeat-prompts` the cache."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from rich.console import Console

from tests.bench.processes import sim_process
from tokwatch.bench.client import Deadlines, Target, execute
from tokwatch.bench.config import build_options
from tokwatch.bench.health import run_checks
from tokwatch.bench.prompt_cache import cache_figures, outside_history
from tokwatch.bench.prompt_salt import (
    NONCE_TOKENS,
    PromptSalt,
    SaltedConversations,
    SaltedPrompts,
    run_salt,
)
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.session import run_bench
from tokwatch.bench.workload import Conversation, LengthRange, RequestSpec, SyntheticConversations, Turn
from tokwatch.figures.tokens import CharEstimate
from tokwatch.settings.redact import Redactor
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.transport.http import HttpClient

SIM = """listen: 127.0.0.1:{port}
servers:
  - name: oa
    dialect: openai
    models: [{{name: m, decode_tps: 1000, prefill_tps: 2000}}]
  - name: lc
    dialect: llamacpp
    models: [{{name: m, decode_tps: 1000, prefill_tps: 2000}}]
"""


def _salt(salt: str | None = "abc123", seed: int = 0) -> PromptSalt:
    return PromptSalt(salt, seed, CharEstimate())


def test_the_salt_comes_from_the_run_id_unless_prompts_repeat() -> None:
    salt = run_salt("0123456789abcdef0123", repeat_prompts=False)
    assert salt is not None and len(salt) == 12 and salt == run_salt("0123456789abcdef0123", False)
    # Ids given with --run-id often share a prefix: the salt comes from the whole id.
    assert run_salt("load-2025-05-01", False) != run_salt("load-2025-05-02", False)
    assert run_salt("0123456789abcdef0123", repeat_prompts=True) is None


def test_nonces_are_short_unique_and_reproducible() -> None:
    salt = _salt()
    nonce = salt.nonce(0)
    assert nonce.endswith("\n") and len(nonce.split()) == NONCE_TOKENS
    assert nonce == _salt().nonce(0)  # the same run, the same send: the same nonce
    assert len({salt.nonce(i) for i in range(200)}) == 200
    assert nonce != _salt(seed=1).nonce(0)  # another seed
    assert nonce != _salt("fff000").nonce(0)  # another run
    assert _salt(None).nonce(0) == ""  # --repeat-prompts: the dataset's text as it is


def test_a_nonce_goes_before_the_first_message_and_into_the_target() -> None:
    salt = _salt()
    spec = RequestSpec("dataset", ({"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Hi"}), 8, prompt_tokens_target=5)  # fmt: skip
    salted = salt.spec(spec, 3)
    nonce = salt.nonce(3)
    assert salted.messages[0] == {"role": "system", "content": nonce + "Be brief."}
    assert salted.messages[1] == spec.messages[1]
    assert salted.prompt_tokens_target == 5 + CharEstimate().count(nonce)
    assert _salt(None).spec(spec, 3) is spec

    conv = Conversation(7, (Turn("first", 4, tokens=1), Turn("second", 4, tokens=1)))
    c = salt.conversation(conv, 9)
    assert c.turns[0].text == salt.nonce(9) + "first" and c.turns[1] == conv.turns[1]
    assert c.turns[0].tokens == 1 + CharEstimate().count(salt.nonce(9))
    with_system = salt.conversation(Conversation(7, conv.turns, system="You help."), 9)
    assert with_system.system == salt.nonce(9) + "You help." and with_system.turns == conv.turns


def test_cycled_dataset_entries_are_fresh_on_every_send() -> None:
    specs = [RequestSpec("dataset", ({"role": "user", "content": t},), 8) for t in ("a", "b")]
    source = SaltedPrompts(specs, _salt())
    sent = [source.request_at(i).messages[0]["content"] for i in range(6)]
    assert [s.rsplit("\n", 1)[1] for s in sent] == ["a", "b"] * 3 and len(set(sent)) == 6
    convs = SaltedConversations([Conversation(0, (Turn("x", 4),))], _salt())
    assert convs[0].turns[0].text != convs[1].turns[0].text  # the same entry, cycled: another nonce
    assert convs[1].turns[0].text.endswith("\nx") and len(convs) > 10**9


def test_synthetic_conversations_keep_their_lengths_and_change_their_words() -> None:
    def conv(salt: str | None) -> Conversation:
        lengths = (LengthRange(16, 16), LengthRange(8, 8), LengthRange(3, 3))
        return SyntheticConversations(*lengths, 0, salt=salt)[5]

    a, b = conv("run-a"), conv("run-b")
    assert [t.tokens for t in a.turns] == [t.tokens for t in b.turns]
    assert all(x.text != y.text for x, y in zip(a.turns, b.turns, strict=True))
    assert conv(None) == conv(None)


def test_prompt_salt_is_not_an_input() -> None:
    with pytest.raises(ConfigError, match="prompt_salt: set by tokwatch for each run"):
        build_options({"url": "http://127.0.0.1:9/v1", "model": "m", "prompt_salt": "x"})


def test_cached_tokens_outside_history_and_template(make_record) -> None:
    # 100-token prompts (the template adds 20 to the 80 the client wrote); a first turn, a later turn whose
    # 60 cached tokens are its history, and a repeated prompt whose 99 cached tokens are not.
    fresh = make_record(0, cached_tokens=20, history_tokens=0)
    later = make_record(1, cached_tokens=60, history_tokens=70)
    repeat = make_record(2, cached_tokens=99)
    for r in (fresh, later, repeat):
        r.prompt_tokens_target = 80
    assert [outside_history(r) for r in (fresh, later, repeat)] == [0, 0, 79]
    fig = cache_figures([fresh, later, repeat, make_record(3)])  # the last reports no cached count
    assert fig["requests"] == 4 and fig["requests_reporting_cached_tokens"] == 3
    assert (fig["prompt_tokens"], fig["cached_tokens"], fig["template_tokens"]) == (300, 179, 60)
    assert fig["cached_share"] == pytest.approx(179 / 300)
    assert fig["cached_outside_history_share"] == pytest.approx(79 / 300)


# --- llama-server's cache_n without usage details --------------------------------------------------------


async def _llama_answer(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    delta = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    await resp.write(f"data: {json.dumps(delta)}\n\n".encode())
    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
             "timings": {"prompt_n": 10, "cache_n": 90, "prompt_ms": 5.0, "predicted_n": 1,
                         "predicted_ms": 1.0}}  # fmt: skip
    await resp.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
    return resp


async def test_llama_timings_give_cached_and_whole_prompt_counts(serve) -> None:
    root = await serve({"/v1/chat/completions": _llama_answer})
    record = RequestRecord(0, "chat", max_tokens=1)
    async with HttpClient() as http:
        target = Target("llamacpp", f"{root}/v1", "m", None, 10.0)
        await execute(http, target, [{"role": "user", "content": "x"}], record, run_t0=0.0,
                      deadlines=Deadlines(1.0, 0.05), redactor=Redactor([]))  # fmt: skip
    assert record.ok and record.cached_tokens == 90
    assert record.prompt_tokens == 100  # prompt_n counts only the evaluated (uncached) tokens


# --- the simulator's prefix cache ------------------------------------------------------------------------


@pytest.fixture
async def sim_root(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async with sim_process(tmp_path_factory.mktemp("sim"), SIM) as (_, port):
        yield f"http://127.0.0.1:{port}"


async def _run(url: str, kind: str, out: Path, **kw: object) -> tuple[dict, list]:
    opts = build_options({
        "url": url, "kind": kind, "model": "m", "concurrency": 1, "number": 8, "input_tokens": "256",
        "output_tokens": "4", "plots": False, "live_interval": 60, "server_metrics": False, **kw,
    })  # fmt: skip
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=out)
    summary = json.loads((out / "summary.json").read_text())
    return summary, run_checks(outcome)


@pytest.mark.slow
@pytest.mark.parametrize(("server", "kind"), [("oa", "openai"), ("lc", "llamacpp")])
async def test_identical_default_runs_measure_prefill_and_repeated_prompts_the_cache(
    sim_root: str, tmp_path: Path, server: str, kind: str
) -> None:
    url = f"{sim_root}/{server}/v1"
    a, _ = await _run(url, kind, tmp_path / "a")
    b, checks_b = await _run(url, kind, tmp_path / "b")
    c, _ = await _run(url, kind, tmp_path / "c", seed=0, repeat_prompts=True)
    d, checks_d = await _run(url, kind, tmp_path / "d", seed=0, repeat_prompts=True)
    ttft = {k: s["metrics"]["ttft"]["p50"] for k, s in zip("abcd", (a, b, c, d), strict=True)}
    share = {k: s["prompt_cache"]["cached_outside_history_share"] for k, s in zip("abcd", (a, b, c, d),
                                                                                    strict=True)}  # fmt: skip
    print(f"{kind}: TTFT p50 ms {({k: round(v * 1e3, 1) for k, v in ttft.items()})}; cached share beyond "
          f"history {share}")  # fmt: skip
    assert a["options"]["prompt_salt"] != b["options"]["prompt_salt"] and c["options"]["prompt_salt"] is None
    # Two identical default commands: nothing cached beyond the template, the same prefill-bound TTFT.
    assert a["prompt_cache"]["requests_reporting_cached_tokens"] == 8
    assert share["a"] == share["b"] == 0.0
    assert abs(ttft["b"] / ttft["a"] - 1) < 0.25  # about 170 ms of simulated prefill each
    assert {c.name: c.verdict for c in checks_b}["prompt cache"] == "PASS"
    # --seed 0 --repeat-prompts twice: the first run is cold, the second is answered from the cache.
    assert share["c"] == 0.0 and share["d"] > 0.5
    assert ttft["d"] < 0.5 * ttft["c"]
    warn = {c.name: c for c in checks_d}["prompt cache"]
    assert warn.verdict == "WARN" and "--repeat-prompts" in warn.detail
    assert "[WARN] prompt cache" in (tmp_path / "d" / "health_checks.txt").read_text()


async def test_worker_processes_and_conversations_send_fresh_prompts(tmp_path: Path, stream_server) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    await run_bench(build_options({
        "url": stream_server.url, "model": "m", "dataset": str(data), "number": 8, "workers": 2, "rate": 50,
        "plots": False, "live_interval": 60, "server_metrics": False,
    }), console=Console(quiet=True), out_dir=tmp_path / "w")  # fmt: skip
    firsts = [b["messages"][0]["content"] for b in stream_server.bodies]
    assert len(firsts) == 8 and len(set(firsts)) == 8  # two entries, two workers, every send its own
    stream_server.bodies.clear()
    convs = tmp_path / "convs.jsonl"
    convs.write_text(json.dumps([{"role": "user", "content": f"t{t}"} for t in range(3)]) + "\n")
    await run_bench(build_options({
        "url": stream_server.url, "model": "m", "dataset": str(convs), "multi_turn": True, "parallel": 1,
        "number": 2, "output_tokens": "2", "plots": False, "live_interval": 60, "server_metrics": False,
    }), console=Console(quiet=True), out_dir=tmp_path / "c")  # fmt: skip
    bodies = stream_server.bodies
    assert len(bodies) == 6
    # One nonce per conversation, resent in every turn (the history stays a reusable prefix) ...
    assert len({b["messages"][0]["content"] for b in bodies[:3]}) == 1
    # ... and the same file entry, cycled, starts a fresh one.
    assert bodies[0]["messages"][0]["content"] != bodies[3]["messages"][0]["content"]
    assert bodies[3]["messages"][0]["content"].endswith("\nt0")

