"""`tokwatch bench` and `tokwatch bench compare`: argument parsing, bench-file merging, the run itself and
the exit code."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console

from tokwatch.bench.accuracy import (
    AccuracyLmevalEvaluator,
    accuracy_evaluator,
    accuracy_flag_values,
    accuracy_limit,
)
from tokwatch.bench.arrivals import ARRIVAL_KINDS
from tokwatch.bench.compare import (
    DEFAULT_GATE,
    CompareError,
    Run,
    compare,
    parse_gate,
    regressions,
    render_table,
    shape_lines,
)
from tokwatch.bench.compare_store import load_runs
from tokwatch.bench.config import BenchOptions, build_options, load_bench_file
from tokwatch.bench.costing import (
    bench_pricing,
    capacity_cost,
    capacity_cost_line,
    compare_lines,
    cost_and_energy_lines,
)
from tokwatch.bench.fluidity import FLUIDITY_MODES
from tokwatch.bench.health import run_checks
from tokwatch.bench.outcome import BenchOutcome, ExitCode
from tokwatch.bench.overview import Rung, tables
from tokwatch.bench.run_report import cmd_report
from tokwatch.bench.rungs import paired_rungs, rung_dir
from tokwatch.bench.slo import SloError
from tokwatch.bench.workload import WorkloadError
from tokwatch.probes import PROBES
from tokwatch.probes.keys import endpoint_secrets
from tokwatch.settings.argtypes import http_url, listen_address
from tokwatch.settings.config import Config, load_config
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.transport.measurement import new_loop

if TYPE_CHECKING:
    from tokwatch.bench.capacity import Capacity

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Flag:
    """One option of `tokwatch bench`: its flags and argparse settings, and where its value goes.

    `action` None: the flag takes one value (converted by `type`); otherwise argparse's `store_true`,
    `store_false` or `append`. A given value of a `bench_option` sets the BenchOptions field `into` (else the
    dest; a repeated flag's values as a tuple), over the bench file's, or adds to the bench file's list
    where `extends`. Not bench options: compare's own flags, the bench file itself, --no-store."""

    flags: tuple[str, ...]
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[Any] | None = None
    action: str | None = None
    default: Any = None
    dest: str | None = None
    bench_option: bool = True
    into: str | None = None
    extends: bool = False
    nargs: str | None = None  # "+": the flag takes one or more values (a list)

    @property
    def name(self) -> str:
        """argparse's dest: `dest`, else the long flag without dashes."""
        return self.dest or self.flags[0].lstrip("-").replace("-", "_")

    @property
    def option(self) -> str | None:
        """The BenchOptions field this flag sets; None for a flag that is not a bench option."""
        return (self.into or self.name) if self.bench_option else None

    def add_to(self, group: Any) -> None:
        """Register the flag on an argparse group."""
        kwargs: dict[str, Any] = {"help": self.help, "default": self.default}
        for key in ("type", "choices", "action", "dest", "nargs"):
            if getattr(self, key) is not None:
                kwargs[key] = getattr(self, key)
        group.add_argument(*self.flags, **kwargs)


def _flag(*flags: str, help: str | None = None, **settings: Any) -> Flag:  # `help`: argparse's name
    return Flag(flags, help, **settings)


# Every option of `tokwatch bench`, once, by help group: the parser and the options a command line gives are
# both read from here (options_from_args).
FLAG_GROUPS: tuple[tuple[str, tuple[Flag, ...]], ...] = (
    (
        "compare",
        (
            _flag(
                "--threshold",
                default="5%",
                bench_option=False,
                help="relative change that counts as worse (5%%)",
            ),
            _flag(
                "--gate",
                action="append",
                bench_option=False,
                help=f"figure:stat that decides the exit code (repeatable; default {','.join(DEFAULT_GATE)})",
            ),
            _flag("--resamples", type=int, default=400, bench_option=False, help="bootstrap resamples (400)"),
            _flag(
                "--format",
                choices=["table", "json"],
                default="table",
                bench_option=False,
                help="compare and report output",
            ),
            _flag(
                "--force",
                action="store_true",
                default=False,
                bench_option=False,
                help="compare runs under different load shapes (loop, concurrency/rate, arrivals, token "
                "lengths, prompt-cache share) anyway; the output says how they differ",
            ),
        ),
    ),
    (
        "target",
        (
            _flag("--endpoint", help="endpoint name from --config"),
            _flag(
                "--config",
                "-c",
                help="tokwatch.yml defining --endpoint; its store (storage:) also receives the run. Without "
                "--config nothing is stored. With compare: the store that stored run ids are read from",
            ),
            _flag("--url", type=http_url, help="base URL, e.g. http://127.0.0.1:8000/v1"),
            _flag("--kind", choices=list(PROBES), help="API dialect"),
            _flag("--model", help="model name (default: the endpoint's)"),
            _flag("--api-key-env", help="environment variable holding the API key (with --url)"),
            _flag("--timeout", help="per-request timeout, e.g. 300s"),
            _flag(
                "--bench-file",
                bench_option=False,
                help="YAML file with any of these options and a seed-002 `slos:` list",
            ),
        ),
    ),
    (
        "load",
        (
            _flag("--concurrency", type=int, help="closed loop with N concurrent requests"),
            _flag("--rate", type=float, help="open loop at R requests/s"),
            _flag("--arrivals", choices=ARRIVAL_KINDS, help="open-loop arrival process (poisson)"),
            _flag("--burstiness", type=float, help="gamma shape: 1 = Poisson, <1 burstier"),
            _flag("--max-concurrency", type=int, help="cap on in-flight requests in the open loop"),
            _flag(
                "--number",
                type=int,
                nargs="+",
                help="measured requests (conversations with --multi-turn); several values with as many "
                "--parallel values run one rung each, in order (seed 003: --number 10 20 --parallel 5 10)",
            ),
            _flag("--duration", help="measured duration, e.g. 60s; in-flight requests finish"),
            _flag("--warmup", type=int, help="requests sent first and excluded from figures"),
            _flag("--seed", type=int, help="seed for arrivals, lengths and the request mix (0)"),
            _flag(
                "--repeat-prompts",
                action="store_true",
                help="prompt text from --seed alone, the same every run (a server's prefix cache will answer "
                "repeats); by default each run draws fresh prompts",
            ),
            _flag("--workers", type=int, help="client processes sharing the load (1)"),
            _flag(
                "--receive-watcher",
                choices=("auto", "on", "off"),
                help="stamp arrivals from a watcher thread, independent of the event loop (auto: closed "
                "loops of 2+ streams)",
            ),
            _flag(
                "--kernel-stamps",
                choices=("on", "off"),
                help="stamp plain-HTTP reads with the kernel's receive time where the platform gives it (on)",
            ),
        ),
    ),
    (
        "one schedule over several machines (docs/bench.md, Past one machine)",
        (
            _flag("--segment", help="run segment K/N of the schedule (auto/N: K from JOB_COMPLETION_INDEX)"),
            _flag("--start-at", help="common start of the measured phase: unix seconds or RFC 3339 time"),
            _flag("--start-delay", help="without --start-at: the first segment sets now + this (60s)"),
            _flag("--run-id", help="the run's id in the store; every segment of one run gives the same"),
        ),
    ),
    (
        "workload",
        (
            _flag("--input-tokens", help="prompt tokens N or MIN:MAX (128)"),
            _flag("--output-tokens", help="output tokens N or MIN:MAX (128)"),
            _flag(
                "--reasoning-ratio",
                type=float,
                help="share of reasoning (math) requests (0.4 with --reasoning-tokens, as seed 001; else 0)",
            ),
            _flag(
                "--reasoning-tokens",
                help="think budget MIN:MAX of reasoning requests, asked of the server (600:6000)",
            ),
            _flag(
                "--no-fixed-output",
                dest="fixed_output",
                action="store_false",
                help="do not send ignore_eos/min_tokens",
            ),
            _flag(
                "--dataset",
                help="JSONL or JSON-array file of prompts, conversations (OpenAI messages, ShareGPT) or "
                "token-length traces (docs/datasets.md), or random-multi-turn (synthetic, with --multi-turn)",
            ),
            _flag("--multi-turn", action="store_true", help="conversations with real replies"),
            _flag(
                "--parallel",
                type=int,
                nargs="+",
                help="concurrent conversations with --multi-turn, else concurrent requests; several values: "
                "one rung each, paired with --number",
            ),
            _flag("--max-turns", type=int, help="truncate conversations to N user turns"),
            _flag("--min-turns", type=int, help="random-multi-turn: at least N user turns (1)"),
            _flag("--dataset-offset", type=int, help="skip the first N dataset entries (0)"),
            _flag("--tokenizer", help="local HuggingFace tokenizer.json: exact synthetic prompt lengths"),
            _flag("--extra-body", help="JSON object merged into every request body, e.g. '{\"top_k\": 20}'"),
        ),
    ),
    (
        "seed 003 named datasets (docs/datasets.md, Named datasets)",
        (
            _flag(
                "--dataset-path",
                help="local file of a named --dataset (swe_smith, trie_agentic_coding, trie_code_qa, "
                "trie_office_work, share_gpt, share_gpt_en_multi_turn, share_gpt_zh_multi_turn, "
                "custom_multi_turn, math_500) in its published format; default: its file in "
                "$TOKWATCH_DATASET_CACHE (~/.cache/tokwatch/datasets); nothing is downloaded",
            ),
            _flag(
                "--multi-turn-args",
                help="swe_smith from raw trajectories: JSON with first_turn_length (65000), "
                "subsequent_turn_length (500), chars_per_token (3.0), num_workers (4)",
            ),
        ),
    ),
    (
        "figures and SLOs",
        (
            _flag(
                "--slo",
                action="append",
                default=[],
                into="slos",
                extends=True,
                help="e.g. ttft:p99<=0.5 (repeatable)",
            ),
            _flag("--fluidity-prefill-deadline", help="fluidity-index prefill deadline (1s)"),
            _flag("--fluidity-decode-deadline", help="fluidity-index decode deadline (50ms)"),
            _flag(
                "--fluidity-mode",
                choices=FLUIDITY_MODES,
                help="late tokens count as etalon's code does (missed deadlines, default) or as seed 004's "
                "text (one miss per late token)",
            ),
        ),
    ),
    (
        "accuracy (lm-eval-harness tasks as the run's requests; docs/bench.md, Accuracy)",
        (
            _flag(
                "--accuracy-task",
                action="append",
                bench_option=False,
                help="lm-eval task to send and score (repeatable), e.g. tokwatch_arithmetic (shipped) or "
                "gsm8k; needs the accuracy extra",
            ),
            _flag(
                "--num-fewshot", type=int, bench_option=False, help="few-shot examples per item (task's own)"
            ),
            _flag(
                "--accuracy-limit",
                type=accuracy_limit,
                bench_option=False,
                help="items per task, or a share of them when below 1 (all)",
            ),
            _flag(
                "--bootstrap-iters",
                type=int,
                bench_option=False,
                help="lm-eval's bootstrap resamples for standard errors (100000; 0 = none)",
            ),
            _flag(
                "--lmeval-include-path", bench_option=False, help="directory of your own lm-eval task YAMLs"
            ),
        ),
    ),
    (
        "capacity (one run per load point; capacity.json and capacity.png)",
        (
            _flag("--sweep", help="rate=1,2,4,8 or concurrency=1,4,16,64: one run per value"),
            _flag(
                "--search",
                choices=("fluid", "slo"),
                help="highest rate that stays fluid (seed 004) or meets every --slo: bracket, then bisect",
            ),
            _flag(
                "--search-start",
                type=float,
                help="first rate tried, req/s (default: 1 / the median E2E of 4 sequential requests)",
            ),
            _flag("--search-max-rate", type=float, help="highest rate tried, req/s (1000)"),
            _flag("--search-tolerance", type=float, help="stop when the bracket is within this share (0.1)"),
            _flag("--search-max-points", type=int, help="at most this many runs (16)"),
            _flag("--search-max-time", help="stop searching after this long (1h)"),
            _flag("--fluid-index", type=float, help="a request is fluid at fluidity-index >= this (0.9)"),
            _flag("--fluid-fraction", type=float, help="a rate is fluid when this share is fluid (0.99)"),
        ),
    ),
    (
        "cost and energy (docs/bench.md, Cost and energy; prices over the --endpoint's pricing:)",
        (
            _flag("--price-input", type=float, help="hosted: price per million prompt tokens"),
            _flag("--price-output", type=float, help="hosted: per million output tokens (reasoning too)"),
            _flag(
                "--price-cached-input",
                type=float,
                help="hosted: price per million cached prompt tokens (default: the input price)",
            ),
            _flag("--currency", help="ISO 4217 code of the prices (USD)"),
            _flag("--gpu-hour", type=float, help="self-hosted: price of one GPU per hour"),
            _flag("--gpus", type=int, help="self-hosted: GPUs behind the endpoint (1)"),
            _flag("--node-hour", type=float, help="self-hosted: price of the whole node per hour"),
            _flag("--price-kwh", type=float, help="electricity per kWh, for the run's measured energy"),
            _flag("--price-blend", help="INPUT:OUTPUT parts of the blended price (3:1)"),
            _flag(
                "--power-metrics-url",
                type=http_url,
                help="DCGM exporter or node_exporter /metrics: the devices' power, sampled during the run",
            ),
            _flag("--power-interval", help="seconds between power readings (1s)"),
            _flag("--idle-baseline", help="idle power measured this long before the load (5s; 0: none)"),
        ),
    ),
    (
        "outputs",
        (
            _flag("--output-dir", help="run directory (./bench-results/<timestamp>-<model>)"),
            _flag("--live-interval", help="seconds between live lines (5)"),
            _flag(
                "--listen",
                type=listen_address,
                help="HOST:PORT serving live Prometheus metrics during the run",
            ),
            _flag(
                "--metrics-url",
                type=http_url,
                help="server /metrics URL (vllm/llamacpp/sglang: <root>/metrics)",
            ),
            _flag("--no-server-metrics", dest="server_metrics", action="store_false"),
            _flag("--mirror-metric", dest="mirror_metrics", action="append", help="server counter to diff"),
            _flag(
                "--otlp-endpoint",
                type=http_url,
                help="send one OpenTelemetry span per request to this OTLP/HTTP receiver after the run "
                "(e.g. http://127.0.0.1:4318; needs the otel extra; docs/tracing.md)",
            ),
            _flag("--fail-fast", type=int, help="stop after N failures before any success (5)"),
            _flag(
                "--max-consecutive-failures",
                type=int,
                help="after a success, stop when N requests in a row fail (50); exit 3",
            ),
            _flag(
                "--max-error-rate",
                type=float,
                help="a run whose failed share of measured requests is above this fails: exit 5 (0.05; 1 = "
                "never)",
            ),
            _flag(
                "--unresponsive-timeout",
                help="stop the run when the server has answered nothing for this long while requests waited, "
                "after its first answer (30s); exit 3",
            ),
            _flag(
                "--drain-timeout",
                help="with --duration: abandon requests still running this long after it (counted as failed; "
                "default: wait for them)",
            ),
            _flag(
                "--no-store",
                dest="store",
                action="store_false",
                default=True,
                bench_option=False,
                help="do not write the run to the store of --config (written by default when storage is "
                "enabled)",
            ),
        ),
    ),
)
FLAGS: tuple[Flag, ...] = tuple(flag for _, group in FLAG_GROUPS for flag in group)


def add_commands(subparsers: Any) -> None:
    """Register `bench` on the tokwatch CLI: the flags of FLAG_GROUPS, and the actions of ACTIONS."""
    p = subparsers.add_parser(
        "bench",
        help="benchmark an endpoint: load generator, latency percentiles, SLOs, report",
        description="Benchmark one endpoint. Exit codes: 0 complete and all SLOs met, 1 an SLO missed, "
        "2 bad input, 3 run incomplete (interrupted or stopped early), 4 no request succeeded, 5 more than "
        "--max-error-rate of the requests failed. "
        "`tokwatch bench compare RUN_A RUN_B` compares two runs instead, each a result directory or (with "
        "--config) a stored run id or `store:ID` (exit 1 when B is "
        "worse than A beyond --threshold on a gated figure). `tokwatch bench report RUN --config FILE` "
        "recomputes one stored run from its requests, the segments of a split run merged.",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=list(ACTIONS),
        help="compare two runs; report one stored run, its segments merged (docs/bench.md, Past one machine)",
    )
    p.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="with compare: RUN_A RUN_B, each a result directory or, with --config, a stored run id "
        "(a unique prefix will do; store:ID to prefer the store over a directory of that name); with report: "
        "one stored run id (or a unique prefix)",
    )
    for title, flags in FLAG_GROUPS:
        group = p.add_argument_group(title)
        for flag in flags:
            flag.add_to(group)
    p.set_defaults(func=cmd_bench)


