"""`tokwatch bench` cost and energy: prices from options over the endpoint's config, power sampled from the
simulator's DCGM series during the run with the idle baseline measured before it, the run's energy within
1 % of the simulator's exact truth, and the cost figures from the counted tokens and the measured speed."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.counters.test_power import GPUS, MODEL
from tests.counters.test_power import config as sim_config
from tokwatch.bench.capacity import Capacity, point_from, result_tokens_per_s
from tokwatch.bench.commands import add_commands, run_compare
from tokwatch.bench.compare_store import read_stored_run
from tokwatch.bench.config import build_options
from tokwatch.bench.costing import (
    BenchPricing,
    bench_pricing,
    capacity_cost,
    capacity_cost_line,
    cost_and_energy_lines,
    cost_figures,
)
from tokwatch.bench.outcome import BenchOutcome, ExitCode
from tokwatch.bench.outputs import write_run
from tokwatch.bench.run_report import report
from tokwatch.bench.session import run_bench
from tokwatch.bench.storing import run_row, store_outcome
from tokwatch.figures.cost import MTOK, TokenPrice
from tokwatch.settings.config import load_config
from tokwatch.settings.pricing import Pricing
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.sim.testing import run_sim

# The simulated GPU server of the exporter's power tests: its DCGM series are the energy truth here too.
IDLE_W = GPUS["gpus"] * GPUS["idle_watts"]


def _cmd(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *argv])
    return int(args.func(args))


@pytest.mark.slow
async def test_run_energy_matches_the_simulators_truth_within_one_percent_with_the_idle_baseline(
    tmp_path: Path,
) -> None:
    async with run_sim(sim_config()) as sim:
        meter = sim.server("gpu").power
        assert meter is not None
        opts = build_options(
            {
                "url": f"{sim.base_url('gpu')}/v1",
                "kind": "vllm",
                "model": MODEL,
                "concurrency": 3,
                "number": 9,
                "input_tokens": "64",
                "output_tokens": "100",
                "live_interval": 60,
                "plots": False,
                "server_metrics": False,
                "power_metrics_url": f"{sim.base_url('gpu')}/dcgm/metrics",
                "power_interval": "20ms",
                "idle_baseline": "1s",  # long against a reading's stamp, off by a few ms on a busy host
                "price_input": 1.0,
                "price_output": 4.0,
                "gpu_hour": 2.0,
                "gpus": 2,
                "price_kwh": 0.3,
            }
        )
        before_t, before_j = time.monotonic(), meter.energy_j()
        outcome, out_dir = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
        after_t, after_j = time.monotonic(), meter.energy_j()

    assert outcome.complete and all(r.ok for r in outcome.records)
    summary = json.loads((out_dir / "summary.json").read_text())
    energy, cost = summary["energy"], summary["cost"]
    # Outside the run nothing ran: the simulator drew its idle power there, so the run's truth is the whole
    # span's energy less idle power over the rest of it.
    truth = (after_j - before_j) - IDLE_W * ((after_t - before_t) - energy["duration_s"])
    assert energy["duration_s"] == pytest.approx(outcome.wall_s, rel=1e-9)
    assert energy["method"] == "energy_counter" and energy["failures"] == 0
    assert energy["joules"] == pytest.approx(truth, rel=0.01)
    assert energy["idle_watts"] == pytest.approx(IDLE_W, rel=0.01)
    assert energy["idle_baseline_s"] == 1.0
    # Requests ran: the net energy is what they added over idle, per output token of every request.
    tokens = sum(r.generated_tokens for r in outcome.records)
    assert energy["output_tokens"] == tokens == 900
    assert energy["net_joules"] == pytest.approx(energy["joules"] - IDLE_W * energy["duration_s"], rel=0.02)
    assert energy["net_joules"] > 0.1 * energy["joules"]
    assert energy["joules_per_output_token"] == pytest.approx(energy["net_joules"] / tokens)

    # Hosted: the counted tokens at the prices; self-hosted: 2 GPUs at 2/h over the run and the measured rate.
    prompt = sum(r.prompt_tokens or 0 for r in outcome.measured)
    cached = cost["tokens"]["cached"]
    assert cost["tokens"] == {
        "requests": 9, "counted_by_server": 9, "prompt": prompt, "cached": cached, "output": 900,
    }  # fmt: skip
    hosted = cost["hosted"]
    assert hosted["run_cost"] == pytest.approx(((prompt - cached) * 1.0 + cached * 1.0 + 900 * 4.0) / MTOK)
    assert hosted["blended_per_mtok"] == pytest.approx((3 * 1.0 + 4.0) / 4)
    own = cost["self_hosted"]
    rate = outcome.throughput()["overall"]["generated_tokens_per_s"]
    assert own["hourly"] == 4.0 and own["run_cost"] == pytest.approx(4.0 * outcome.wall_s / 3600)
    assert own["per_output_mtok_at_measured"] == pytest.approx(4.0 / (rate * 3600) * MTOK)
    assert cost["energy_cost"] == pytest.approx(energy["joules"] / 3.6e6 * 0.3)
    # The same figures in the report and the end-of-run lines.
    report = (out_dir / "report.md").read_text()
    assert "## Cost and energy" in report and "J per output token" in report
    lines = cost_and_energy_lines(summary)
    assert lines[0].startswith("energy: ") and any(line.startswith("self-hosted (4 USD/h") for line in lines)


def test_cost_figures_on_counted_tokens_with_cache_hits(make_record: Any) -> None:
    records = [make_record(i, tokens=100) for i in range(4)]
    for r in records:
        r.prompt_tokens, r.cached_tokens = 1000, 600
    price = Pricing(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    bench = BenchPricing(price, (3, 1), "x")
    cost = cost_figures(bench, records, wall_s=10.0, output_tokens_per_s=40.0, capacity_tokens_per_s=400.0)
    assert cost["cache_hit_share"] == 0.6
    hosted = cost["hosted"]
    # 400 uncached x 2 + 600 cached x 0.5 + 100 output x 8 per request, four requests
    assert hosted["run_cost"] == pytest.approx(4 * (400 * 2 + 600 * 0.5 + 100 * 8) / MTOK)
    assert hosted["blended_per_mtok"] == pytest.approx((3 * 2 + 8) / 4)
    assert hosted["effective_per_mtok"] == pytest.approx((3 * (0.4 * 2 + 0.6 * 0.5) + 8) / 4)
    assert hosted["counted_per_mtok"] == pytest.approx(hosted["run_cost"] / 4400 * MTOK)
    assert cost["self_hosted"] is None
    gpus = BenchPricing(Pricing(gpu_hour=3.0, gpus=4), (3, 1), "x")
    own = cost_figures(gpus, records, wall_s=10.0, output_tokens_per_s=40.0, capacity_tokens_per_s=400.0)
    assert own["hosted"] is None
    assert own["self_hosted"]["per_output_mtok_at_measured"] == pytest.approx(12.0 / (40 * 3600) * MTOK)
    assert own["self_hosted"]["per_output_mtok_at_capacity"] == pytest.approx(12.0 / (400 * 3600) * MTOK)


def test_bad_prices_exit_2_with_one_line_naming_the_option(capsys: Any) -> None:
    bad = ["--url", "http://127.0.0.1:9/v1", "--model", "m", "--no-server-metrics"]
    assert _cmd([*bad, "--gpus", "2"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "gpus needs gpu_hour" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert _cmd([*bad, "--currency", "dollars"]) == ExitCode.USAGE
    assert "currency" in capsys.readouterr().err
    assert _cmd([*bad, "--price-blend", "3-1"]) == ExitCode.USAGE
    assert "INPUT:OUTPUT" in capsys.readouterr().err


async def test_a_power_url_without_power_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    async with run_sim(sim_config()) as sim:
        opts = build_options(
            {
                "url": f"{sim.base_url('gpu')}/v1",
                "kind": "vllm",
                "model": MODEL,
                "number": 1,
                "plots": False,
                "server_metrics": False,
                "power_metrics_url": f"{sim.base_url('gpu')}/metrics",  # vLLM's own, no power
                "power_interval": "20ms",
            }
        )
        with pytest.raises(ConfigError, match="no DCGM or node_exporter power reading"):
            await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
        assert not (tmp_path / "run").exists()  # nothing was sent, nothing written


def test_a_capacity_search_prices_output_at_its_result_rate(make_record: Any, tmp_path: Path) -> None:
    records = [make_record(i, tokens=50, sent=i * 0.1) for i in range(20)]
    outcome = BenchOutcome(options={}, records=records, started_at_unix=0.0, wall_s=2.0, complete=True,
                           stop_reason="finished")  # fmt: skip
    point = point_from(outcome, "rate", 10.0, tmp_path, 0.9)
    cap = Capacity(mode="fluid", dimension="rate", points=[point], criterion={}, result_rate=10.0)
    tokens_per_s = result_tokens_per_s(cap)
    assert tokens_per_s is not None and tokens_per_s == point.output_tokens_per_s > 0
    bench = BenchPricing(Pricing(gpu_hour=2.0, gpus=4, currency="EUR"), (3, 1), "options")
    cost = capacity_cost(bench, cap.result_rate, tokens_per_s)
    assert cost is not None and cost["per_output_mtok"] == pytest.approx(8.0 / (tokens_per_s * 3600) * MTOK)
    cap.cost = cost
    assert cap.to_json()["cost"] == cost
    line = capacity_cost_line(cost)
    assert line.startswith("self-hosted at capacity: ") and "EUR per output Mtok" in line
    # hosted prices, or no result: nothing to price at capacity
    hosted = BenchPricing(Pricing(input_per_mtok=1.0, output_per_mtok=2.0), (3, 1), "options")
    assert capacity_cost(hosted, 10.0, tokens_per_s) is None
    assert capacity_cost(bench, None, None) is None


def test_bench_file_keys_price_the_run_and_the_stored_summary_keeps_the_cost(
    make_record: Any, tmp_path: Path, capsys: Any
) -> None:
    bench_file = tmp_path / "bench.yml"
    bench_file.write_text(
        "url: http://127.0.0.1:9/v1\nmodel: m\nprice_input: 1.5\nprice_output: -6\n", encoding="utf-8"
    )
    assert _cmd(["--bench-file", str(bench_file)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"{bench_file}:4: price_output" in err and "Traceback" not in err
    records = [make_record(i, tokens=20) for i in range(3)]
    priced = BenchPricing(Pricing(input_per_mtok=1.5, output_per_mtok=6.0), (3, 1), "options")
    outcome = BenchOutcome(options={"endpoint": "e"}, records=records, started_at_unix=0.0, wall_s=2.0,
                           complete=True, stop_reason="finished", pricing=priced)  # fmt: skip
    stored = json.loads(run_row(outcome).summary)
    assert stored["cost"]["hosted"]["run_cost"] == pytest.approx(3 * (100 * 1.5 + 20 * 6.0) / MTOK)
    assert "energy" not in stored  # no power URL, no energy figures


def test_compare_sets_the_cost_figures_of_two_runs_side_by_side(make_record: Any, tmp_path: Path) -> None:
    def run(name: str, output_price: float) -> Path:
        price = Pricing(input_per_mtok=1.0, output_per_mtok=output_price)
        outcome = BenchOutcome(options={"load": "closed loop, concurrency 1"},
                               records=[make_record(i, tokens=20) for i in range(10)], started_at_unix=0.0,
                               wall_s=12.0, complete=True, stop_reason="finished",
                               pricing=BenchPricing(price, (3, 1), "options"))  # fmt: skip
        write_run(outcome, tmp_path / name, plots_enabled=False)
        return tmp_path / name

    a, b = run("a", 4.0), run("b", 8.0)
    code, text = run_compare(str(a), str(b), threshold=0.05, gate=["ttft:p50"], resamples=50, seed=0,
                             as_json=False, force=True)  # fmt: skip
    assert code == 0
    per_mtok_a, per_mtok_b = (100 * 1.0 + 20 * 4.0) / 120, (100 * 1.0 + 20 * 8.0) / 120
    line = next(x for x in text.splitlines() if "hosted cost per Mtok of the run's tokens (USD)" in x)
    assert f"A {per_mtok_a:.4g}, B {per_mtok_b:.4g} ({(per_mtok_b - per_mtok_a) / per_mtok_a:+.1%})" in line
    _, doc = run_compare(str(a), str(b), threshold=0.05, gate=["ttft:p50"], resamples=50, seed=0,
                         as_json=True, force=True)  # fmt: skip
    figures = json.loads(doc)["cost_and_energy"]
    assert figures["b"]["hosted cost per Mtok of the run's tokens (USD)"] == pytest.approx(per_mtok_b)


def test_bench_report_of_a_stored_run_shows_its_cost(make_record: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(
        "endpoints:\n  - name: e\n    kind: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n"
        f"storage:\n  sqlite_path: {tmp_path / 'tw.db'}\n",
        encoding="utf-8",
    )
    price = Pricing(input_per_mtok=1.0, output_per_mtok=4.0, currency="EUR")
    outcome = BenchOutcome(options={"endpoint": "e", "load": "closed loop, concurrency 1"},
                           records=[make_record(i, tokens=20) for i in range(5)], started_at_unix=1e9,
                           wall_s=6.0, complete=True, stop_reason="finished",
                           pricing=BenchPricing(price, (3, 1), "options"))  # fmt: skip
    asyncio.run(store_outcome(outcome, load_config(str(cfg))))
    code, text = report(read_stored_run(str(cfg), outcome.run_id), as_json=False)
    assert code == 0
    assert "hosted: run cost " in text and "EUR/Mtok" in text
    _, doc = report(read_stored_run(str(cfg), outcome.run_id), as_json=True)
    assert json.loads(doc)["cost"]["hosted"]["run_cost"] == pytest.approx(5 * (100 * 1.0 + 20 * 4.0) / MTOK)


def test_an_endpoints_pricing_in_the_config_prices_the_run_and_options_win_field_by_field(
    tmp_path: Path,
) -> None:
    table = tmp_path / "prices.yml"
    table.write_text("m:\n  cached_input_per_mtok: 0.25\n  currency: EUR\n", encoding="utf-8")
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(
        "endpoints:\n  - name: e\n    kind: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n"
        "    pricing: {input_per_mtok: 1.0, output_per_mtok: 4.0, currency: EUR}\n"
        f"pricing:\n  blend: '1:1'\n  table: {table}\n",
        encoding="utf-8",
    )
    base = {"endpoint": "e", "config": str(cfg)}
    configured = bench_pricing(build_options(base), "m")
    assert configured is not None and configured.source == "config" and configured.blend == (1.0, 1.0)
    assert configured.pricing.token_price() == TokenPrice(1.0, 4.0, 0.25)
    assert configured.pricing.currency == "EUR"
    mixed = bench_pricing(build_options({**base, "price_output": 5.0, "currency": "EUR"}), "m")
    assert mixed is not None and mixed.source == "options over config"
    assert mixed.pricing.token_price() == TokenPrice(1.0, 5.0, 0.25)


async def test_the_endpoints_power_metrics_url_in_the_config_is_read_by_default(tmp_path: Path) -> None:
    async with run_sim(sim_config()) as sim:
        cfg = tmp_path / "tokwatch.yml"
        cfg.write_text(
            f"endpoints:\n  - name: e\n    kind: vllm\n    base_url: {sim.base_url('gpu')}/v1\n"
            f"    model: {MODEL}\n"
            f"    power_metrics_url: {sim.base_url('gpu')}/dcgm/metrics\n",
            encoding="utf-8",
        )
        opts = build_options({"endpoint": "e", "config": str(cfg), "number": 2, "output_tokens": "20",
                              "plots": False, "server_metrics": False, "power_interval": "20ms",
                              "idle_baseline": "500ms"})  # fmt: skip
        outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
    energy = outcome.summary()["energy"]
    assert energy["source"] == f"{sim.base_url('gpu')}/dcgm/metrics" and energy["joules"] > 0
    assert energy["idle_watts"] == pytest.approx(IDLE_W, rel=0.05)  # the accuracy test is the first one
