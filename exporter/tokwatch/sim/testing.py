"""Run the simulator in-process for tests: `async with run_sim(config) as sim: ... sim.url ...`."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from tokwatch.sim.config import FaultSettings, SimConfig
from tokwatch.sim.runtime import ServerState, SimState
from tokwatch.sim.server import SIM_STATE, set_faults, start_runner
from tokwatch.sim.truth import RequestTruth


@dataclass
class RunningSim:
    """A simulator listening on 127.0.0.1; `url` has no trailing slash."""

    url: str
    app: web.Application

    @property
    def state(self) -> SimState:
        """The live simulator state (servers, engines, truth)."""
        return self.app[SIM_STATE]

    def server(self, name: str) -> ServerState:
        """One simulated server's state; KeyError when unknown."""
        return self.state.servers[name]

    def base_url(self, server: str) -> str:
        """`http://127.0.0.1:PORT/<server>` — what an endpoint's base_url points at."""
        return f"{self.url}/{server}"

    def truth(self, request_id: str) -> RequestTruth | None:
        """Ground truth of a request (from its x-sim-request-id header)."""
        return self.state.truth.get(request_id)

    def last_truth(self, server: str | None = None) -> RequestTruth | None:
        """The most recent client request's truth."""
        return self.state.truth.last(server)

    def set_faults(self, server: str, model: str, **probs: float) -> FaultSettings:
        """Replace a model's fault probabilities, e.g. set_faults("vllm-a", "fast", http_429=1.0)."""
        return set_faults(self.state, server, model, dict(probs))

    def restart_counters(self, server: str) -> None:
        """Reset a server's /metrics counters as a process restart would."""
        self.server(server).restart()


@asynccontextmanager
async def run_sim(config: SimConfig, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[RunningSim]:
    """Start the simulator on 127.0.0.1 with an ephemeral port (HTTPS with `ssl_context`); stopped (handlers
    cancelled) on exit."""
    runner, app, port = await start_runner(config, "127.0.0.1", 0, ssl_context)
    try:
        yield RunningSim(f"{'https' if ssl_context is not None else 'http'}://127.0.0.1:{port}", app)
    finally:
        await runner.cleanup()
