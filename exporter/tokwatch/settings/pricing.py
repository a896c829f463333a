"""Prices of endpoints: hosted per-token prices, self-hosted hourly prices and electricity, from the config,
a price table file, or a model list in OpenRouter's format (docs/configuration.md, "Pricing").

Which price an endpoint has: its own `pricing:` first, then `pricing.models[<model>]`, then the price table,
then the OpenRouter list (by model id); the first that has the field wins, field by field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from tokwatch.figures.cost import DEFAULT_BLEND, TokenPrice, parse_blend
from tokwatch.settings.setting_values import check_http_url, positive_duration_fields
from tokwatch.settings.strict_yaml import (
    ConfigError,
    StrictModel,
    format_validation_error,
    parse_yaml_doc,
    read_config_file,
)

_PRICE_FIELDS = (
    "input_per_mtok",
    "output_per_mtok",
    "cached_input_per_mtok",
    "gpu_hour",
    "gpus",
    "node_hour",
    "kwh",
)


class Pricing(StrictModel):
    """One endpoint's (or model's) prices. Hosted: per million tokens. Self-hosted: `gpu_hour` x `gpus`, or
    `node_hour`, per hour. `kwh`: electricity per kWh, for the energy share of self-hosted cost."""

    input_per_mtok: float | None = Field(default=None, ge=0)
    output_per_mtok: float | None = Field(default=None, ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    currency: str = "USD"
    gpu_hour: float | None = Field(default=None, ge=0)
    gpus: int | None = Field(default=None, ge=1, le=4096, strict=True)
    node_hour: float | None = Field(default=None, ge=0)
    kwh: float | None = Field(default=None, ge=0)

    @field_validator(
        "input_per_mtok", "output_per_mtok", "cached_input_per_mtok", "gpu_hour", "node_hour", "kwh"
    )
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator(
        "input_per_mtok",
        "output_per_mtok",
        "cached_input_per_mtok",
        "gpu_hour",
        "node_hour",
        "kwh",
        mode="before",
    )
    @classmethod
    def _not_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("must be a number, not true/false")
        return v

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        if not (len(v) == 3 and v.isalpha() and v.isupper()):
            raise ValueError("must be a three-letter ISO 4217 code such as USD or EUR")
        return v

    @model_validator(mode="after")
    def _check(self) -> Pricing:
        if self.gpu_hour is not None and self.node_hour is not None:
            raise ValueError("set gpu_hour (with gpus) or node_hour, not both")
        if self.gpus is not None and self.gpu_hour is None:
            raise ValueError("gpus needs gpu_hour")
        return self

    def token_price(self) -> TokenPrice | None:
        """The hosted price, when both input and output prices are known."""
        if self.input_per_mtok is None or self.output_per_mtok is None:
            return None
        return TokenPrice(self.input_per_mtok, self.output_per_mtok, self.cached_input_per_mtok)

    @property
    def hourly(self) -> float | None:
        """What the hardware costs per hour: `gpu_hour` x `gpus` (1 GPU when not set), or `node_hour`."""
        if self.gpu_hour is not None:
            return self.gpu_hour * (self.gpus or 1)
        return self.node_hour

    def over(self, fallback: Pricing) -> Pricing:
        """These prices, with every field not set here taken from `fallback` (same currency only)."""
        if fallback.currency != self.currency and self.fields_set():
            return self
        merged = {
            f: getattr(self, f) if getattr(self, f) is not None else getattr(fallback, f)
            for f in _PRICE_FIELDS
        }
        return Pricing(currency=self.currency if self.fields_set() else fallback.currency, **merged)

    def fields_set(self) -> bool:
        """Whether any price is set."""
        return any(getattr(self, f) is not None for f in _PRICE_FIELDS)


_PRICE_TABLE = TypeAdapter(dict[str, Pricing])


class PricingSettings(StrictModel):
    """The `pricing:` block: how prices blend, per-model defaults, and the files they may come from."""

    blend: str = "3:1"
    models: dict[str, Pricing] = Field(default_factory=dict)
    table: str | None = None  # a YAML/JSON file: {model: {input_per_mtok: ..., ...}}
    openrouter_file: str | None = None  # OpenRouter's models list, saved locally
    # OpenRouter's models list fetched over HTTP (its /api/v1/models, or a mirror), every `refresh`;
    # nothing is fetched unless this is set.
    openrouter_url: str | None = None
    refresh: float = 86400.0
    _refresh = positive_duration_fields("refresh")

    @field_validator("blend")
    @classmethod
    def _blend(cls, v: str) -> str:
        parse_blend(v)
        return v

    @field_validator("openrouter_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return v if v is None else check_http_url(v)

    @field_validator("refresh")
    @classmethod
    def _refresh_floor(cls, v: float) -> float:
        if v < 60.0:
            raise ValueError("must be at least 1m: a price list changes far less often")
        return v

    @model_validator(mode="after")
    def _one_list(self) -> PricingSettings:
        if self.openrouter_file is not None and self.openrouter_url is not None:
            raise ValueError("set openrouter_file or openrouter_url, not both")
        return self

    @property
    def sources(self) -> tuple[str, ...]:
        """The price sources this block configures, by their `source` label (`table`, `openrouter`)."""
        return (*(("table",) if self.table else ()), *(("openrouter",) if self.openrouter_list else ()))

    @property
    def openrouter_list(self) -> str | None:
        """Where OpenRouter's list comes from: the file or the URL, None when neither is set."""
        return self.openrouter_file or self.openrouter_url

    @property
    def blend_parts(self) -> tuple[float, float]:
        """The blend as (input, output) parts."""
        return parse_blend(self.blend) if self.blend else DEFAULT_BLEND