def _option_values(args: argparse.Namespace) -> tuple[dict[str, Any], Any, str]:
    """(bench file values overridden by flags, the bench file's YAML document, the source's name)."""
    values: dict[str, Any] = {}
    doc = None
    source = "command line"
    if getattr(args, "bench_file", None):
        values, doc = load_bench_file(args.bench_file)
        source = args.bench_file
    for flag in FLAGS:
        value = getattr(args, flag.name, None)
        if flag.option is None or value is None or (flag.action == "append" and not value):
            continue
        if flag.extends:
            values[flag.option] = (*values.get(flag.option, ()), *value)
        else:
            values[flag.option] = tuple(value) if flag.action == "append" else value
    values = accuracy_flag_values(values, _accuracy_flags(args))
    return values, doc, source


def rung_options_from_args(args: argparse.Namespace) -> list[BenchOptions]:
    """The options of every rung: one per (--number, --parallel) pair (tokwatch.bench.rungs); raises
    ConfigError naming the problem."""
    values, doc, source = _option_values(args)
    return [build_options({**values, **pair}, source=source, doc=doc) for pair in paired_rungs(values)]


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """Bench file values overridden by flags; raises ConfigError naming file, line and option."""
    rungs = rung_options_from_args(args)
    if len(rungs) > 1:
        raise ConfigError("--number/--parallel: several values run several rungs; this command runs one")
    return rungs[0]


