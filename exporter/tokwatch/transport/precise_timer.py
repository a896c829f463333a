"""Waking an event loop at a planned instant, to the microsecond: a Linux timerfd in the loop's own poll.

The loops' timers have a millisecond grain: uvloop rounds a delay to whole milliseconds and runs one under
half a millisecond at once, so a wait for a planned send spins (a wake-up per loop pass until the instant);
asyncio rounds its poll timeout up, so sends land up to a millisecond late. A timerfd armed for the absolute
CLOCK_MONOTONIC instant (the clock of `time.perf_counter` on Linux) wakes the loop at that instant, give or
take the kernel's wake-up latency, at the cost of one system call per wait.

Linux only; `PreciseTimer.open()` returns None elsewhere (or when perf_counter is another clock), and the
caller keeps the loop's own timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import sys
import time

_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or not hasattr(time, "CLOCK_MONOTONIC"):
        return None
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        # the process's own symbols (libc among them): find_library would run ldconfig, milliseconds at the
        # start of a schedule
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


def available() -> bool:
    """Whether this platform has what the timer needs (Linux, a timerfd, perf_counter on CLOCK_MONOTONIC)."""
    return _libc() is not None


class PreciseTimer:
    """One timerfd on one running loop: `await until(t)` returns at perf_counter `t`, or at `wake()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL, fd: int) -> None:
        self._loop = loop
        self._libc = libc
        self._fd = fd
        self._spec = _Itimerspec()
        self._waiter: asyncio.Future[None] | None = None
        loop.add_reader(fd, self._fired)

    @classmethod
    def open(cls) -> PreciseTimer | None:
        """A timer on the running loop, or None where a timerfd cannot be had (then use the loop's timers)."""
        libc = _libc()
        if libc is None:
            return None
        fd = libc.timerfd_create(time.CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            return None
        try:
            return cls(asyncio.get_running_loop(), libc, fd)
        except (NotImplementedError, OSError):  # a loop without add_reader (e.g. Windows' proactor)
            os.close(fd)
            return None

    async def until(self, deadline: float) -> None:
        """Return once perf_counter reaches `deadline` (absolute seconds), or earlier on `wake()`."""
        whole = int(deadline)
        nsec = min(999_999_999, int((deadline - whole) * 1e9))  # the product can round up to 1e9
        if whole == 0 and nsec == 0:
            nsec = 1  # an all-zero value would disarm the timer instead of firing it
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = whole, nsec
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        self._waiter = waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def wake(self) -> None:
        """End the current wait now (the run is stopping)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self._fd, 8)  # the expiry count; reading it re-arms the readiness
        self.wake()

    def close(self) -> None:
        """Stop watching the timerfd and close it."""
        with contextlib.suppress(RuntimeError, ValueError, OSError):  # the loop may be closed already
            self._loop.remove_reader(self._fd)
        with contextlib.suppress(OSError):
            os.close(self._fd)
