"""Spans over OTLP/HTTP against a real receiver on 127.0.0.1 (decoded with opentelemetry-proto): the bench's
and the probe's client spans, the simulator's server span in the same trace, attributes from the run's
record, span times equal to the record's stamps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rich.console import Console

from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.sim import StartSim
from tokwatch.bench.config import build_options
from tokwatch.bench.session import run_bench
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.tracing.spans import FIRST_TOKEN, LAST_TOKEN, OUTPUT_START, REQUEST_SENT, SLOT_TAKEN, THINK_END

SIM = """
servers:
  - name: v
    dialect: vllm
    models:
      - name: thinker
        decode_tps: 400
        prefill_tps: 100000
        think_tokens: 5
        tokens_per_chunk: 2
"""


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _near(a: int, b: int) -> bool:
    """Equal but for rounding: each stamp to the nanosecond, and a perf_counter float's own spacing (2 ns
    after months of uptime)."""
    return abs(a - b) <= 10


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


def _by_trace(spans: list[ReceivedSpan], kind: str) -> dict[int, ReceivedSpan]:
    return {s.trace_id: s for s in spans if s.kind == kind}


async def test_bench_request_spans_join_the_simulator_server_spans(tmp_path, start_sim: StartSim, receiver):
    sim = await start_sim(f"otlp_endpoint: '{receiver.url}'\n{SIM}")
    opts = build_options({
        "url": f"{sim.url}/v/v1", "kind": "vllm", "model": "thinker", "concurrency": 2, "number": 4,
        "output_tokens": "12", "input_tokens": "32", "live_interval": 60, "plots": False,
        "otlp_endpoint": receiver.url,
    })  # fmt: skip
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
    records = outcome.records
    assert len(records) == 4 and all(r.ok for r in records)
    spans = receiver.wait_for(8)  # the bench's four (flushed at the end of the run) and the sim's four
    assert set(receiver.paths) == {"/v1/traces"}
    clients, servers = _by_trace(spans, "client"), _by_trace(spans, "server")
    assert len(clients) == len(servers) == 4  # one trace per request
    port = int(sim.url.rsplit(":", 1)[1])
    for r in records:
        (client,) = (s for s in clients.values() if s.attributes["tokwatch.request_id"] == r.request_id)
        assert client.service == "tokwatch-bench" and client.name == "chat thinker"
        a = client.attributes
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "vllm"
        assert a["gen_ai.request.model"] == "thinker"
        assert a["gen_ai.response.model"] == r.response_model == "thinker"
        assert a["gen_ai.request.max_tokens"] == r.max_tokens == 12
        assert a["gen_ai.usage.input_tokens"] == r.prompt_tokens
        assert a["gen_ai.usage.output_tokens"] == r.generated_tokens == 12
        assert a["gen_ai.usage.reasoning.output_tokens"] == r.think_tokens == 5
        assert a["gen_ai.response.finish_reasons"] == [r.finish_reason]
        assert a["gen_ai.response.id"] == r.server_request_id
        assert (a["server.address"], a["server.port"]) == ("127.0.0.1", port)
        assert a["http.response.status_code"] == 200 and "error.type" not in a
        assert a["tokwatch.ttft_s"] == r.ttft_s and a["tokwatch.e2e_s"] == r.e2e_s
        assert a["gen_ai.response.time_to_first_chunk"] == r.ttft_s
        # The span's times are the record's stamps.
        ev = client.events
        assert _near(client.end_ns - client.start_ns, _ns(r.completed_at_s - r.dispatched_at_s))
        assert _near(ev[SLOT_TAKEN] - client.start_ns, _ns(r.started_at_s - r.dispatched_at_s))
        assert _near(ev[REQUEST_SENT] - ev[SLOT_TAKEN], _ns(r.sent_at_s - r.started_at_s))
        assert a["tokwatch.queue_time_s"] == r.queue_time_s and a["tokwatch.connect_s"] == r.connect_s
        assert _near(ev[FIRST_TOKEN] - ev[REQUEST_SENT], _ns(r.ttft_s))
        times = r.token_times_s()
        assert _near(ev[LAST_TOKEN] - ev[FIRST_TOKEN], _ns(times[-1] - times[0]))
        assert _near(ev[OUTPUT_START] - ev[THINK_END], _ns(r.ttot_s))
        # The simulator's span: a child of the bench's, in its trace, from the request's ground truth.
        server = servers[client.trace_id]
        assert server.parent_span_id == client.span_id and server.span_id != client.span_id
        assert server.service == "tokwatch-sim"
        truth = sim.truth(r.server_request_id)
        assert truth is not None
        assert server.attributes["gen_ai.response.id"] == truth.request_id
        assert server.attributes["gen_ai.usage.output_tokens"] == truth.tokens == r.generated_tokens
        assert server.attributes["gen_ai.usage.input_tokens"] == truth.prompt_tokens
        emitted = truth.emitted_at
        assert _near(server.events[LAST_TOKEN] - server.events[FIRST_TOKEN], _ns(emitted[-1] - emitted[0]))
        assert server.start_ns < client.events[FIRST_TOKEN] and client.start_ns < server.events[FIRST_TOKEN]


async def test_the_probe_run_span_and_the_server_span_share_a_trace(start_sim: StartSim, receiver):
    sim = await start_sim(f"otlp_endpoint: '{receiver.url}'\n{SIM}")
    cfg = load_config_text(f"""
