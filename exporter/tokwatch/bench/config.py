"""Typed benchmark options: from command-line flags and/or a YAML bench file (flags win)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from tokwatch.bench.accuracy import LmevalSessionGenerator
from tokwatch.bench.arrivals import ArrivalKind
from tokwatch.bench.evaluators import (
    Evaluator,
    PerformanceEvaluator,
    performance_evaluator,
    unknown_type_message,
    untagged,
)
from tokwatch.bench.fluidity import FluidityMode
from tokwatch.bench.named_datasets import NAMED, MultiTurnArgs
from tokwatch.bench.segments import Segment, SegmentError, parse_segment
from tokwatch.bench.slo import Slo, SloError, parse_slo, slo_from_mapping
from tokwatch.bench.stop_policy import DEFAULT_MAX_ERROR_RATE, DEFAULT_UNRESPONSIVE_S
from tokwatch.bench.wallclock import StartAtError, parse_start_at
from tokwatch.bench.workload import LengthRange, WorkloadError
from tokwatch.figures.cost import parse_blend
from tokwatch.settings.access import check_base_url_parts
from tokwatch.settings.kinds import Kind
from tokwatch.settings.setting_values import check_http_url, duration_fields, parse_listen
from tokwatch.settings.strict_yaml import (
    ConfigError,
    StrictModel,
    format_validation_error,
    line_of,
    parse_yaml_doc,
    read_config_file,
)
from tokwatch.tracing.extra import require_otel
from tokwatch.transport import kernel_stamps

DEFAULT_NUMBER = 100
# Seed 001's reasoning/chat mix: "default 0.4 is the realistic balance for a 2026 reasoning-model deployment".
SEED_REASONING_RATIO = 0.4
RANDOM_MULTI_TURN = "random-multi-turn"  # --dataset name of seed 003's synthetic conversations


class BenchOptions(StrictModel):
    """Every setting of one benchmark run (docs/bench.md lists them)."""

    # target
    endpoint: str | None = None
    config: str | None = None
    url: str | None = None
    kind: Kind = "openai"
    model: str | None = None
    api_key_env: str | None = None
    timeout: float = Field(300.0, gt=0)
    # load
    concurrency: int | None = Field(None, ge=1, le=100_000)
    rate: float | None = Field(None, gt=0)
    arrivals: ArrivalKind = "poisson"
    burstiness: float = Field(1.0, gt=0)
    max_concurrency: int | None = Field(None, ge=1, le=100_000)
    number: int | None = Field(None, ge=1)
    duration: float | None = Field(None, gt=0)
    warmup: int = Field(0, ge=0)
    seed: int = 0
    # Prompts drawn from the seed alone (the same text every run); by default each run salts its own.
    repeat_prompts: bool = False
    prompt_salt: str | None = None  # set for each run from its run id (tokwatch.bench.prompt_salt)
    # workload
    input_tokens: str = "128"
    output_tokens: str = "128"
    # None: seed 001's 0.4 when a reasoning workload is asked for (reasoning_tokens given), else 0 (chat only)
    reasoning_ratio: float = Field(0.0, ge=0.0, le=1.0)  # filled in by _ratio when not given
    reasoning_tokens: str = "600:6000"
    fixed_output: bool = True
    dataset: str | None = None
    multi_turn: bool = False
    parallel: int | None = Field(None, ge=1)
    max_turns: int | None = Field(None, ge=1)
    min_turns: int = Field(1, ge=1)  # dataset random-multi-turn: user turns per conversation, at least
    dataset_offset: int = Field(0, ge=0)  # skip the first N dataset entries (conversations or prompts)
    tokenizer: str | None = None  # local HuggingFace tokenizer.json: exact prompt lengths and counts
    extra_body: dict[str, Any] = Field(default_factory=dict)  # merged into every request body
    # Seed 003: the local file of a named --dataset (tokwatch.bench.named_datasets), and swe_smith's
    # construction settings (first_turn_length, subsequent_turn_length, chars_per_token, num_workers).
    dataset_path: str | None = None
    multi_turn_args: dict[str, Any] = Field(default_factory=dict)
    # figures
    fluidity_prefill_deadline: float = Field(1.0, gt=0)
    fluidity_decode_deadline: float = Field(0.05, gt=0)
    fluidity_mode: FluidityMode = "etalon"  # how a late token counts (tokwatch.bench.fluidity)
    slos: tuple[str | dict[str, Any], ...] = ()
    # seed 002's evaluators list (tokwatch.bench.evaluators); its performance entry's slos join `slos`
    evaluators: tuple[Evaluator, ...] = ()
    # outputs and live view
    output_dir: str | None = None
    live_interval: float = Field(5.0, gt=0)
    listen: str | None = None
    metrics_url: str | None = None
    server_metrics: bool = True
    mirror_metrics: tuple[str, ...] = ()
    # An OTLP/HTTP receiver for one span per request, sent after the run (docs/tracing.md; the `otel` extra).
    otlp_endpoint: str | None = None
    plots: bool = True
    fail_fast: int = Field(5, ge=1)
    # capacity (tokwatch.bench.capacity): a sweep over load points, or a search for the highest good rate
    sweep: str | None = None  # "rate=1,2,4" or "concurrency=1,4,16"
    search: Literal["fluid", "slo"] | None = None
    # first rate tried (req/s); None: 1 / median E2E of a few sequential requests (tokwatch.bench.capacity)
    search_start: float | None = Field(None, gt=0, allow_inf_nan=False)
    search_max_rate: float = Field(1000.0, gt=0, allow_inf_nan=False)
    # bisect until (lowest fail - highest pass) <= this x highest pass
    search_tolerance: float = Field(0.1, gt=0, lt=1)
    search_max_points: int = Field(16, ge=2, le=200)
    search_max_time: float = Field(3600.0, gt=0)
    # seed 004: a request is fluid at fluidity-index >= fluid_index, a rate when fluid_fraction of them are
    fluid_index: float = Field(0.9, gt=0, le=1)
    fluid_fraction: float = Field(0.99, gt=0, le=1)
    # After the first success: stop when this many requests in a row fail (a dead or broken server).
    max_consecutive_failures: int = Field(50, ge=1)
    # A larger failed share of the measured requests fails the run (exit 5, FAIL health check).
    max_error_rate: float = Field(DEFAULT_MAX_ERROR_RATE, ge=0, le=1)
    # After the first answer: no byte from the server for this long while requests wait stops the run.
    unresponsive_timeout: float = Field(DEFAULT_UNRESPONSIVE_S, gt=0)
    # With duration: requests still in flight this long after it are abandoned (counted as failed).
    drain_timeout: float | None = Field(None, gt=0)
    workers: int = Field(1, ge=1, le=64)
    # Reads stamped with the kernel's receive time (tokwatch.transport.kernel_stamps) where the platform
    # gives it.
    kernel_stamps: Literal["on", "off"] = "on"
    # Receive stamps from a watcher thread (tokwatch.transport.rxwatch): auto = closed loops, whose
    # synchronised
    # completions and re-sends keep the loop busy while tokens arrive, unless the kernel stamps the reads
    # (as accurate there at half the CPU: docs/performance.md "Run 6"); open loops stamp on the loop.
    receive_watcher: Literal["auto", "on", "off"] = "auto"
    # One schedule over several machines (tokwatch.bench.segments, tokwatch.bench.distributed): this
    # process's segment K/N (auto/N: K from JOB_COMPLETION_INDEX), the common measured start (unix seconds),
    # or, without one, how far ahead the first segment to reach the store fixes it; the run id every
    # segment stores under.
    segment: str | None = None
    start_at: float | None = None
    start_delay: float = Field(60.0, gt=0)
    run_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")
    # Seed 002's `session_generator: {type: lmeval, ...}`: lm-eval tasks as requests (tokwatch.bench.accuracy)
    session_generator: LmevalSessionGenerator | None = None
    # cost and energy (tokwatch.bench.costing, tokwatch.bench.power_watch): prices over the --endpoint's
    # `pricing:` field by field; power sampled from a DCGM exporter's or node_exporter's /metrics.
    price_input: float | None = Field(None, ge=0, allow_inf_nan=False)  # per million prompt tokens
    price_output: float | None = Field(None, ge=0, allow_inf_nan=False)  # per million output tokens
    price_cached_input: float | None = Field(None, ge=0, allow_inf_nan=False)  # per million cached tokens
    currency: str | None = None
    gpu_hour: float | None = Field(None, ge=0, allow_inf_nan=False)
    gpus: int | None = Field(None, ge=1, le=4096)
    node_hour: float | None = Field(None, ge=0, allow_inf_nan=False)
    price_kwh: float | None = Field(None, ge=0, allow_inf_nan=False)
    price_blend: str | None = None  # INPUT:OUTPUT parts of the blended price (3:1)
    power_metrics_url: str | None = None
    power_interval: float = Field(1.0, gt=0)
    idle_baseline: float = Field(5.0, ge=0)  # seconds of idle power measured before the load (0: none)

    _dur = duration_fields(
        "timeout",
        "duration",
        "fluidity_prefill_deadline",
        "fluidity_decode_deadline",
        "search_max_time",
        "unresponsive_timeout",
        "drain_timeout",
        "start_delay",
        "power_interval",
        "idle_baseline",
    )

    @field_validator("segment", mode="before")
    @classmethod
    def _segment(cls, v: Any) -> str | None:
        if v is None:
            return None
        try:
            return parse_segment(str(v)).label  # auto/N resolved here, once
        except SegmentError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("start_at", mode="before")
    @classmethod
    def _start_at(cls, v: Any) -> float | None:
        if v is None:
            return None
        try:
            return parse_start_at(v)
        except StartAtError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="before")
    @classmethod
    def _ratio(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("reasoning_ratio") is None:
            asked = data.get("reasoning_tokens") is not None
            data = {**data, "reasoning_ratio": SEED_REASONING_RATIO if asked else 0.0}
        return data

    @field_validator("input_tokens", "output_tokens", "reasoning_tokens", mode="before")
    @classmethod
    def _range(cls, v: Any) -> str:
        text = str(v)
        try:
            LengthRange.parse(text, "range")
        except WorkloadError as exc:
            raise ValueError(str(exc).removeprefix("range: ")) from None
        return text

    @field_validator("extra_body", mode="before")
    @classmethod
    def _extra_body(cls, v: Any) -> Any:
        if isinstance(v, str):  # --extra-body '{"top_k": 20}'
            try:
                v = json.loads(v)
            except json.JSONDecodeError as exc:
                raise ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(v, dict):
            raise ValueError("must be a JSON object, e.g. '{\"top_k\": 20}'")
        return v

    @field_validator("dataset", mode="before")
    @classmethod
    def _dataset(cls, v: Any) -> Any:
        return RANDOM_MULTI_TURN if v == "random_multi_turn" else v  # evalscope's name

    @field_validator("multi_turn_args", mode="before")
    @classmethod
    def _multi_turn_args(cls, v: Any) -> Any:
        if isinstance(v, str):  # --multi-turn-args '{"first_turn_length": 8192}'
            try:
                v = json.loads(v)
            except json.JSONDecodeError as exc:
                raise ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(v, dict):
            raise ValueError("must be a JSON object, e.g. '{\"first_turn_length\": 8192}'")
        try:
            MultiTurnArgs(v)
        except WorkloadError as exc:
            raise ValueError(str(exc).removeprefix("multi_turn_args: ")) from None
        return v

    @field_validator("url", "metrics_url", "power_metrics_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return v if v is None else check_http_url(v)

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp(cls, v: str | None) -> str | None:
        if v is not None:
            check_http_url(v)
            require_otel()  # the one-line error naming the extra, before anything is sent
        return v

    @field_validator("url")
    @classmethod
    def _plain_url(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                check_base_url_parts(v)
            except ValueError as exc:
                raise ValueError(
                    f"{exc}; the bench takes them from an endpoint of --config FILE: --endpoint NAME"
                ) from None
        return v

    @field_validator("price_blend")
    @classmethod
    def _blend(cls, v: str | None) -> str | None:
        if v is not None:
            parse_blend(v)
        return v

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str | None) -> str | None:
        if v is not None and not (len(v) == 3 and v.isalpha() and v.isupper()):
            raise ValueError("must be a three-letter ISO 4217 code such as USD or EUR")
        return v

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        if v is not None:
            parse_listen(v)
        return v

    @model_validator(mode="after")
    def _check(self) -> BenchOptions:
        if (self.endpoint is None) == (self.url is None):
            raise ValueError("give exactly one of endpoint (with config) or url")
        if self.endpoint is not None and self.config is None:
            raise ValueError("endpoint needs config (the tokwatch.yml that defines it)")
        if self.concurrency is not None and self.rate is not None:
            raise ValueError("give either concurrency (closed loop) or rate (open loop), not both")
        if self.dataset_path is not None and self.dataset not in NAMED:
            names = ", ".join(sorted(NAMED))
            raise ValueError(f"dataset_path goes with a named dataset ({names}); a file alone: dataset FILE")
        if self.multi_turn_args and self.dataset != "swe_smith":
            raise ValueError("multi_turn_args goes with dataset swe_smith")
        if self.multi_turn and self.dataset is None:
            raise ValueError("multi_turn needs a dataset of conversations")
        if self.multi_turn and self.rate is not None:
            raise ValueError("multi_turn runs conversations in a closed loop: use parallel, not rate")
        if self.max_turns is not None and self.min_turns > self.max_turns:
            raise ValueError(f"min_turns {self.min_turns} is above max_turns {self.max_turns}")
        if self.dataset == RANDOM_MULTI_TURN:
            if not self.multi_turn:
                raise ValueError(f"dataset {RANDOM_MULTI_TURN} needs multi_turn")
            if self.max_turns is None:
                raise ValueError(f"dataset {RANDOM_MULTI_TURN} needs max_turns (turns are min..max)")
        if self.sweep is not None and self.search is not None:
            raise ValueError("give either sweep or search, not both")
        if self.sweep is not None:
            dimension = self.sweep.partition("=")[0].strip()
            if (dimension == "rate" and self.concurrency is not None) or (
                dimension == "concurrency" and self.rate is not None
            ):
                other = "concurrency" if dimension == "rate" else "rate"
                raise ValueError(f"sweep over {dimension}: leave out {other}")
        if self.search is not None:
            if self.concurrency is not None or self.multi_turn:
                raise ValueError(
                    "search varies the request rate (open loop): leave out concurrency and multi_turn"
                )
            if self.search == "slo" and not self.slos and not self._evaluator_slos():
                raise ValueError("search slo needs at least one slo")
        if self.gpus is not None and self.gpu_hour is None:
            raise ValueError("gpus needs gpu_hour (the price of one GPU per hour)")
        if self.gpu_hour is not None and self.node_hour is not None:
            raise ValueError("give gpu_hour (with gpus) or node_hour, not both")
        self._check_segment()
        return self

    def _check_segment(self) -> None:
        seg = self.segment_part
        if seg.whole:
            return
        if self.sweep is not None or self.search is not None:
            raise ValueError("segment runs one load point: leave out sweep and search")
        if self.run_id is None:
            raise ValueError("segment needs run_id: the one id every segment of the run stores under")
        for name in ("concurrency", "parallel", "max_concurrency"):
            value = getattr(self, name)
            if value is not None and value < seg.count:
                raise ValueError(f"{name} {value} cannot be split over {seg.count} segments (one each)")

    @property
    def segment_part(self) -> Segment:
        """This process's segment of the one schedule (the whole schedule without `segment`)."""
        return parse_segment(self.segment) if self.segment is not None else Segment()

    @property
    def input_range(self) -> LengthRange:
        """Prompt token range."""
        return LengthRange.parse(self.input_tokens, "input_tokens")

    @property
    def output_range(self) -> LengthRange:
        """Output token range."""
        return LengthRange.parse(self.output_tokens, "output_tokens")

    @property
    def reasoning_range(self) -> LengthRange:
        """Think-token range of reasoning requests."""
        return LengthRange.parse(self.reasoning_tokens, "reasoning_tokens")

    @property
    def effective_number(self) -> int | None:
        """Measured requests to send: --number, or 100 when neither number nor duration is given."""
        if self.number is None and self.duration is None:
            return DEFAULT_NUMBER
        return self.number

    @property
    def kernel_stamped(self) -> bool:
        """Whether plain-HTTP reads carry the kernel's receive time (`kernel_stamps` on, Linux)."""
        return self.kernel_stamps == "on" and kernel_stamps.available()

    @property
    def watch_receives(self) -> bool:
        """Whether receive stamps come from the watcher thread (see `receive_watcher`): `auto` runs it for
        closed loops of two or more streams whose reads the kernel does not stamp; one stream alone leaves
        its loop nothing to hold off a read."""
        if self.receive_watcher == "auto":
            return self.rate is None and self.closed_loop_workers > 1 and not self.kernel_stamped
        return self.receive_watcher == "on"

    @property
    def closed_loop_workers(self) -> int:
        """Concurrent workers of a closed loop (concurrency, or parallel conversations)."""
        return self.parallel or self.concurrency or 1

    @property
    def performance(self) -> PerformanceEvaluator | None:
        """The bench file's `type: performance` evaluator (seed 002), if any."""
        return performance_evaluator(self.evaluators)

    def parsed_slos(self) -> list[Slo]:
        """The SLO list (`slos` then the performance evaluator's); raises SloError naming the bad entry."""
        out = []
        for i, item in enumerate(self.slos):
            out.append(parse_slo(item) if isinstance(item, str) else slo_from_mapping(item, f"slos[{i}]"))
        for where, item in self._evaluator_slos():
            out.append(slo_from_mapping(item, _path(where)))
        return out

    def _evaluator_slos(self) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """(location in the file, entry) of each SLO inside a performance evaluator."""
        return [
            (("evaluators", i, "slos", j), item)
            for i, ev in enumerate(self.evaluators)
            if isinstance(ev, PerformanceEvaluator)
            for j, item in enumerate(ev.slos)
        ]

    def load_description(self) -> str:
        """A short description of the load, for reports."""
        if self.rate is not None:
            cap = f", max concurrency {self.max_concurrency}" if self.max_concurrency else ""
            shape = f" (burstiness {self.burstiness:g})" if self.arrivals == "gamma" else ""
            return f"open loop {self.rate:g}/s {self.arrivals}{shape}{cap}"
        label = "parallel conversations" if self.multi_turn else "concurrency"
        return f"closed loop, {label} {self.closed_loop_workers}"