def _accuracy_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The accuracy flags given, as accuracy_lmeval evaluator fields."""
    given = {
        "tasks": getattr(args, "accuracy_task", None),
        "num_fewshot": getattr(args, "num_fewshot", None),
        "limit": getattr(args, "accuracy_limit", None),
        "bootstrap_iters": getattr(args, "bootstrap_iters", None),
        "include_path": getattr(args, "lmeval_include_path", None),
    }
    return {k: v for k, v in given.items() if v is not None}


def _run_doc(run: Run) -> dict[str, Any]:
    return {
        "name": run.name,
        "requests": run.count(),
        "generated_tokens_per_s": run.generated_tokens_per_s,
        "missing": list(run.missing),
    }


def run_compare(
    path_a: str,
    path_b: str,
    *,
    threshold: float,
    gate: Sequence[str],
    resamples: int,
    seed: int,
    as_json: bool,
    config: str | None = None,
    force: bool = False,
) -> tuple[int, str]:
    """The `bench compare` command: (exit code, text); 0 no gated regression, 1 regression.

    A run is a result directory or, with `config` (a tokwatch.yml), a run stored in its store. Runs under
    different load shapes (tokwatch.bench.load_shape) are refused (CompareError) unless `force`."""
    gated = parse_gate(gate)
    a, b = load_runs([path_a, path_b], config)
    for run in (a, b):
        if run.count() == 0:
            raise CompareError(f"{run.name}: no measured ok request to compare")
        lost = sorted({f for f, _ in gated} & set(run.missing))
        if lost:  # a gate that cannot see its figure must not pass silently
            raise CompareError(
                f"{run.name}: gated figure {', '.join(lost)} not stored for this run (stored before schema "
                "SQLite v5 / PostgreSQL v6): compare its result directory, or gate on other figures"
            )
    differ, notes = shape_lines(a, b)
    if differ and not force:
        raise CompareError(
            "the runs ran under different loads, so their figures do not compare: "
            + "; ".join(differ)
            + ". Rerun one of them under the other's load, or give --force to compare anyway"
        )
    rows = compare(a, b, threshold=threshold, gate=gated, resamples=resamples, seed=seed)
    code = 1 if regressions(rows) else 0
    if as_json:
        doc = {
            "a": _run_doc(a),
            "b": _run_doc(b),
            "threshold": threshold,
            "load_shape_differences": differ,
            "notes": notes,
            "rows": [r.to_dict() for r in rows],
            "regressions": [f"{r.figure}:{r.stat}" for r in regressions(rows)],
            "cost_and_energy": {"a": a.cost_energy, "b": b.cost_energy},
        }
        return code, json.dumps(doc, indent=2)
    table = render_table(a, b, rows, threshold, differ)
    return code, "\n".join([table, *compare_lines(a.cost_energy, b.cost_energy)])


def cmd_compare(args: argparse.Namespace) -> int:
    """`tokwatch bench compare RUN_A RUN_B`: 0 no gated regression, 1 regression, 2 bad input."""
    if len(args.runs) != 2:
        print(
            "tokwatch bench compare: needs exactly two runs, RUN_A RUN_B (result directories or stored "
            "run ids)",
            file=sys.stderr,
        )
        return 2
    try:
        raw = args.threshold.strip()
        threshold = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        gate = [g for item in (args.gate or DEFAULT_GATE) for g in item.split(",") if g]
        code, text = run_compare(
            args.runs[0],
            args.runs[1],
            threshold=threshold,
            gate=gate,
            resamples=max(50, args.resamples),
            seed=args.seed or 0,
            as_json=args.format == "json",
            config=args.config,
            force=args.force,
        )
    except (CompareError, ValueError) as exc:
        print(f"tokwatch bench compare: {exc}", file=sys.stderr)
        return 2
    print(text)
    return code


def cmd_bench(args: argparse.Namespace) -> int:
    """Run `tokwatch bench`; returns the documented exit code, never a traceback for bad input."""
    action = ACTIONS.get(getattr(args, "action", None) or "")
    if action is not None:
        return action(args)
    console = Console(stderr=True)
    try:
        rungs = rung_options_from_args(args)
        opts = rungs[0]
        # Read before anything is sent, so a bad storage section is a usage error, not a lost run.
        store_config = _store_config(opts) if getattr(args, "store", True) else None
        # First: an accuracy run refuses the sweep, search and segment settings (lmeval_run.check_options).
        evaluator = accuracy_evaluator(opts.evaluators, opts.session_generator)
        if evaluator is not None:
            return _accuracy(opts, evaluator, console, store_config)
        if len(rungs) > 1:
            return _rungs(rungs, console, store_config)
        if opts.sweep is not None or opts.search is not None:
            return _capacity(opts, console, store_config)
        if opts.segment is not None:
            return _segment(opts, console, store_config)
        with asyncio.Runner(loop_factory=new_loop) as runner:  # uvloop when installed
            outcome, out_dir = runner.run(_main(opts, console))
    except (ConfigError, WorkloadError, SloError) as exc:
        print(f"tokwatch bench: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except OSError as exc:
        print(f"tokwatch bench: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print_result(outcome, str(out_dir), console)
    print_tables([Rung(opts, outcome)], console)
    if store_config is not None:
        _store(outcome, store_config, opts, console)
    return int(outcome.exit_code())


def print_tables(rungs: list[Rung], console: Console) -> None:
    """Seed 003's Performance Overview, Per-Request Metrics and Workload Throughput tables."""
    # Piped or redirected output has no width of its own (80 by default): wide enough that no label wraps.
    out = console if console.is_terminal else Console(file=console.file, width=max(console.width, 132))
    for table in tables(rungs):
        out.print(table)


