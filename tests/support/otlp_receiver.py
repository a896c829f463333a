"""A real OTLP/HTTP trace receiver on 127.0.0.1, on its own thread (the bench flushes its spans from the
loop's thread, so a receiver on the test's loop would wait on it): POST /v1/traces bodies are decoded as
ExportTraceServiceRequest with opentelemetry-proto's protobufs and kept as `ReceivedSpan`s."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.support.thread_server import ThreadServer

SPAN_KINDS = {2: "server", 3: "client"}  # opentelemetry.proto.trace.v1.Span.SpanKind


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived: ids as ints, times in unix ns, attributes as Python values, events by name."""

    service: str
    scope: str
    name: str
    kind: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: dict[str, int]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ExportTraceServiceRequest."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out: list[ReceivedSpan] = []
    for rs in request.resource_spans:
        service = str(_attrs(rs.resource.attributes).get("service.name", ""))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        service=service,
                        scope=ss.scope.name,
                        name=s.name,
                        kind=SPAN_KINDS.get(s.kind, str(s.kind)),
                        trace_id=int.from_bytes(s.trace_id, "big"),
                        span_id=int.from_bytes(s.span_id, "big"),
                        parent_span_id=int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else None,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attrs(s.attributes),
                        events={e.name: e.time_unix_nano for e in s.events},
                        status_code=s.status.code,
                        status_message=s.status.message,
                    )
                )
    return out


class OtlpReceiver:
    """`with OtlpReceiver() as rx:` receives on `rx.url` (an OTLP endpoint: traces at /v1/traces)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.paths: list[str] = []
        self._changed = threading.Condition()
        self._server = ThreadServer(self._handler_class())
        self.url = self._server.url

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                spans = decode(body) if self.headers.get("Content-Type") == "application/x-protobuf" else []
                with receiver._changed:
                    receiver.paths.append(self.path)
                    receiver.spans.extend(spans)
                    receiver._changed.notify_all()
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if spans else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        return Handler

    def wait_for(self, count: int, timeout_s: float = 20.0) -> list[ReceivedSpan]:
        """Block until at least `count` spans arrived (AssertionError after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while len(self.spans) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.spans)} spans arrived of {count} expected"
                self._changed.wait(left)
            return list(self.spans)

    def __enter__(self) -> OtlpReceiver:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)
