"""The OTLP/HTTP sink: finished spans go to a batch processor, whose own thread sends them (protobuf).

Needs the optional `otel` extra (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http); without it,
asking for an export is the one-line `OtelUnavailable`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from tokwatch.tracing.extra import MISSING_EXTRA, OtelUnavailable
from tokwatch.tracing.spans import Clock, RequestSpan

try:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode

    HAVE_OTEL = True
except ImportError:  # the optional extra is not installed
    HAVE_OTEL = False

_SAMPLED = 0x01


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: `endpoint` as given when it has a path, else `<endpoint>/v1/traces` (as
    OTEL_EXPORTER_OTLP_ENDPOINT is read)."""
    path = urlsplit(endpoint).path
    return endpoint if path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"


class SpanSink:
    """Sends finished spans to an OTLP/HTTP receiver through a batch processor (`close` flushes)."""

    def __init__(self, endpoint: str, service: str, *, version: str = "") -> None:
        if not HAVE_OTEL:
            raise OtelUnavailable(MISSING_EXTRA)
        self.url = traces_url(endpoint)
        self.clock = Clock()
        self._resource = Resource.create({"service.name": service})
        self._scope = InstrumentationScope("tokwatch", version or None)
        # A span waits at most a second before its batch is sent (the SDK default is 5 s).
        exporter = OTLPSpanExporter(endpoint=self.url, timeout=10)
        self._processor = BatchSpanProcessor(exporter, schedule_delay_millis=1000)

    def emit(self, span: RequestSpan) -> None:
        """Queue one span (the processor's thread exports it; a full queue drops it, never blocks)."""
        flags = TraceFlags(_SAMPLED)
        context = SpanContext(span.ids.trace_id, span.ids.span_id, is_remote=False, trace_flags=flags)
        parent = (
            None
            if span.parent_span_id is None
            else SpanContext(span.ids.trace_id, span.parent_span_id, is_remote=True, trace_flags=flags)
        )
        status = Status(StatusCode.ERROR, span.error) if span.error else Status(StatusCode.UNSET)
        self._processor.on_end(
            ReadableSpan(
                span.name,
                context=context,
                parent=parent,
                resource=self._resource,
                attributes=dict(span.attributes),
                events=[Event(e.name, timestamp=e.at_ns) for e in span.events],
                kind=SpanKind.CLIENT if span.kind == "client" else SpanKind.SERVER,
                status=status,
                start_time=span.start_ns,
                end_time=span.end_ns,
                instrumentation_scope=self._scope,
            )
        )

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (waiting at most `timeout_s`), then stop the processor's thread."""
        self._processor.force_flush(int(timeout_s * 1000))
        self._processor.shutdown()
