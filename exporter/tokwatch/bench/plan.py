"""What a benchmark run is made of before anything is sent: the target (endpoint, key, server metrics) and
the workload (synthetic, dataset or conversations).

Built from the options alone, the same way by the session and by every `--workers` or `--segment` process,
which is sent the whole run's options and takes its own share here (`local_options`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from tokwatch.bench.client import Target
from tokwatch.bench.config import RANDOM_MULTI_TURN, BenchOptions
from tokwatch.bench.datasets import load_conversations, load_prompts
from tokwatch.bench.named_datasets import NAMED, named_loader, resolve_path
from tokwatch.bench.prompt_salt import PromptSalt, SaltedConversations, SaltedPrompts
from tokwatch.bench.segments import Segment
from tokwatch.bench.workload import (
    Conversation,
    LengthRange,
    SyntheticConversations,
    SyntheticWorkload,
)
from tokwatch.figures.tokens import token_counter
from tokwatch.probes import metrics_url, probe_class
from tokwatch.probes.keys import endpoint_secrets, resolve_credentials
from tokwatch.settings.config import load_config
from tokwatch.settings.reach import Reach
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.transport.request_options import merge_body


def local_options(opts: BenchOptions, segment: Segment) -> BenchOptions:
    """The options one process of a split run works with: its share of every in-flight cap (concurrency,
    parallel conversations, max concurrency). Rate, --number, warm-up and seed stay the whole run's: the
    runner takes the segment's requests of the one schedule they define."""
    if segment.whole:
        return opts
    update: dict[str, int] = {}
    for name in ("concurrency", "parallel", "max_concurrency"):
        value = getattr(opts, name)
        if value is not None:
            update[name] = max(1, segment.share(value))
    return opts.model_copy(update=update)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The target plus server-metrics settings, from --endpoint/--config or --url/--kind."""

    target: Target
    mirror_metrics: tuple[str, ...]


def resolve_target(opts: BenchOptions) -> Resolved:
    """Look the endpoint up in the config, or build one from --url; raises ConfigError naming the problem."""
    if opts.endpoint is not None:
        assert opts.config is not None
        config = load_config(opts.config)
        ep = config.endpoint(opts.endpoint)
        if ep is None:
            names = ", ".join(e.name for e in config.endpoints) or "none"
            raise ConfigError(f"{opts.config}: no endpoint named {opts.endpoint!r} (configured: {names})")
        credentials = resolve_credentials(ep)
        target = Target(
            kind=ep.kind,
            base_url=ep.base_url,
            model=opts.model or ep.model,
            api_key=credentials.api_key,
            timeout_s=opts.timeout,
            metrics_url=opts.metrics_url or metrics_url(ep),
            extra_body=merge_body(ep.extra_body, opts.extra_body),  # --extra-body keys win
            request_headers=probe_class(ep.kind).endpoint_headers(ep, credentials),
            path=ep.path,
            query=dict(ep.query),
            secrets=tuple(endpoint_secrets(ep)),
            reach=Reach(ep.name, ep),  # its proxy and TLS settings, as the exporter reaches it
            model_aliases=tuple(ep.model_aliases),
        )
        return Resolved(target, tuple(opts.mirror_metrics) or ep.mirror_metrics)
    assert opts.url is not None
    if not opts.model:
        raise ConfigError("--model is required with --url")
    api_key = None
    if opts.api_key_env:
        api_key = os.environ.get(opts.api_key_env)
        if api_key is None:
            raise ConfigError(f"--api-key-env: environment variable {opts.api_key_env} is not set")
    counters_url = opts.metrics_url
    if counters_url is None:
        counters_url = probe_class(opts.kind).default_metrics_url(opts.url)
    target = Target(
        opts.kind, opts.url.rstrip("/"), opts.model, api_key, opts.timeout, counters_url, opts.extra_body
    )
    return Resolved(target, tuple(opts.mirror_metrics))


def build_workload(
    opts: BenchOptions,
) -> tuple[SyntheticWorkload | SaltedPrompts | None, Sequence[Conversation] | None]:
    """The request source (synthetic or single-turn dataset) or the conversations (multi-turn), their text
    fresh for the run's `prompt_salt` (tokwatch.bench.prompt_salt).

    Raises WorkloadError naming the file and line of a bad dataset entry, or a tokenizer that cannot load.
    """
    counter = token_counter(opts.tokenizer)
    salt = PromptSalt(opts.prompt_salt, opts.seed, counter)
    if opts.dataset == RANDOM_MULTI_TURN:
        assert opts.max_turns is not None  # checked by BenchOptions
        turns = LengthRange(opts.min_turns, opts.max_turns)
        return None, SyntheticConversations(
            opts.input_range, opts.output_range, turns, opts.seed,
            fixed_output=opts.fixed_output, counter=counter, offset=opts.dataset_offset,
            salt=opts.prompt_salt,
        )  # fmt: skip
    path: str | None = opts.dataset
    entries_of = None
    if opts.dataset in NAMED:  # seed 003's named datasets: a local file in the published format
        path = str(resolve_path(opts.dataset, opts.dataset_path))
        entries_of = named_loader(
            opts.dataset, multi_turn_args=opts.multi_turn_args, min_turns=opts.min_turns,
            max_turns=opts.max_turns, seed=opts.seed, counter=counter, number=opts.number,
        )  # fmt: skip
    if path is not None and opts.multi_turn:
        return None, SaltedConversations(load_conversations(
            path, opts.output_range, opts.seed, opts.max_turns,
            counter=counter, offset=opts.dataset_offset, fixed_output=opts.fixed_output,
            entries_of=entries_of,
        ), salt)  # fmt: skip
    if path is not None:
        return SaltedPrompts(load_prompts(
            path, opts.output_range, opts.seed,
            counter=counter, offset=opts.dataset_offset, fixed_output=opts.fixed_output,
            entries_of=entries_of,
        ), salt), None  # fmt: skip
    return (
        SyntheticWorkload(
            opts.input_range,
            opts.output_range,
            opts.seed,
            reasoning_ratio=opts.reasoning_ratio,
            reasoning_tokens=opts.reasoning_range,
            fixed_output=opts.fixed_output,
            counter=counter,
            salt=opts.prompt_salt,
        ),
        None,
    )
