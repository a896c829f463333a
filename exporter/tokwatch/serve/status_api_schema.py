"""The JSON Schema (draft 2020-12) of the status API's answers, version `SCHEMA_VERSION`.

docs/api.md shows this schema verbatim (a test holds the two together) and the API tests validate every
answer against it. A change that removes or renames a field, or changes a type, is a new schema version;
adding a field is not (clients must ignore fields they do not know).
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1

_NUMBER_OR_NULL = {"type": ["number", "null"]}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "tokwatch status API, schema version 1",
    "oneOf": [{"$ref": "#/$defs/status"}, {"$ref": "#/$defs/endpoint"}, {"$ref": "#/$defs/error"}],
    "$defs": {
        "status": {
            "description": "GET /api/v1/status: every series of the fleet.",
            "type": "object",
            "required": [
                "schema_version", "kind", "generated_at", "site", "primary_window", "windows",
                "min_samples", "series",
            ],
            "additionalProperties": False,
            "properties": {
                "schema_version": {"const": SCHEMA_VERSION},
                "kind": {"const": "status"},
                "generated_at": {"type": "number", "description": "unix seconds the figures were computed"},
                "site": {"type": "string", "description": "this exporter's site ('' when none)"},
                "primary_window": {"$ref": "#/$defs/window_label"},
                "windows": {"type": "array", "items": {"$ref": "#/$defs/window_label"}, "minItems": 1},
                "min_samples": {"$ref": "#/$defs/min_samples"},
                "series": {"type": "array", "items": {"$ref": "#/$defs/series"}},
            },
        },
        "endpoint": {
            "description": "GET /api/v1/endpoints/NAME: one endpoint's series.",
            "type": "object",
            "required": [
                "schema_version", "kind", "generated_at", "site", "primary_window", "windows",
                "min_samples", "endpoint", "series",
            ],
            "additionalProperties": False,
            "properties": {
                "schema_version": {"const": SCHEMA_VERSION},
                "kind": {"const": "endpoint"},
                "generated_at": {"type": "number"},
                "site": {"type": "string"},
                "primary_window": {"$ref": "#/$defs/window_label"},
                "windows": {"type": "array", "items": {"$ref": "#/$defs/window_label"}, "minItems": 1},
                "min_samples": {"$ref": "#/$defs/min_samples"},
                "endpoint": {"type": "string"},
                "series": {"type": "array", "items": {"$ref": "#/$defs/endpoint_series"}},
            },
        },
        "error": {
            "description": "Any non-2xx answer: 404 unknown endpoint, 503 store unavailable or off.",
            "type": "object",
            "required": ["schema_version", "kind", "error"],
            "additionalProperties": False,
            "properties": {
                "schema_version": {"const": SCHEMA_VERSION},
                "kind": {"const": "error"},
                "error": {"type": "string"},
            },
        },
        "window_label": {"type": "string", "pattern": "^[0-9]+(s|m|h|d)$"},
        "min_samples": {
            "description": "samples each percentile needs before it is given (else null)",
            "type": "object",
            "required": ["p50", "p90", "p99"],
            "additionalProperties": False,
            "properties": {p: {"type": "integer", "minimum": 1} for p in ("p50", "p90", "p99")},
        },
        "series": {
            "description": "One endpoint's runs of one workload from one site.",
            "type": "object",
            "required": [
                "endpoint", "workload", "site", "model", "labels", "status", "last_run", "windows", "cost",
                "energy",
            ],
            "additionalProperties": False,
            "properties": {
                "endpoint": {"type": "string"},
                "workload": {"type": "string"},
                "site": {"type": "string"},
                "model": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "status": {
                    "type": ["string", "null"],
                    "description": "status of the newest run of any kind (ok, timeout, ...); null before one",
                },
                "last_run": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/last_run"}]},
                "windows": {
                    "type": "object",
                    "description": "figures per window label; every label of `windows` is present",
                    "propertyNames": {"$ref": "#/$defs/window_label"},
                    "additionalProperties": {"$ref": "#/$defs/window"},
                },
                "cost": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/cost"}]},
                "energy": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/energy"}]},
            },
        },
        "endpoint_series": {
            "description": "A series in the endpoint view: as in /status, with its network vs server time.",
            "type": "object",
            "required": [
                "endpoint", "workload", "site", "model", "labels", "status", "last_run", "windows", "network",
                "cost", "energy",
            ],
            "additionalProperties": False,
            "properties": {
                "endpoint": {"type": "string"},
                "workload": {"type": "string"},
                "site": {"type": "string"},
                "model": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "status": {"type": ["string", "null"]},
                "last_run": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/last_run"}]},
                "windows": {
                    "type": "object",
                    "propertyNames": {"$ref": "#/$defs/window_label"},
                    "additionalProperties": {"$ref": "#/$defs/window"},
                },
                "network": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/network"}]},
                "cost": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/cost"}]},
                "energy": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/energy"}]},
            },
        },
        "cost": {
            "description": (
                "The series' prices per million tokens in `currency` (docs/methodology.md, Cost and "
                "energy); null for an endpoint without prices. Hosted (allocation_method list_price): the "
                "prices now from `source` (config, table, openrouter), the blend, the effective price at "
                "the cache-hit share of the counted runs of the last 24 h. Self-hosted (compute_time): "
                "prompt, generation and blended from the newest priced run of the last 24 h. last_run_cost: "
                "what that run cost."
            ),
            "type": "object",
            "required": [
                "currency", "source", "input_per_mtok", "output_per_mtok", "cached_input_per_mtok",
                "blended_per_mtok", "effective_per_mtok", "prompt_per_mtok", "generation_per_mtok",
                "allocation_method", "last_run_cost", "cache_hit_share", "capacity_per_mtok", "capacity",
            ],
            "additionalProperties": False,
            "properties": {
                "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "source": {"enum": ["config", "table", "openrouter"]},
                "input_per_mtok": _NUMBER_OR_NULL,
                "output_per_mtok": _NUMBER_OR_NULL,
                "cached_input_per_mtok": _NUMBER_OR_NULL,
                "blended_per_mtok": _NUMBER_OR_NULL,
                "effective_per_mtok": _NUMBER_OR_NULL,
                "prompt_per_mtok": _NUMBER_OR_NULL,
                "generation_per_mtok": _NUMBER_OR_NULL,
                "allocation_method": {"enum": ["list_price", "compute_time"]},
                "last_run_cost": _NUMBER_OR_NULL,
                "cache_hit_share": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "capacity_per_mtok": _NUMBER_OR_NULL,
                "capacity": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/capacity"}]},
            },
        },
        "capacity": {
            "description": (
                "Self-hosted: the latest stored capacity search of the endpoint (tokwatch bench --search "
                "fluid|slo) that capacity_per_mtok is priced at: the hourly price over output_tokens_per_s "
                "(the output tokens/s measured at the rate found); lower_bound when no rate failed."
            ),
            "type": "object",
            "required": ["mode", "rate", "output_tokens_per_s", "measured_at", "lower_bound"],
            "additionalProperties": False,
            "properties": {
                "mode": {"enum": ["fluid", "slo"]},
                "rate": {"type": "number"},
                "output_tokens_per_s": {"type": "number"},
                "measured_at": {"type": "number"},
                "lower_bound": {"type": "boolean"},
            },
        },
        "energy": {
            "description": (
                "The series' energy (docs/methodology.md, Cost and energy); null for an endpoint without "
                "power_metrics_url. joules_per_output_token: median over the counted runs of the last 24 h "
                "of the energy above the idle baseline per output token; idle_watts: the baseline the "
                "newest metered run was measured against; joules_last_run: that run's total energy."
            ),
            "type": "object",
            "required": ["joules_per_output_token", "idle_watts", "joules_last_run"],
            "additionalProperties": False,
            "properties": {
                "joules_per_output_token": _NUMBER_OR_NULL,
                "idle_watts": _NUMBER_OR_NULL,
                "joules_last_run": _NUMBER_OR_NULL,
            },
        },
        "network": {
            "description": (
                "Medians over the last 24 h of counted ok runs with a TTFT, not cache-assisted "
                "(docs/methodology.md, Network phases): set-up phases where the round opened its "
                "connection; ttft_seconds over every run (the TTFT p50); the round trip, server_seconds "
                "(TTFT less the round trip), measured_ttft_seconds (their sum, about) and network_share "
                "(the median of round trip / TTFT) over the measured_runs that had a round trip."
            ),
            "type": "object",
            "required": [
                "runs", "measured_runs", "resolve_seconds", "connect_seconds", "tls_seconds",
                "processing_seconds", "network_rtt_seconds", "ttft_seconds", "server_seconds",
                "measured_ttft_seconds", "network_share",
            ],
            "additionalProperties": False,
            "properties": {
                "runs": {"type": "integer", "minimum": 1},
                "measured_runs": {"type": "integer", "minimum": 0},
                "resolve_seconds": _NUMBER_OR_NULL,
                "connect_seconds": _NUMBER_OR_NULL,
                "tls_seconds": _NUMBER_OR_NULL,
                "processing_seconds": _NUMBER_OR_NULL,
                "network_rtt_seconds": _NUMBER_OR_NULL,
                "ttft_seconds": _NUMBER_OR_NULL,
                "server_seconds": _NUMBER_OR_NULL,
                "measured_ttft_seconds": _NUMBER_OR_NULL,
                "network_share": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            },
        },
        "last_run": {
            "type": "object",
            "required": ["time", "status", "ok_time", "ok_tokens_per_second", "ok_timing_source"],
            "additionalProperties": False,
            "properties": {
                "time": {"type": "number"},
                "status": {"type": "string"},
                "ok_time": _NUMBER_OR_NULL,
                "ok_tokens_per_second": _NUMBER_OR_NULL,
                "ok_timing_source": {"type": ["string", "null"]},
            },
        },
        "window": {
            "type": "object",
            "required": [
                "runs", "ok_runs", "uptime", "cv", "cache_assisted_runs", "decode_tokens_per_second",
                "prefill_tokens_per_second", "ttft_seconds",
            ],
            "additionalProperties": False,
            "properties": {
                "runs": {"type": "integer", "minimum": 0},
                "ok_runs": {"type": "integer", "minimum": 0},
                "uptime": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "cv": _NUMBER_OR_NULL,
                "cache_assisted_runs": {"type": "integer", "minimum": 0},
                "decode_tokens_per_second": {"$ref": "#/$defs/percentiles"},
                "prefill_tokens_per_second": {"$ref": "#/$defs/percentiles"},
                "ttft_seconds": {"$ref": "#/$defs/percentiles"},
            },
        },
        "percentiles": {
            "type": "object",
            "required": ["samples", "p50", "p90", "p99"],
            "additionalProperties": False,
            "properties": {
                "samples": {"type": "integer", "minimum": 0},
                "p50": _NUMBER_OR_NULL,
                "p90": _NUMBER_OR_NULL,
                "p99": _NUMBER_OR_NULL,
            },
        },
    },
}  # fmt: skip