def _rungs(rungs: list[BenchOptions], console: Console, store_config: Config | None) -> int:
    """`--number 10 20 --parallel 5 10`: the rungs in order, each a full run in `parallel_P_number_N/` of
    the output directory, then the tables over all of them. Exit code: the first rung's that is not 0."""
    from tokwatch.bench.outputs import default_output_dir
    from tokwatch.bench.plan import resolve_target
    from tokwatch.bench.session import run_bench

    for opts in rungs:
        if opts.sweep is not None or opts.search is not None or opts.segment is not None:
            raise ConfigError(
                "--number/--parallel with several values: leave out --sweep, --search and --segment"
            )
    first = rungs[0]
    model = resolve_target(first).target.model
    base = Path(first.output_dir) if first.output_dir else default_output_dir(model)
    done: list[Rung] = []
    codes: list[int] = []

    async def ladder() -> None:
        for opts in rungs:
            sub = base / rung_dir(opts)
            console.print(f"[bold]{sub.name}[/bold]", highlight=False)
            outcome, directory = await run_bench(opts, console=console, out_dir=sub)
            print_result(outcome, str(directory), console)
            done.append(Rung(opts, outcome))
            codes.append(int(outcome.exit_code()))
            if outcome.stop_reason == "interrupted":
                return

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(_cancel_on_signals(ladder()))
    print_tables(done, console)
    if store_config is not None:
        for rung in done:
            _store(rung.outcome, store_config, rung.opts, console)
    if len(done) < len(rungs):
        return ExitCode.INCOMPLETE
    return next((c for c in codes if c != 0), 0)


