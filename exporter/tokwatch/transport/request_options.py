"""Request options shared by probe and benchmark: `extra_body` merging.

Which fields ask a kind's server for a fixed-length output is the kind's own answer
(`HttpProbe.fixed_output_fields` in `tokwatch.probes`).
"""

from __future__ import annotations

from typing import Any


def merge_body(body: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`body` updated with `extra`; nested objects (e.g. `options`, `stream_options`) merge key by key."""
    out = dict(body)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_body(out[key], value)
        else:
            out[key] = value
    return out
