"""SGLang probe: OpenAI-compatible answers from the simulator's sglang dialect."""

from __future__ import annotations

from tokwatch.figures.result import Status, TimingSource
from tokwatch.probes import get_probe
from tokwatch.probes.base import run_probe
from tokwatch.probes.sglang import SGLangProbe


async def test_sglang_ok(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("g", "sglang", decode_tps=250))
    probe = get_probe("sglang")
    assert isinstance(probe, SGLangProbe) and probe.uses_counters
    r = await run_probe(probe, make_ctx(sim.base_url("g"), "sglang", max_tokens=16))
    assert r.status is Status.OK and r.source is TimingSource.CLIENT_STREAM and r.output_tokens == 16
