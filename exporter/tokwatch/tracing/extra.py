"""Whether the optional `otel` extra is installed, found without importing it (checked at config load)."""

from __future__ import annotations

from importlib.util import find_spec

MISSING_EXTRA = "OTLP export needs the 'otel' extra: pip install 'tokwatch[otel]'"
_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


class OtelUnavailable(ValueError):
    """OTLP export was asked for without the `otel` extra installed."""


def have_otel() -> bool:
    """The OpenTelemetry SDK and its OTLP/HTTP exporter are importable."""
    try:
        return all(find_spec(m) is not None for m in _MODULES)
    except ModuleNotFoundError:  # a parent package is missing
        return False


def require_otel() -> None:
    """Raise OtelUnavailable (the one-line message naming the extra) when the extra is missing."""
    if not have_otel():
        raise OtelUnavailable(MISSING_EXTRA)
