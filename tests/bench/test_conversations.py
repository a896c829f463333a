"""Multi-turn figures: cache-hit rates and per-conversation figures from hand-made records, then a
conversation run against the simulator (a subprocess) whose prefix cache reports cached_tokens."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from rich.console import Console

from tests.bench.processes import sim_process
from tokwatch.bench.config import build_options
from tokwatch.bench.conversations import cache_rates, trace_summary, turn_summary
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.session import run_bench
from tokwatch.figures.result import Status

SIM = """listen: 127.0.0.1:{port}
servers:
  - name: oa
    dialect: openai
    models: [{{name: m, decode_tps: 500, prefill_tps: 20000}}]
  - name: nocache
    dialect: openai
    prefix_caching: false
    models: [{{name: m, decode_tps: 500, prefill_tps: 20000}}]
  - name: vl
    dialect: vllm
    models: [{{name: m, decode_tps: 500, prefill_tps: 20000}}]
"""


def _turn(make: Callable[..., RequestRecord], i: int, conv: int, turn: int, of: int, **kw) -> RequestRecord:
    return make(i, conversation_id=conv, turn=turn, turns=turn + 1, conversation_turns=of, **kw)


def test_cache_rates_and_trace_figures(make_record):
    c0 = [
        _turn(make_record, 0, 0, 0, 3, sent=0.0, ttft=0.5, history_tokens=0),
        _turn(make_record, 1, 0, 1, 3, sent=2.0, ttft=0.1, history_tokens=150, wait_before_s=0.5),
        _turn(make_record, 2, 0, 2, 3, sent=4.0, ttft=0.2, history_tokens=250),
    ]
    for r, prompt, cached in zip(c0, (100, 200, 300), (0, 96, 240), strict=True):
        r.prompt_tokens, r.cached_tokens = prompt, cached
    abandoned = [
        _turn(make_record, 3, 1, 0, 2, sent=0.0, ttft=0.3, history_tokens=0),
        _turn(make_record, 4, 1, 1, 2, sent=1.0, status=Status.PROVIDER_ERROR),
    ]
    abandoned[0].cached_tokens = 0
    records = c0 + abandoned
    rates = cache_rates([r for r in records if r.ok])
    assert rates["cache_hit_rate"] == pytest.approx(336 / 700)  # turn 1 counts in the denominator
    assert rates["eligible_cache_hit_rate"] == pytest.approx(336 / 400)  # cacheable prefix of turns > 1 only
    assert rates["history_hit_estimate"] == pytest.approx(400 / 700)

    summary = trace_summary(records, 1)
    assert summary["conversations"] == {"started": 2, "completed": 1, "abandoned": 1}
    (t,) = summary["traces"]
    last = c0[-1]
    assert t["latency_s"] == pytest.approx(last.completed_at_s - 0.0)
    assert t["first_turn_ttft_s"] == 0.5
    assert t["ttfat_s"] == pytest.approx(4.0 + 0.2)
    tps = [10 / (r.e2e_s - r.ttft_s) for r in c0]  # 11 tokens: (n - 1) / (latency - ttft) per turn
    assert t["decode_tokens_per_s"] == pytest.approx(sum(tps) / 3)
    assert t["cache_hit_rate"] == pytest.approx(336 / 600) and t["wait_s"] == 0.5
    assert (
        summary["figures"]["ttfat_s"]["count"] == 1 and summary["figures"]["ttfat_s"]["max"] == t["ttfat_s"]
    )

    turns = turn_summary(records)
    assert turns["ttft_first_turn"]["count"] == 2 and turns["ttft_first_turn"]["mean"] == pytest.approx(0.4)
    assert turns["ttft_later_turns"]["count"] == 2 and turns["ttft_later_turns"]["p50"] == pytest.approx(0.15)
    assert turns["turns_per_request_mean"] == pytest.approx((1 + 2 + 3 + 1) / 4)


def test_no_cached_tokens_reported_gives_no_real_rate(make_record):
    records = [_turn(make_record, i, 0, i, 2, sent=float(i), history_tokens=50 * i) for i in range(2)]
    rates = cache_rates(records)
    assert rates["cache_hit_rate"] is None and rates["eligible_cache_hit_rate"] is None
    assert rates["history_hit_estimate"] == pytest.approx(50 / 200)
    assert trace_summary(records, 1)["traces"][0]["cache_hit_rate"] is None


@pytest.fixture
async def sim_root(tmp_path: Path) -> AsyncIterator[str]:
    """`python -m tokwatch sim` in a subprocess: servers oa (prefix cache), nocache and vl (vLLM dialect)."""
    async with sim_process(tmp_path, SIM) as (_, port):
        yield f"http://127.0.0.1:{port}"


async def _run(tmp_path: Path, url: str, name: str, **kw) -> tuple[dict, Path]:
    opts = build_options({
        "url": url, "model": "m", "dataset": "random-multi-turn", "multi_turn": True, "min_turns": 3,
        "max_turns": 3, "input_tokens": "40", "output_tokens": "8", "parallel": 2, "number": 4,
        "plots": False, "live_interval": 60, "server_metrics": False, **kw,
    })  # fmt: skip
    _, out = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / name)
    return json.loads((out / "summary.json").read_text()), out


async def test_conversations_against_the_simulator(sim_root: str, tmp_path: Path) -> None:
    summary, out = await _run(tmp_path, f"{sim_root}/oa/v1", "oa")
    assert summary["requests"]["ok"] == 12
    lines = [json.loads(x) for x in (out / "request_level_metrics.jsonl").read_text().splitlines()]
    assert all(r["turns"] == r["turn"] + 1 and r["conversation_turns"] == 3 for r in lines)
    assert all(r["cached_tokens"] == 0 for r in lines if r["turn"] == 0)  # random words: nothing to reuse
    later = [r for r in lines if r["turn"] > 0]
    # the previous turn's prompt is reused in full 16-token blocks; its reply and the new message are not
    assert all(0 < r["cached_tokens"] <= r["history_tokens"] for r in later)

    multi = summary["multi_turn"]
    assert multi["turns_per_request_mean"] == pytest.approx(2.0)
    assert 0 < multi["history_hit_estimate"] < 1
    assert 0 < multi["cache_hit_rate"] < multi["eligible_cache_hit_rate"] <= 1
    assert multi["ttft_first_turn"]["count"] == 4 and multi["ttft_later_turns"]["count"] == 8
    assert multi["ttft_first_turn"]["p50"] > 0 and multi["ttft_later_turns"]["p99"] > 0

    traces = json.loads((out / "trace_summary.json").read_text())
    assert traces["schema_version"] == 1
    assert traces["conversations"] == {"started": 4, "completed": 4, "abandoned": 0}
    for t in traces["traces"]:
        assert t["turns"] == 3 and t["latency_s"] > t["ttfat_s"] >= t["first_turn_ttft_s"] > 0
        assert t["decode_tokens_per_s"] > 0 and 0 < t["cache_hit_rate"] < t["eligible_cache_hit_rate"] <= 1
    for name in ("latency_s", "first_turn_ttft_s", "ttfat_s", "decode_tokens_per_s", "cache_hit_rate",
                 "eligible_cache_hit_rate"):  # fmt: skip
        fig = traces["figures"][name]
        assert fig["count"] == 4 and fig["p50"] <= fig["p90"] <= fig["p99"] <= fig["max"]
    report = (out / "report.md").read_text()
    assert "## Conversations" in report and "| first turn | 4 |" in report and "TTFAT (s)" in report


async def test_cache_off_and_cached_tokens_absent(sim_root: str, tmp_path: Path) -> None:
    off, _ = await _run(tmp_path, f"{sim_root}/nocache/v1", "nocache", number=2)
    assert off["multi_turn"]["cache_hit_rate"] == 0 and off["multi_turn"]["eligible_cache_hit_rate"] == 0
    assert off["multi_turn"]["history_hit_estimate"] > 0  # the estimate does not depend on the server
    absent, out = await _run(tmp_path, f"{sim_root}/vl/v1", "vl", kind="vllm", number=2)
    assert absent["multi_turn"]["requests_reporting_cached_tokens"] == 0
    assert (
        absent["multi_turn"]["cache_hit_rate"] is None
        and absent["multi_turn"]["eligible_cache_hit_rate"] is None
    )
    assert "reported no cached_tokens" in (out / "report.md").read_text()


async def test_single_turn_runs_have_no_conversation_figures(tmp_path, stream_server):
    opts = build_options({"url": stream_server.url, "model": "m", "number": 3, "plots": False,
                          "live_interval": 60, "server_metrics": False})  # fmt: skip
    _, out = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
    assert "multi_turn" not in json.loads((out / "summary.json").read_text())
    assert not (out / "trace_summary.json").exists()
    assert "## Conversations" not in (out / "report.md").read_text()
