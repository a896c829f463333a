"""A workload with its own interval runs on a scheduler of its own, sharing the probe slots with the main one
(so two schedules never load one server at once), and a reload starts and stops those schedulers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path

from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.testing import run_sim

SIM = "servers:\n  - {name: s, dialect: llamacpp, models: [{name: m, decode_tps: 400, prefill_tps: 20000}]}\n"


def _config(sim_url: str, workloads: str) -> str:
    return f"""
probe: {{max_tokens: 16, workloads: {workloads}}}
schedule: {{interval: 1s, offset: 0s, per_server: 1}}
storage: {{enabled: false}}
endpoints:
  - {{name: a, kind: llamacpp, base_url: '{sim_url}/s', model: m}}
"""


async def _until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.05)


async def test_own_schedules_share_the_server_slots_and_follow_a_reload(tmp_path: Path) -> None:
    async with run_sim(load_sim_config_text(SIM)) as sim:
        workloads = "[seed000, {name: short, interval: 2s, offset: 0s, warmup: false}]"
        path = tmp_path / "tokwatch.yml"
        path.write_text(_config(sim.url, workloads))
        app = App(load_config_text(path.read_text()), str(path))
        assert set(app._plans()) == {None, (2.0, 0.0)}  # the main schedule and short's own
        await app.start()
        try:

            def runs(workload: str) -> int:
                state = app.probe_metrics.state("a", workload)
                return 0 if state is None else sum(state.runs.values())

            await _until(lambda: runs("seed000") >= 3 and runs("short") >= 2)
            assert len(app._schedulers) == 1
            # per_server 1 across both schedules: no two requests (warm-ups included) overlapped at the server
            truths = sim.state.truth.recent(limit=1000)
            spans = sorted((t.arrival, t.finished_at or t.arrival) for t in truths)
            assert len(spans) >= 8
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
            stats = app.scheduler_stats
            assert stats is not None and stats.running and stats.rounds >= 5

            path.write_text(_config(sim.url, "[seed000]"))  # short goes: its scheduler stops
            ok, message = await app.reload()
            assert ok, message
            assert app._schedulers == {} and app.probe_metrics.state("a", "short") is None
        finally:
            await app.stop()