# `tokwatch bench ACTION`: what runs instead of a benchmark.
ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {"compare": cmd_compare, "report": cmd_report}


def _capacity(opts: BenchOptions, console: Console, store_config: Config | None) -> int:
    """`--sweep`/`--search`: every point a full run in its own directory, then capacity.json/png and a table.

    Exit codes: 0 done (a search found a rate), 2 bad input, 3 interrupted, 4 no point passed (search)."""
    from tokwatch.bench.capacity import (
        parse_sweep,
        result_tokens_per_s,
        run_capacity,
        table_lines,
        write_capacity,
    )
    from tokwatch.bench.outputs import default_output_dir
    from tokwatch.bench.plan import resolve_target
    from tokwatch.bench.session import run_bench

    if opts.sweep is not None:
        parse_sweep(opts.sweep)  # bad values are a usage error before anything is sent
    model = resolve_target(opts).target.model
    pricing = bench_pricing(opts, model)  # a bad price file is a usage error before anything is sent
    out_dir = Path(opts.output_dir) if opts.output_dir else default_output_dir(model)
    outcomes: list[BenchOutcome] = []

    async def point(point_opts: BenchOptions, sub: Path) -> tuple[BenchOutcome, Path]:
        console.print(f"[bold]{sub.name}[/bold]", highlight=False)
        outcome, directory = await run_bench(point_opts, console=console, out_dir=sub)
        print_result(outcome, str(directory), console)
        outcomes.append(outcome)
        if outcome.stop_reason == "interrupted":
            raise asyncio.CancelledError
        return outcome, directory

    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            cap = runner.run(_cancel_on_signals(run_capacity(opts, out_dir, point)))
    except asyncio.CancelledError:
        console.print(f"capacity run interrupted after {len(outcomes)} point(s); results in {out_dir}")
        return ExitCode.INCOMPLETE
    if pricing is not None:
        cap.cost = capacity_cost(pricing, cap.result_rate, result_tokens_per_s(cap))
    write_capacity(cap, out_dir, plots_enabled=opts.plots)
    for line in table_lines(cap):
        console.print(line, highlight=False, soft_wrap=True)
    if cap.cost is not None:
        console.print(capacity_cost_line(cap.cost), highlight=False, soft_wrap=True)
    console.print(f"capacity.json in {out_dir}", highlight=False)
    if store_config is not None:
        for outcome in outcomes:
            _store(outcome, store_config, opts, console)
        if cap.mode != "sweep" and outcomes:  # the search's result, for the exporter's $/Mtok at capacity
            _store_capacity(cap, outcomes[-1].options, store_config, opts, console)
    if cap.mode != "sweep" and cap.result_rate is None:
        return ExitCode.FAILED
    return ExitCode.OK


