"""Waiting in a test for something another task, thread or process makes true, within a time limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest


async def wait_until(
    check: Callable[[], object], limit_s: float, what: str, interval: float = 0.25
) -> object:
    """Await `check()` (sync or async) until it returns a truthy value; fail naming `what` on timeout."""
    deadline = time.monotonic() + limit_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit_s:g}s waiting for {what}")
        await asyncio.sleep(interval)
