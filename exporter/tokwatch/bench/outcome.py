"""A finished (or stopped) benchmark run, every figure derived from it, and the process exit code."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from tokwatch.bench import conversations
from tokwatch.bench.aggregate import all_summaries, error_counts, prefill_stats, throughput
from tokwatch.bench.costing import BenchPricing, cost_figures
from tokwatch.bench.power_watch import EnergyMeasure
from tokwatch.bench.prompt_cache import cache_figures
from tokwatch.bench.reasoning import reasoning_summary
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.run_bounds import FigureBound, beyond_tolerance, bounds_summary, run_figure_bounds
from tokwatch.bench.slo import Slo, evaluate, goodput
from tokwatch.bench.stop_policy import failure_share, too_many_failures
from tokwatch.figures.result import RunResult

SCHEMA_VERSION = 1


class ExitCode(IntEnum):
    """`tokwatch bench` exit codes (docs/bench.md)."""

    OK = 0  # run complete, every SLO met (or none given)
    SLO_FAILED = 1  # run complete, at least one SLO missed
    USAGE = 2  # bad options, config, bench file or dataset; nothing was sent
    INCOMPLETE = 3  # stopped early (Ctrl-C, server ignoring max_tokens); partial results written
    FAILED = 4  # no request succeeded (unreachable, auth failure, every request failing)
    ERRORS = 5  # run complete, but more than --max-error-rate of its requests failed
    CLIENT_TIMING = 6  # run complete, but its client-timed figures are wrong beyond tolerance (busy client)



@dataclass(slots=True)
class BenchOutcome:
    """Everything a run measured. `options` are the redacted settings echoed into summary.json."""

    options: dict[str, Any]
    records: list[RequestRecord]
    started_at_unix: float
    wall_s: float
    complete: bool
    # finished, interrupted, all_failed, failing, unreachable, auth_failure, max_tokens_ignored, ...
    stop_reason: str
    message: str | None = None
    slos: list[Slo] = field(default_factory=list)
    requested_rate: float | None = None
    server: dict[str, Any] = field(default_factory=dict)  # server /metrics figures over the run
    metrics_before: str | None = None
    metrics_after: str | None = None
    client: dict[str, Any] = field(default_factory=dict)  # the benchmark client's own CPU cost
    perf_t0: float = 0.0  # time.perf_counter() at the run start: `*_at_s` + perf_t0 is absolute
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # key of the run in the store
    measure_start_s: float | None = None  # seconds after perf_t0 when the measured phase began
    max_error_rate: float | None = None  # --max-error-rate; None: failures never fail the run
    pricing: BenchPricing | None = None  # prices the run is costed at (summary `cost`)
    energy: EnergyMeasure | None = None  # the devices' energy over the run (summary `energy`)
    _bounds: tuple[int, list[FigureBound]] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def timed_requests(self) -> list[RequestRecord]:
        """The measured requests whose figures carry an error bound (the client watched its own lateness)."""
        return [r for r in self.measured if r.max_stall_s is not None]

    @property
    def beyond_tolerance_share(self) -> float | None:
        """Share of `timed_requests` with a latency figure beyond its tolerance (None without any)."""
        timed = self.timed_requests
        return sum(1 for r in timed if r.beyond_tolerance) / len(timed) if timed else None

    def figure_bounds(self) -> list[FigureBound]:
        """Each published latency figure's bound from the client's own lateness (`tokwatch.bench.run_bounds`);
        [] when no request watched its lateness. Worked out once for the records the run has."""
        if self._bounds is None or self._bounds[0] != len(self.records):
            self._bounds = (len(self.records), run_figure_bounds(self.records))
        return self._bounds[1]

    @property
    def client_timing_failed(self) -> bool:
        """A latency figure the run publishes may be wrong beyond its tolerance from the client's own
        lateness: `[FAIL] client timing` and exit 6."""
        return bool(beyond_tolerance(self.figure_bounds()))

    @property
    def failure_share(self) -> float | None:
        """Failed share of the measured requests (None without any)."""
        return failure_share(self.measured)

    @property
    def too_many_failures(self) -> bool:
        """More than --max-error-rate of the measured requests failed."""
        return too_many_failures(self.failure_share, self.max_error_rate)

    @property
    def measured(self) -> list[RequestRecord]:
        """Requests outside the warm-up."""
        return [r for r in self.records if not r.warmup]

    def slo_results(self) -> dict[str, Any]:
        """slo_results.json content."""
        out = evaluate(self.slos, self.records)
        out["schema_version"] = SCHEMA_VERSION
        out["complete"] = self.complete
        return out

    @property
    def multi_turn(self) -> bool:
        """True when the run sent conversations (summary `multi_turn`, trace_summary.json)."""
        return conversations.is_multi_turn(self.records)

    def summary(self) -> dict[str, Any]:
        """summary.json content: counts, status classes, every metric's statistics, goodput."""
        measured = self.measured
        ok = [r for r in measured if r.ok]
        sends = [r.sent_at_s for r in measured]
        span = (max(sends) - min(sends)) if len(sends) > 1 else 0.0
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "complete": self.complete,
            "stop_reason": self.stop_reason,
            "message": self.message,
            "started_at_unix": self.started_at_unix,
            "wall_time_s": self.wall_s,
            "options": self.options,
            "requests": {
                "total": len(measured),
                "ok": len(ok),
                "errored": len(measured) - len(ok),
                "warmup_excluded": len(self.records) - len(measured),
                "error_rate": (len(measured) - len(ok)) / len(measured) if measured else None,
                "max_error_rate": self.max_error_rate,
                "error_rate_exceeded": self.too_many_failures,
                "by_status": error_counts(self.records),
            },
            "requested_rate_per_s": self.requested_rate,
            "achieved_send_rate_per_s": (len(sends) - 1) / span if span > 0 else None,
            "metrics": all_summaries(self.records),
            "prompt_cache": cache_figures(self.records),
            "goodput": goodput(self.slos, self.records, self.wall_s),
            "server": self.server,
            # perf_counter_origin_s: the run's t0, so `*_at_s` + origin compares with another process's
            # time.perf_counter() on the same host (CLOCK_MONOTONIC on Linux), e.g. a reference server's log.
            "client": {**self.client, "perf_counter_origin_s": self.perf_t0},
        }
        if self.multi_turn:
            out["multi_turn"] = conversations.turn_summary(self.records)
        bounds = self.figure_bounds()
        if bounds:
            out["client_timing"] = bounds_summary(bounds)
        reasoning = reasoning_summary(self.records)
        if reasoning is not None:
            out["reasoning"] = reasoning
        out.update(self.cost_and_energy())
        return out

    def cost_and_energy(self) -> dict[str, Any]:
        """summary.json `energy` (with --power-metrics-url) and `cost` (with prices): joules over the whole
        run against every request's output tokens; cost from the measured requests' counted tokens or the
        hardware's time at the measured output tok/s (docs/bench.md, "Cost and energy")."""
        out: dict[str, Any] = {}
        energy = None
        if self.energy is not None:
            energy = self.energy.figures(sum(r.generated_tokens for r in self.records))
            out["energy"] = energy
        if self.pricing is not None:
            rate = throughput(self.records, self.wall_s)["overall"].get("generated_tokens_per_s")
            joules = energy["joules"] if energy is not None else None
            out["cost"] = cost_figures(self.pricing, self.measured, self.wall_s, rate, joules)
        return out

    def trace_summary(self) -> dict[str, Any]:
        """trace_summary.json content (multi-turn runs): per-conversation figures and their statistics."""
        return conversations.trace_summary(self.records, SCHEMA_VERSION)

    def throughput(self) -> dict[str, Any]:
        """throughput.json content."""
        return {"schema_version": SCHEMA_VERSION, **throughput(self.records, self.wall_s)}

    def prefill(self) -> dict[str, Any]:
        """prefill_stats.json content."""
        return {"schema_version": SCHEMA_VERSION, **prefill_stats(self.records)}

    def exit_code(self) -> ExitCode:
        """The documented exit code for this outcome."""
        if not any(r.ok for r in self.measured):
            return ExitCode.FAILED
        if not self.complete:
            return ExitCode.INCOMPLETE
        if self.too_many_failures:
            return ExitCode.ERRORS
        if self.client_timing_failed:  # its figures are wrong beyond tolerance: no SLO verdict on them
            return ExitCode.CLIENT_TIMING
        return ExitCode.OK if evaluate(self.slos, self.records)["all_slos_met"] else ExitCode.SLO_FAILED

    def records_for_store(self, endpoint: str, instance: str = "") -> list[RunResult]:
        """The run's measured requests as RunResults (for the store, wired by the lead)."""
        return [r.to_run_result(endpoint, self.started_at_unix, instance) for r in self.measured]
