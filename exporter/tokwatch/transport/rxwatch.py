"""Receive stamps that do not wait for the event loop: a thread notes when bytes arrive on watched sockets.

An event loop reads a socket only after it has run every callback queued before it. Under a burst (dozens of
streams finishing and new requests being sent at once) that is tens of milliseconds after the bytes
arrived, and a stamp taken in `data_received` carries that delay. `ReceiveWatcher` waits in epoll on the
same sockets in its own thread (it never reads them) and, when the kernel signals new data, records how many
bytes of the stream had arrived by then: the loop's bytes consumed so far plus the unread bytes the kernel
holds (FIONREAD), stamped *after* both are read. A later read of bytes [start, start + n) is cut at those
records: the bytes up to a record's count had certainly arrived by its time, so each piece's stamp is never
earlier than its arrival and never later than the loop's own stamp. The loop hands the pieces to the HTTP
parser one by one, so two tokens that arrived 20 ms apart keep their gap even when one read took both.

Linux only (epoll, FIONREAD); elsewhere `available()` is False and reads keep the loop's stamp.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import select
import sys
import termios
import threading
import time
from collections import deque

from tokwatch.transport.measurement import SWITCH_INTERVAL_S

_POLL_S = 0.25  # the thread's poll timeout, only for noticing `stop()`
_NICE = -10


def available() -> bool:
    """Whether this platform has what the watcher needs."""
    return hasattr(select, "epoll") and hasattr(termios, "FIONREAD")


class ReceiveWatcher:
    """Stamps data arrival on registered sockets from a dedicated thread."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._consumed: dict[int, int] = {}  # fd -> bytes the loop has read so far
        self._seen: dict[int, deque[tuple[int, float]]] = {}  # fd -> (bytes arrived, by this time)
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._thread = threading.Thread(target=self._run, name="tokwatch-rxwatch", daemon=True)
        self._previous_switch: float | None = None
        self.records = 0  # arrival records taken (for tests and diagnostics)
        self.nice: int | None = None  # the thread's scheduling priority once it runs (_NICE when allowed)
        self.improved_reads = 0  # reads stamped earlier than the loop could have

    def start(self) -> None:
        """Start the thread; the GIL switch interval drops to SWITCH_INTERVAL_S meanwhile, so the thread gets
        the interpreter within half a millisecond of the kernel's wake-up even while the loop is busy."""
        self._previous_switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._previous_switch, SWITCH_INTERVAL_S))
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close the epoll instance."""
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._epoll.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._previous_switch is not None:
            sys.setswitchinterval(self._previous_switch)
            self._previous_switch = None

    def watch(self, fd: int) -> None:
        """Start stamping arrivals on a connected socket."""
        with self._lock:
            self._consumed[fd] = 0
            self._seen[fd] = deque()
        try:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLET)
        except OSError:
            self.forget(fd)

    def forget(self, fd: int) -> None:
        """Stop watching a socket (before it is closed, so a reused fd number starts clean)."""
        with self._lock:
            self._consumed.pop(fd, None)
            self._seen.pop(fd, None)
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(fd)

    def read_at(self, fd: int, nbytes: int, loop_stamp: float) -> list[tuple[int, float]]:
        """Split a read of `nbytes` the loop just delivered (stamped `loop_stamp` by the loop, or the kernel's
        receive time of its newest segment) into `(bytes, stamp)` pieces, one per arrival the thread saw,
        each the earlier of the two; bytes it did not see keep `loop_stamp`."""
        with self._lock:
            start = self._consumed.get(fd)
            if start is None:
                return [(nbytes, loop_stamp)]
            end = self._consumed[fd] = start + nbytes
            seen = self._seen[fd]
            pieces: list[tuple[int, float]] = []
            pos = start
            for arrived, t in seen:
                if arrived <= pos:
                    continue
                cut = min(arrived, end)
                pieces.append((cut - pos, min(t, loop_stamp)))
                pos = cut
                if pos >= end:
                    break
            if pos < end:
                pieces.append((end - pos, loop_stamp))
            while seen and seen[0][0] <= end:
                seen.popleft()  # fully read: these records can cover no later read
        if pieces[0][1] < loop_stamp:
            self.improved_reads += 1
        return pieces

    def _run(self) -> None:
        # Ahead of the loop thread and the server under test when cores are short (needs CAP_SYS_NICE,
        # e.g. root; without it the thread keeps the default priority).
        tid = threading.get_native_id()
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, tid, _NICE)
        with contextlib.suppress(OSError, AttributeError):
            self.nice = os.getpriority(os.PRIO_PROCESS, tid)
        buf = array.array("i", [0])
        while not self._stop.is_set():
            try:
                events = self._epoll.poll(_POLL_S)
            except OSError:
                return
            with self._lock:
                for fd, _mask in events:
                    if fd == self._wake_r:
                        continue
                    consumed = self._consumed.get(fd)
                    if consumed is None:
                        continue
                    try:
                        fcntl.ioctl(fd, termios.FIONREAD, buf, True)
                    except OSError:
                        continue
                    # Stamped after reading both counts: by now, this many bytes had certainly arrived.
                    t = time.perf_counter()
                    seen = self._seen[fd]
                    arrived = consumed + buf[0]
                    if buf[0] > 0 and (not seen or arrived > seen[-1][0]):
                        seen.append((arrived, t))
                        self.records += 1
