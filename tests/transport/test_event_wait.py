"""tokwatch.transport.event_wait: a timed wait on an event that never loses a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from tokwatch.transport.event_wait import wait_event


async def test_set_then_cancelled_in_the_same_iteration_still_cancels() -> None:
    """The race that kept a reloaded scheduler running after App.stop(): the event is set and the waiting
    task cancelled before it runs again. asyncio.wait_for on Python 3.11 returned normally here."""
    event = asyncio.Event()
    woke: list[bool] = []

    async def waiter() -> None:
        while True:  # as the scheduler: woken early, it waits again
            woke.append(await wait_event(event, 60.0))
            event.clear()

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5.0)
    assert task.cancelled()


async def test_returns_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5.0) is True
    assert await wait_event(event, -1.0) is True  # already set: no wait, even with no time left