def read_price_table(text: str, filename: str) -> dict[str, Pricing]:
    """A price table file: a mapping of model name to prices, every error as `file:line: model.field: msg`."""
    doc = parse_yaml_doc(text, filename)
    try:
        return _PRICE_TABLE.validate_python(doc)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, filename, doc)) from None


def read_openrouter_models(text: str, source: str) -> dict[str, Pricing]:
    """OpenRouter's models list as prices per million tokens by model id.

    The list is `{"data": [{"id", "pricing": {"prompt", "completion", "input_cache_read"}}]}` with USD per
    token as decimal strings. Models whose prices cannot be read are left out; a document that is not such
    a list is one error naming `source`."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ConfigError(f"{source}: expected OpenRouter's models list: an object with a 'data' list")
    prices: dict[str, Pricing] = {}
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        p = entry.get("pricing")
        if not isinstance(p, dict):
            continue
        prompt, completion = _per_mtok(p.get("prompt")), _per_mtok(p.get("completion"))
        if prompt is None or completion is None:
            continue
        cached = _per_mtok(p.get("input_cache_read", p.get("cache_read")))
        prices[entry["id"]] = Pricing(
            input_per_mtok=prompt, output_per_mtok=completion, cached_input_per_mtok=cached
        )
    return prices


def _per_mtok(per_token: Any) -> float | None:
    """A per-token USD price (OpenRouter sends decimal strings) as per million tokens; None when unreadable,
    negative (OpenRouter's '-1' marks a variable-priced router) or not finite."""
    if isinstance(per_token, bool) or per_token is None:
        return None
    try:
        value = float(per_token)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return round(value * 1_000_000, 9)


def resolve_pricing(
    own: Pricing | None, model: str, settings: PricingSettings, *sources: Mapping[str, Pricing]
) -> Pricing | None:
    """An endpoint's prices: its own first, then `pricing.models`, then each source (price table, OpenRouter
    list) by model name, field by field; None when nothing prices it."""
    found: Pricing | None = None
    for prices in (own, settings.models.get(model), *(source.get(model) for source in sources)):
        if prices is not None:
            found = prices if found is None else found.over(prices)
    return found if found is not None and found.fields_set() else None


PriceSource = Literal["config", "table", "openrouter"]


def read_price_files(settings: PricingSettings) -> dict[PriceSource, dict[str, Pricing]]:
    """The configured price files by source (`table`, `openrouter` from `openrouter_file`; a URL is fetched
    by the exporter only); ConfigError naming the file and line of a bad one."""
    found: dict[PriceSource, dict[str, Pricing]] = {}
    if settings.table:
        text, name = read_config_file(settings.table)
        found["table"] = read_price_table(text, name)
    if settings.openrouter_file:
        text, name = read_config_file(settings.openrouter_file)
        found["openrouter"] = read_openrouter_models(text, name)
    return found


def resolve_priced(
    own: Pricing | None,
    model: str,
    settings: PricingSettings,
    table: Mapping[str, Pricing],
    openrouter: Mapping[str, Pricing],
) -> tuple[Pricing, PriceSource] | None:
    """`resolve_pricing` with the source of the prices: the first layer that priced the endpoint
    (`config` for its own `pricing:` or `pricing.models`, then `table`, then `openrouter`). A first layer
    with an hourly price and no per-token one makes the endpoint self-hosted: per-token prices of the layers
    below are not taken."""
    layers: tuple[tuple[PriceSource, Pricing | None], ...] = (
        ("config", own),
        ("config", settings.models.get(model)),
        ("table", table.get(model)),
        ("openrouter", openrouter.get(model)),
    )
    first = next(((name, p) for name, p in layers if p is not None and p.fields_set()), None)
    found = resolve_pricing(own, model, settings, table, openrouter)
    if found is None or first is None:
        return None
    source, top = first
    if top.hourly is not None and top.token_price() is None:
        # Priced as self-hosted first: a per-token price further down (the model's hosted price elsewhere)
        # is not this endpoint's.
        found = found.model_copy(
            update={"input_per_mtok": None, "output_per_mtok": None, "cached_input_per_mtok": None}
        )
    return found, source