def load_bench_file(path: str | Path) -> tuple[dict[str, Any], Any]:
    """Read a YAML bench file into option values (seed 002's `slos:` list allowed at the top level)."""
    text, name = read_config_file(path)
    doc = parse_yaml_doc(text, name)
    values = {str(k).replace("-", "_"): v for k, v in doc.items()}
    return values, doc


def build_options(values: dict[str, Any], *, source: str = "options", doc: Any = None) -> BenchOptions:
    """Validate option values; raises ConfigError with `source:line: field: message` lines."""
    if "prompt_salt" in values:
        line = line_of(doc, ("prompt_salt",)) if doc is not None else None
        raise ConfigError(
            f"{source}{f':{line}' if line else ''}: prompt_salt: set by tokwatch for each run; "
            "use repeat_prompts (with seed) for prompts that repeat"
        )
    try:
        opts = BenchOptions.model_validate(values)
    except ValidationError as exc:
        if any(e["loc"][:1] == ("evaluators",) for e in exc.errors()):
            raise ConfigError(_evaluator_errors(exc, source, doc)) from None
        message = format_validation_error(exc, source, doc).replace("unknown setting", "unknown option")
        raise ConfigError(message) from None
    for i, item in enumerate(opts.slos):
        try:
            parse_slo(item) if isinstance(item, str) else slo_from_mapping(item, f"slos[{i}]")
        except SloError as exc:
            line = line_of(doc, ("slos", i)) if doc is not None and not isinstance(item, str) else None
            raise ConfigError(f"{source}{f':{line}' if line else ''}: {exc}") from None
    for where, item in opts._evaluator_slos():
        try:
            slo_from_mapping(item, _path(where))
        except SloError as exc:
            line = line_of(doc, where) if doc is not None else None
            raise ConfigError(f"{source}{f':{line}' if line else ''}: {exc}") from None
    return opts


def _path(loc: tuple[Any, ...]) -> str:
    """`evaluators[0].slos[1]` for ("evaluators", 0, "slos", 1)."""
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))


def _evaluator_errors(exc: ValidationError, source: str, doc: Any) -> str:
    """`file:line: field: message` lines, an evaluator's own fields located without pydantic's type tag and
    an unknown or missing `type` named as such."""
    lines = []
    for err in exc.errors():
        loc = untagged(tuple(err["loc"]))
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            msg = unknown_type_message(err["input"])
            loc = (*loc, "type") if isinstance(err["input"], dict) and "type" in err["input"] else loc
        elif err["type"] == "extra_forbidden":
            msg = "unknown option"
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
        line = line_of(doc, loc) if doc is not None else None
        lines.append(f"{source}{f':{line}' if line else ''}: {_path(loc)}: {msg}")
    return "\n".join(lines)
