"""Waiting for an asyncio.Event with a time limit, without losing a cancellation.

`asyncio.wait_for(event.wait(), t)` on Python 3.11 returns normally when the task is cancelled in the same
loop iteration as the event is set, and the cancellation is lost: a scheduler woken by a config reload and
stopped at once kept running its rounds, and `App.stop()` waited for it forever. `asyncio.timeout` does not
swallow a cancellation, so every timed wait on an event goes through here.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set (True) or `timeout_s` passed (False); a cancellation always propagates."""
    try:
        async with asyncio.timeout(max(0.0, timeout_s)):
            await event.wait()
    except TimeoutError:
        return False
    return True
