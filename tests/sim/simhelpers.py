"""Shared helpers for the simulator tests: config from YAML text, SSE/NDJSON readers."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tokwatch.sim.config import SimConfig, load_sim_config_text


def sim_config(text: str) -> SimConfig:
    """A SimConfig from YAML text."""
    return load_sim_config_text(text, "test.yml")


@dataclass
class SseRead:
    """Everything a streamed OpenAI-style response carried."""

    events: list[Any] = field(default_factory=list)  # parsed JSON of each data: line (except [DONE])
    arrival: list[float] = field(default_factory=list)  # perf_counter when each event was read
    pings: int = 0
    done: bool = False
    raw: bytes = b""


async def read_sse(resp: aiohttp.ClientResponse) -> SseRead:
    """Read an SSE body line by line, timestamping each data event."""
    out = SseRead()
    async for line in resp.content:
        out.raw += line
        now = time.perf_counter()
        text = line.decode().rstrip("\n")
        if text.startswith(":"):
            out.pings += 1
        elif text == "data: [DONE]":
            out.done = True
        elif text.startswith("data: "):
            out.events.append(json.loads(text[len("data: ") :]))
            out.arrival.append(now)
    return out


async def read_ndjson(resp: aiohttp.ClientResponse) -> list[Any]:
    """Read an NDJSON body into objects."""
    return [json.loads(line) for line in (await resp.read()).decode().splitlines() if line.strip()]


def chat_body(
    model: str | None = "m", max_tokens: int = 8, stream: bool = True, **extra: Any
) -> dict[str, Any]:
    """An OpenAI chat request."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Explain theory of relativity simply"}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }
    if model is not None:
        body["model"] = model
    return body
