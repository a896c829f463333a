"""tokwatch.transport.precise_timer: a wait that ends at its planned instant, on asyncio's loop and on
uvloop's."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import Callable

import pytest

from tokwatch.transport import precise_timer
from tokwatch.transport.measurement import loop_name, new_loop
from tokwatch.transport.precise_timer import PreciseTimer

pytestmark = pytest.mark.skipif(not precise_timer.available(), reason="a Linux timerfd")


def _loops() -> list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]]:
    loops: list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]] = [("asyncio", asyncio.new_event_loop)]
    if importlib.util.find_spec("uvloop") is not None:
        loops.append(("uvloop", new_loop))
    return loops


@pytest.mark.parametrize(("name", "factory"), _loops())
def test_waits_end_at_their_instant_and_never_before(name: str, factory) -> None:
    """Instants a third of a millisecond apart: below uvloop's timer grain, where its own timers run at once
    (the wait spun) and asyncio's round up to the next millisecond."""

    async def main() -> tuple[str, list[tuple[float, float]]]:
        timer = PreciseTimer.open()
        assert timer is not None
        waits = []
        try:
            deadline = time.perf_counter()
            for _ in range(60):
                deadline += 0.0003
                await timer.until(deadline)
                waits.append((deadline, time.perf_counter()))
        finally:
            timer.close()
        return loop_name(asyncio.get_running_loop()), waits

    with asyncio.Runner(loop_factory=factory) as runner:
        ran_on, waits = runner.run(main())
    assert ran_on == name
    assert len(waits) == 60 and all(end >= deadline for deadline, end in waits)


async def test_an_instant_already_past_ends_the_wait_at_once() -> None:
    timer = PreciseTimer.open()
    assert timer is not None
    try:
        await asyncio.wait_for(timer.until(time.perf_counter() - 1.0), 10)
        await asyncio.wait_for(timer.until(0.5), 10)  # seconds after boot: long past, and not a zero value
    finally:
        timer.close()


async def test_wake_ends_a_far_wait_and_close_lets_go_of_the_descriptor() -> None:
    timer = PreciseTimer.open()
    assert timer is not None
    fd = timer._fd
    asyncio.get_running_loop().call_later(0.01, timer.wake)
    try:
        await asyncio.wait_for(timer.until(time.perf_counter() + 3600), 10)  # TimeoutError if wake() failed
    finally:
        timer.close()
    with pytest.raises(OSError):
        os.fstat(fd)