def _accuracy(
    opts: BenchOptions, evaluator: AccuracyLmevalEvaluator, console: Console, store_config: Config | None
) -> int:
    """An `accuracy_lmeval` run (tokwatch.bench.lmeval_run): the run's exit code, or 3 when its answers
    could not be scored."""
    try:
        from tokwatch.bench.lmeval_run import RESULTS_FILE, headline, run_accuracy
    except ImportError as exc:  # the optional extra is missing
        raise ConfigError(
            f"accuracy_lmeval needs the lm-eval package ({exc.name} is missing): "
            "pip install 'tokwatch[accuracy]'"
        ) from None
    with asyncio.Runner(loop_factory=new_loop) as runner:
        run = runner.run(_cancel_on_signals(run_accuracy(opts, evaluator, console)))
    if run.outcome is not None and run.out_dir is not None:
        print_result(run.outcome, str(run.out_dir), console)
        if store_config is not None:
            _store(run.outcome, store_config, opts, console)
    if run.results is None:
        console.print(run.error or "accuracy_lmeval: not scored", highlight=False, soft_wrap=True)
        return int(ExitCode.INCOMPLETE)
    for line in headline(run.results):
        console.print(f"  accuracy {line}", highlight=False, soft_wrap=True)
    console.print(f"  lm-eval results: {RESULTS_FILE}", highlight=False)
    assert run.outcome is not None
    return int(run.outcome.exit_code())