probe: {{max_tokens: 16}}
schedule: {{interval: 1h, window_includes: [timing_disturbed]}}
storage: {{enabled: false}}
otlp: {{endpoint: '{receiver.url}', service_name: exporter-a}}
endpoints:
  - {{name: vllm, kind: vllm, base_url: '{sim.url}/v/v1', model: thinker, metrics_url: null}}
""")
    app = App(cfg)
    await app.start(schedule=False)
    try:
        result = (await app.probe("vllm")).result
    finally:
        await app.stop()  # flushes the exporter's spans
    assert result.ok, result.error_message
    spans = receiver.wait_for(2)
    (client,) = (s for s in spans if s.kind == "client")
    assert client.service == "exporter-a"
    a = client.attributes
    assert a["tokwatch.run_id"] == result.run_id and a["tokwatch.endpoint"] == "vllm"
    assert a["tokwatch.trigger"] == result.trigger == "scheduled" and "tokwatch.site" not in a
    assert a["gen_ai.request.model"] == "thinker" and a["gen_ai.request.max_tokens"] == 16
    assert a["gen_ai.usage.output_tokens"] == result.think_tokens + result.output_tokens == 16
    assert a["gen_ai.usage.input_tokens"] == result.prompt_tokens
    assert a["tokwatch.tokens_per_second"] == result.tokens_per_second
    assert a["tokwatch.timing_source"] == result.source.value
    ev = client.events
    assert _near(ev[REQUEST_SENT] - client.start_ns, _ns(result.send_delay_s))
    assert _near(ev[FIRST_TOKEN] - ev[REQUEST_SENT], _ns(result.ttft_s))
    assert _near(client.end_ns - ev[REQUEST_SENT], _ns(result.e2e_s))
    assert _near(ev[LAST_TOKEN] - ev[FIRST_TOKEN], _ns(sum(result.itl_s)))
    # The warm-up carried no traceparent: the only server span is the timed run's, a child of its span.
    servers = [s for s in receiver.wait_for(2) if s.kind == "server"]
    assert len(servers) == 1
    assert (servers[0].trace_id, servers[0].parent_span_id) == (client.trace_id, client.span_id)
    assert len(sim.state.truth.recent(None, 10)) == 2  # the warm-up and the timed run reached the sim


async def test_a_failed_run_is_an_error_span_with_its_error_type(start_sim: StartSim, receiver):
    sim = await start_sim(SIM)
    sim.set_faults("v", "thinker", http_429=1.0)
    cfg = load_config_text(f"""
probe: {{max_tokens: 8, warmup: false}}
storage: {{enabled: false}}
otlp: {{endpoint: '{receiver.url}/v1/traces'}}
endpoints:
  - {{name: vllm, kind: vllm, base_url: '{sim.url}/v/v1', model: thinker, metrics_url: null}}
""")
    app = App(cfg)
    await app.start(schedule=False)
    try:
        result = (await app.probe("vllm")).result
    finally:
        await app.stop()
    assert result.status.value == "rate_limited"
    (span,) = receiver.wait_for(1)
    assert span.status_code == 2 and span.status_message == result.error_class
    assert span.attributes["error.type"] == result.error_class
    assert span.attributes["http.response.status_code"] == 429
    assert span.attributes["tokwatch.status"] == "rate_limited"
    assert FIRST_TOKEN not in span.events and span.end_ns >= span.start_ns


@pytest.mark.slow  # two worker processes are spawned
async def test_with_worker_processes_each_sends_its_own_requests_spans(
    tmp_path, start_sim: StartSim, receiver
):
    sim = await start_sim(SIM)
    opts = build_options({
        "url": f"{sim.url}/v/v1", "kind": "vllm", "model": "thinker", "concurrency": 4, "number": 8,
        "workers": 2, "output_tokens": "8", "live_interval": 60, "plots": False,
        "otlp_endpoint": receiver.url,
    })  # fmt: skip
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
    assert len(outcome.records) == 8 and all(r.ok for r in outcome.records)
    spans = receiver.wait_for(8)
    sent = sorted(s.attributes["tokwatch.request_id"] for s in spans)
    assert sent == sorted(r.request_id for r in outcome.records)
    assert len({s.trace_id for s in spans}) == 8
