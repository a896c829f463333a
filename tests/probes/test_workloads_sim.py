"""Workloads against the simulator, whose models have a known decode and prefill rate: three prompt sizes
measured against the truth, fresh prompts no prefix cache can serve, the prompt size checked, cache-assisted
runs told apart, and a workload that does not fit the model's context named in a distinct error."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tokwatch.counters import ServerCounters
from tokwatch.figures.result import PrefillSource, RunResult, Status, TimingSource
from tokwatch.probes import get_probe
from tokwatch.probes.base import ProbeContext, ProbeLog, prompt_sizer, run_probe
from tokwatch.probes.prompts import RecentStarts, sized_prompt
from tokwatch.probes.status import CONTEXT_EXCEEDED
from tokwatch.settings.config import EndpointSettings, ProbeSettings
from tokwatch.settings.workloads import PRESETS, Workload
from tokwatch.sim.text import count_prompt_tokens
from tokwatch.transport.http import HttpClient

DECODE_TPS = 1000.0
PREFILL_TPS = 4000.0
# The three public tiers; `long` shrunk so the test stays short (its prefill still takes 0.75 s here).
WORKLOADS = (PRESETS["short"], PRESETS["medium"], Workload(name="long", input_tokens=3000, output_tokens=200))
DECODE_REL = 0.01  # every decode figure within 1 % of the simulator's truth
# The client's prefill time is TTFT: it also holds the first token's decode step, the loopback round trip
# and both event loops' latency (no queue here). Stated bound: at most one decode step and 100 ms more than
# the true prefill time (on a loaded 2-core host; 5-15 ms on a quiet one).
CLIENT_PREFILL_SLACK_S = 1.0 / DECODE_TPS + 0.1


def _decode_truth(dialect: str, truth: Any) -> float:
    """The simulator's true decode rate as the source defines it: Ollama's engine figure counts every token's
    decode step from the end of prefill (eval_duration); the others (tokens - 1) over first to last token."""
    if dialect == "ollama":
        return float(truth.tokens / (truth.generated_at[-1] - truth.prefill_end))
    return float(truth.decode_tps)


def _ctx(http: HttpClient, url: str, kind: str, workload: Workload, **settings: Any) -> ProbeContext:
    ep = EndpointSettings(name=kind, kind=kind, base_url=url, model="m", scrape_interval=0.5, timeout=60)
    return ProbeContext(
        endpoint=ep,
        settings=ProbeSettings(**settings),
        http=http,
        api_key=None,
        log=ProbeLog(),
        counters=ServerCounters(ep, http).window if kind == "vllm" else None,
        workload=workload,
    )


@pytest.mark.parametrize(
    ("dialect", "decode_source", "prefill_source"),
    [
        ("vllm", TimingSource.VLLM_METRICS, PrefillSource.CLIENT_TTFT),
        ("llamacpp", TimingSource.ENGINE, PrefillSource.ENGINE),
        ("ollama", TimingSource.ENGINE, PrefillSource.ENGINE),
    ],
)
async def test_three_workloads_find_the_decode_and_prefill_truth(
    start_sim,
    server,
    http: HttpClient,
    dialect: str,
    decode_source: TimingSource,
    prefill_source: PrefillSource,
) -> None:
    sim = await start_sim(server("s", dialect, decode_tps=DECODE_TPS, prefill_tps=PREFILL_TPS))
    for workload in WORKLOADS:
        ctx = _ctx(http, sim.base_url("s"), dialect, workload)
        r = await run_probe(get_probe(dialect), ctx)
        truth = sim.last_truth("s")
        assert r.status is Status.OK, (workload.name, r.error_class, r.error_message)
        assert r.workload == workload.name and r.prompt_target_tokens == workload.input_tokens
        assert r.output_tokens == workload.output_tokens
        # the prompt the server counted is the one asked for (the simulator counts 1.3 tokens a word)
        assert r.prompt_tokens == truth.prompt_tokens and not r.prompt_size_missed
        assert abs(truth.prompt_tokens - (workload.input_tokens or 0)) <= 0.1 * (workload.input_tokens or 0)
        # reproducible from the stored run: its prompt seed (the run id, or `run_id/n`) and filler word
        # count give the very prompt sent
        assert r.prompt_words is not None and r.prompt_seed is not None and r.prompt_seed.startswith(r.run_id)
        assert count_prompt_tokens([sized_prompt(r.prompt_seed, r.prompt_words)]) == truth.prompt_tokens
        assert truth.cached_tokens == 0 and not r.cache_assisted  # fresh: nothing from the prefix cache
        assert r.source is decode_source and truth.decode_tps is not None
        decode_truth = _decode_truth(dialect, truth)
        assert r.tokens_per_second == pytest.approx(decode_truth, rel=DECODE_REL), workload.name
        assert r.prefill_source is prefill_source and truth.prefill_tps == pytest.approx(PREFILL_TPS)
        assert r.prefill_tokens_per_second is not None
        if prefill_source is PrefillSource.ENGINE:
            assert r.prefill_tokens_per_second == pytest.approx(truth.prefill_tps, rel=0.01), workload.name
        client = r.prefill_candidates.get(PrefillSource.CLIENT_TTFT)
        assert client is not None
        computed = truth.prompt_tokens - truth.cached_tokens
        measured_s, true_s = computed / client, computed / PREFILL_TPS
        assert true_s <= measured_s <= true_s + CLIENT_PREFILL_SLACK_S, (workload.name, measured_s, true_s)


async def test_consecutive_timed_runs_never_hit_the_prefix_cache(start_sim, server, http: HttpClient) -> None:
    """The simulator's prefix cache serves any earlier prompt's leading messages: fresh prompts get none of
    it, while the same prompt twice (the behaviour before) is served from it and counted apart."""
    sim = await start_sim(server("s", "llamacpp", decode_tps=DECODE_TPS, prefill_tps=PREFILL_TPS))
    endpoint = EndpointSettings(name="e", kind="llamacpp", base_url="http://127.0.0.1:1", model="m")
    sizer = prompt_sizer(endpoint, PRESETS["short"])
    starts = RecentStarts()
    runs: list[RunResult] = []
    for _ in range(3):
        ctx = _ctx(http, sim.base_url("s"), "llamacpp", PRESETS["short"])
        # as the exporter does: one sizer per endpoint and workload, one memory of its latest prompts' starts
        ctx.prompts, ctx.starts = sizer, starts
        runs.append(await run_probe(get_probe("llamacpp"), ctx))
    assert [r.cached_tokens for r in runs] == [0, 0, 0] and not any(r.cache_assisted for r in runs)
    prompts = [sized_prompt(r.prompt_seed or "", r.prompt_words or 0) for r in runs]
    # no two consecutive prompts share even their first word (nor do the warm-ups in between)
    assert all(a.split()[0] != b.split()[0] for a, b in itertools.pairwise(prompts))
    assert len(set(starts)) == 6  # three warm-ups and three timed runs, each starting its own way
    # seed000 with `timed_prompt: same` and a system prompt longer than a chat template's preamble: the
    # timed run repeats the warm-up's prompt, the cache serves all of it but the last token
    system = " ".join(["Answer as a patient physics teacher would."] * 20)
    seed000 = PRESETS["seed000"]
    ctx = _ctx(http, sim.base_url("s"), "llamacpp", seed000, timed_prompt="same", system_prompt=system)
    same = await run_probe(get_probe("llamacpp"), ctx)
    assert same.status is Status.OK and same.prompt_tokens is not None and same.cached_tokens is not None
    assert same.cached_tokens == same.prompt_tokens - 1 > 64 and same.cache_assisted
    ctx = _ctx(http, sim.base_url("s"), "llamacpp", PRESETS["seed000"], system_prompt=system)
    fresh = await run_probe(get_probe("llamacpp"), ctx)  # `unique`: a fresh sentence leads the system prompt
    assert fresh.cached_tokens == 0 and not fresh.cache_assisted


@pytest.mark.parametrize("dialect", ["vllm", "openai", "llamacpp", "sglang"])
async def test_a_workload_beyond_the_context_is_its_own_error_naming_the_workload(
    start_sim, server, http: HttpClient, dialect: str
) -> None:
    sim = await start_sim(server("s", dialect, decode_tps=DECODE_TPS, context_tokens=800))
    kind = "openai" if dialect == "sglang" else dialect
    r = await run_probe(get_probe(kind), _ctx(http, sim.base_url("s"), kind, PRESETS["medium"]))
    assert (r.status, r.error_class, r.http_status) == (Status.PROVIDER_ERROR, CONTEXT_EXCEEDED, 400)
    assert r.error_message is not None
    named = "workload medium (1000 input + 1000 output tokens) does not fit the model's context"
    assert r.error_message.startswith(named), r.error_message
    # a workload that fits is measured as usual
    r = await run_probe(get_probe(kind), _ctx(http, sim.base_url("s"), kind, PRESETS["short"]))
    assert r.status is Status.OK, r.error_message


async def test_ollama_truncating_a_long_prompt_is_flagged_as_missing_its_size(
    start_sim, server, http: HttpClient
) -> None:
    """Ollama keeps only num_ctx tokens of a longer prompt and answers: the server's count shows it."""
    sim = await start_sim(server("s", "ollama", decode_tps=DECODE_TPS, context_tokens=700))
    ctx = _ctx(http, sim.base_url("s"), "ollama", PRESETS["medium"], warmup=False)
    r = await run_probe(get_probe("ollama"), ctx)
    assert r.status is Status.OK and r.prompt_tokens == 700 and r.prompt_size_missed
    missed = "prompt size missed: the server counted 700 prompt tokens for the 1000"
    assert any(missed in line for line in ctx.log.lines)
