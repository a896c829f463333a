"""A bench run's spans: each request's trace ids drawn when it is built, its span built and queued once
the whole run is over, so the load generator's loop does no tracing work while tokens arrive."""

from __future__ import annotations

from tokwatch.tracing.context import RequestTrace, new_ids
from tokwatch.tracing.otlp import SpanSink
from tokwatch.tracing.spans import BenchRecord, Peer, bench_span


class DeferredSpans:
    """Traces of the run's requests, kept with their records until `export`."""

    def __init__(self, endpoint: str, service: str, peer: Peer) -> None:
        self._endpoint, self._service, self._peer = endpoint, service, peer
        self._done: list[tuple[RequestTrace, BenchRecord]] = []

    def start(self) -> RequestTrace:
        """The trace of a request about to be built (a new trace for each request)."""
        return RequestTrace(new_ids())

    def finished(self, trace: RequestTrace, record: BenchRecord) -> None:
        """Keep a finished request for `export` (a list append: nothing else happens during the run)."""
        self._done.append((trace, record))

    def export(self, run_t0: float) -> int:
        """Open the sink, build every kept request's span and queue it, flush and close; returns the spans
        sent. The sink (and its thread) exists only now: a runner that never runs leaves nothing open."""
        if not self._done:
            return 0
        sink = SpanSink(self._endpoint, self._service)
        try:
            for trace, record in self._done:
                sink.emit(bench_span(trace, record, self._peer, sink.clock, run_t0=run_t0))
            return len(self._done)
        finally:
            self._done.clear()
            sink.close()
