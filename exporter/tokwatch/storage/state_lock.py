"""One owner per state: an exporter holds exclusive `flock`s on its state directory, outbox and SQLite file.

Two processes appending to one outbox each keep their own offset and count of it and truncate what the
other appended (issue 37: 8.5 % of runs lost, silently). The locks make the second process refuse to start
instead. `flock` locks belong to the open file and the kernel drops them when the process dies, so a kill -9
never leaves a stale lock. Each lock is a small sibling file holding the holder's PID (the lock would be
lost with the data file's descriptor otherwise: SQLite's own POSIX locks are dropped when any descriptor of
the file is closed, so the database file itself is never opened here). Readers (`tokwatch report`,
`db status`, the bench) take no lock: SQLite's own locking serves them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from tokwatch.storage.errors import StorageError

LOCK_SUFFIX = ".lock"
STATE_DIR_LOCK = "tokwatch.lock"


class StateLockedError(StorageError):
    """Another live process holds one of this exporter's state locks."""


@dataclass(frozen=True, slots=True)
class LockTarget:
    """What a lock protects (`what`: state directory, outbox, SQLite file) and its lock file."""

    what: str
    path: Path  # the protected file or directory
    lock_file: Path


def lock_target(what: str, path: Path, *, directory: bool = False) -> LockTarget:
    """The lock of `path`: `<dir>/tokwatch.lock` for a directory, `<file>.lock` for a file."""
    lock_file = path / STATE_DIR_LOCK if directory else path.with_name(path.name + LOCK_SUFFIX)
    return LockTarget(what, path, lock_file)


def holder_pid(lock_file: Path) -> int | None:
    """The PID written into a lock file by its holder (None when unreadable or not yet written)."""
    try:
        text = lock_file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


class StateLock:
    """Exclusive, non-blocking locks on a set of targets; all or none are held."""

    def __init__(self, targets: list[LockTarget]) -> None:
        unique: dict[str, LockTarget] = {}
        for t in targets:
            # One lock file per real path: two descriptors of one file would conflict with each other.
            unique.setdefault(os.path.realpath(t.lock_file), t)
        self.targets = list(unique.values())
        self._fds: list[int] = []

    @property
    def held(self) -> bool:
        """True while the locks are held."""
        return bool(self._fds)

    def acquire(self) -> None:
        """Take every lock or raise StateLockedError naming the path and the holder's PID (one line)."""
        if self._fds:
            return
        try:
            for target in self.targets:
                self._fds.append(self._lock(target))
        except BaseException:
            self.release()
            raise

    def _lock(self, target: LockTarget) -> int:
        try:
            target.lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StorageError(
                f"cannot lock {target.what} {target.path}: {target.lock_file}: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StorageError(
                    f"cannot lock {target.what} {target.path}: {exc.strerror or exc}"
                ) from None
            pid = holder_pid(target.lock_file)
            who = f"PID {pid}" if pid is not None else "a process whose PID is not written yet"
            raise StateLockedError(
                f"{target.what} {target.path} is in use by another tokwatch ({who}, lock "
                f'{target.lock_file}): give each exporter its own state (docs/storage.md, "One owner per '
                'state")'
            ) from None
        # Written after locking, so the PID in a locked file is always the holder's (or being written).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        return fd

    def release(self) -> None:
        """Drop the locks (the lock files stay: removing one would let two processes lock two inodes)."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