def _segment(opts: BenchOptions, console: Console, store_config: Config | None) -> int:
    """`--segment K/N`: run one segment, store it and merge the run (tokwatch.bench.distributed). Exit 0
    when the segment ran to its end, whatever its own share says of the SLOs: they are judged on the merged
    run, by `tokwatch bench report RUN`."""
    from tokwatch.bench.distributed import run_segment

    secrets = _secrets(opts, store_config) if store_config is not None else []
    with asyncio.Runner(loop_factory=new_loop) as runner:
        outcome, out_dir, lines = runner.run(
            _cancel_on_signals(run_segment(opts, console, store_config, secrets))
        )
    print_result(outcome, str(out_dir), console)
    for line in lines:
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    code = outcome.exit_code()
    return int(ExitCode.OK if code is ExitCode.SLO_FAILED else code)


def _store_config(opts: BenchOptions) -> Config | None:
    """The tokwatch.yml whose store receives the run: only with --config and `storage.enabled`."""
    if opts.config is None:
        return None
    config = load_config(opts.config)
    return config if config.storage.enabled else None


def _secrets(opts: BenchOptions, config: Config) -> list[str]:
    """The endpoint's secrets (key, password, secret header values), to mask in what is stored (never
    raises)."""
    try:
        if opts.endpoint is not None:
            ep = config.endpoint(opts.endpoint)
            return endpoint_secrets(ep) if ep is not None else []
    except ConfigError:
        return []
    key = os.environ.get(opts.api_key_env) if opts.api_key_env else None
    return [key] if key else []


