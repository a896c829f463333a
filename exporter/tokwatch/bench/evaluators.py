"""Seed 002's `evaluators:` list of a bench file: each entry a model discriminated on its `type`.

A new evaluator type is one model with a `type: Literal[...]` field, added as one more line of `Evaluator`
below; an unknown `type` is then a one-line `file:line: evaluators[N].type: ...` error naming the known
ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import Discriminator, Field, Tag, field_validator

from tokwatch.bench.accuracy import AccuracyLmevalEvaluator
from tokwatch.settings.strict_yaml import StrictModel

CHANNELS = ("text",)  # what tokwatch measures: text generation (Veeksha also has audio channels)


class PerformanceEvaluator(StrictModel):
    """`type: performance`: latency and throughput figures, the seed's files under `metrics/`, its SLOs
    and (with `stream_metrics`) its periodic live line."""

    type: Literal["performance"]
    target_channels: tuple[str, ...] = ("text",)
    stream_metrics: bool = False
    stream_metrics_interval: float = Field(5.0, gt=0, allow_inf_nan=False)
    slos: tuple[dict[str, Any], ...] = ()

    @field_validator("target_channels")
    @classmethod
    def _channels(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [c for c in v if c not in CHANNELS]
        if unknown:
            raise ValueError(f"unknown channel(s) {', '.join(map(repr, unknown))} (tokwatch measures 'text')")
        return v


def _evaluator_type(value: Any) -> Any:
    """The `type` of an entry (a mapping from the file, or an evaluator model already built)."""
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


# One member per evaluator type: a type is added with one line `Annotated[Model, Tag("its type")],` in the
# Union (whose model is a StrictModel with `type: Literal["its type"]`). A callable discriminator: the
# StrictModel's number check runs before every field, `type` included, which pydantic's field
# discriminator refuses.
Evaluator = Annotated[
    Union[  # noqa: UP007 - one member per line, each with its trailing comma
        Annotated[PerformanceEvaluator, Tag("performance")],
        Annotated[AccuracyLmevalEvaluator, Tag("accuracy_lmeval")],
    ],
    Discriminator(_evaluator_type),
]


def _tags(union: Any) -> tuple[str, ...]:
    """The Tag of every member of an Annotated union of tagged models."""
    inner = get_args(union)[0]
    # One member: Annotated flattens to (Model, Tag, Discriminator); several: (Union[...], Discriminator).
    members = get_args(inner) if get_origin(inner) in (Union, UnionType) else (union,)
    return tuple(str(m.tag) for member in members for m in get_args(member)[1:] if isinstance(m, Tag))


EVALUATOR_TYPES = _tags(Evaluator)  # for error messages


def untagged(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """An error location without the evaluator type pydantic inserts: evaluators[0].performance.x -> .x."""
    if len(loc) > 2 and loc[0] == "evaluators" and loc[2] in EVALUATOR_TYPES:
        return (*loc[:2], *loc[3:])
    return loc


def unknown_type_message(value: Any) -> str:
    """The error for an entry whose `type` is missing or not one of EVALUATOR_TYPES."""
    given = _evaluator_type(value)
    what = "no type" if given is None else f"unknown evaluator type {given!r}"
    return f"{what}: give type: {' or '.join(EVALUATOR_TYPES)}"


def performance_evaluator(evaluators: Sequence[object]) -> PerformanceEvaluator | None:
    """The first `type: performance` entry, or None."""
    return next((e for e in evaluators if isinstance(e, PerformanceEvaluator)), None)
