"""Fixtures for probe tests: a shared HttpClient, context builder and one-model simulated servers (started
with `start_sim` from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tokwatch.probes.base import CounterWindow, ProbeContext, ProbeLog
from tokwatch.settings.config import EndpointSettings, ProbeSettings
from tokwatch.settings.redact import Redactor
from tokwatch.transport.http import HttpClient

MakeCtx = Callable[..., ProbeContext]


@pytest.fixture
async def http() -> AsyncIterator[HttpClient]:
    async with HttpClient() as client:
        yield client


@pytest.fixture
def make_ctx(http: HttpClient) -> MakeCtx:
    def make(
        base_url: str,
        kind: str = "openai",
        model: str = "m",
        *,
        api_key: str | None = None,
        counters: CounterWindow | None = None,
        endpoint: dict[str, Any] | None = None,
        **settings: Any,
    ) -> ProbeContext:
        ep = EndpointSettings(name="ep", kind=kind, base_url=base_url, model=model, **(endpoint or {}))
        s = ProbeSettings(**settings)
        return ProbeContext(
            endpoint=ep,
            settings=s,
            http=http,
            api_key=api_key,
            log=ProbeLog(Redactor([api_key])),
            counters=counters,
        )

    return make


def sim_server(name: str, dialect: str, **model: Any) -> dict[str, Any]:
    """One simulated server with one model named `m`."""
    return {"name": name, "dialect": dialect, "models": [{"name": "m", **model}]}


@pytest.fixture
def server() -> Callable[..., dict[str, Any]]:
    return sim_server