def _store(outcome: BenchOutcome, config: Config, opts: BenchOptions, console: Console) -> None:
    """Write the run to the store; a failure is one warning line and changes neither files nor exit code."""
    from tokwatch.bench.storing import store_outcome
    from tokwatch.storage.errors import StorageError

    try:
        line = asyncio.run(store_outcome(outcome, config, secrets=_secrets(opts, config)))
    except (StorageError, OSError) as exc:
        warning = f"  warning: run not stored: {exc} (result files are kept)"
        console.print(warning, highlight=False, soft_wrap=True)
        return
    console.print(f"  {line}", highlight=False, soft_wrap=True)


def _store_capacity(
    cap: Capacity, options: dict[str, Any], config: Config, opts: BenchOptions, console: Console
) -> None:
    """Write a search's result to the store; a failure is one warning line (the files are kept)."""
    from tokwatch.bench.storing import store_capacity
    from tokwatch.storage.errors import StorageError

    try:
        line = asyncio.run(store_capacity(cap, options, config, secrets=_secrets(opts, config)))
    except (StorageError, OSError) as exc:
        console.print(f"  warning: capacity not stored: {exc} (capacity.json is kept)", highlight=False)
        return
    console.print(f"  {line}", highlight=False, soft_wrap=True)


async def _main(opts: BenchOptions, console: Console) -> tuple[BenchOutcome, Any]:
    from tokwatch.bench.session import run_bench

    return await _cancel_on_signals(run_bench(opts, console=console))


async def _cancel_on_signals(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` as a task that SIGINT (Ctrl-C) and SIGTERM cancel, so it writes what it has and ends."""
    task = asyncio.create_task(work)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, task.cancel)
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)


def print_result(outcome: BenchOutcome, out_dir: str, console: Console) -> None:
    """A short end-of-run summary on stderr."""
    s = outcome.summary()
    req = s["requests"]
    m = s["metrics"]

    def ms(name: str, q: str) -> str:
        v = m[name][q]
        return "-" if v is None else f"{v * 1e3:.1f}ms"

    state = "complete" if outcome.complete else f"INCOMPLETE ({outcome.stop_reason})"
    if outcome.complete and outcome.too_many_failures:
        state = "FAILED (too many failed requests)"
    console.print(f"run {state}: {req['ok']}/{req['total']} ok in {outcome.wall_s:.1f}s", highlight=False)
    if outcome.message:
        console.print(f"  {outcome.message}", highlight=False)
    for check in run_checks(outcome):
        if check.verdict in ("WARN", "FAIL"):
            console.print(f"  {check.line()}", highlight=False, soft_wrap=True)
    console.print(
        f"  TTFT p50 {ms('ttft', 'p50')} p99 {ms('ttft', 'p99')} | TBT p50 {ms('tbt', 'p50')} "
        f"p99 {ms('tbt', 'p99')} | E2E p99 {ms('e2e', 'p99')}",
        highlight=False,
    )
    for line in cost_and_energy_lines(s):
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    if outcome.slos:
        slo = outcome.slo_results()
        for r in slo["results"]:
            obs = "-" if r["observed_value"] is None else f"{r['observed_value']:.4g}"
            console.print(f"  SLO {r['name']}: {obs} {'met' if r['met'] else 'MISSED'}", highlight=False)
    console.print(f"  results: {out_dir}", highlight=False)
