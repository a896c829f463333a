"""Durable local outbox: an append-only, fsync'd JSONL file of runs not yet in the database.

Replay reads from a committed byte offset (kept in `<file>.offset`, replaced atomically), so a crash during
replay re-sends at most one batch; the database ignores run ids it already has. When everything is
replayed, both files are truncated.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from tokwatch.storage.errors import StorageError
from tokwatch.storage.rows import RunRow

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pending:
    """A run waiting for the database, with the wall time it was submitted."""

    queued_at: float
    row: RunRow


def _encode(item: Pending) -> bytes:
    return (
        json.dumps({"queued_at": item.queued_at, "row": item.row.to_json()}, separators=(",", ":")).encode()
        + b"\n"
    )


class Outbox:
    """Thread-safe JSONL outbox; every public method may do file I/O (call it off the event loop)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset_path = path.with_name(path.name + ".offset")
        self._lock = threading.Lock()
        self._offset = 0
        self._count = 0
        self._oldest: float | None = None
        self.skipped_lines = 0
        self._open()

    @property
    def pending(self) -> int:
        """Runs in the outbox not yet replayed."""
        return self._count

    @property
    def oldest_queued_at(self) -> float | None:
        """Submission time of the oldest pending run."""
        return self._oldest

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                self.path.touch()
            self._offset = self._read_offset()
            self._drop_torn_tail()
            self._count, self._oldest = self._scan()
        except OSError as exc:
            raise StorageError(f"cannot open outbox {self.path}: {exc.strerror or exc}") from None
        if self._count:
            log.info("outbox %s holds %d unreplayed runs", self.path, self._count)

    def _read_offset(self) -> int:
        try:
            value = int(self._offset_path.read_text(encoding="ascii").strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            log.warning("outbox offset file %s is corrupt; replaying from the start", self._offset_path)
            return 0
        return min(max(value, 0), self.path.stat().st_size)

    def _drop_torn_tail(self) -> None:
        # A crash mid-append can leave a line without its newline; that run was never acknowledged.
        size = self.path.stat().st_size
        if size == 0:
            return
        with self.path.open("rb+") as f:
            f.seek(max(0, size - 1))
            if f.read(1) == b"\n":
                return
            f.seek(0)
            data = f.read()
            keep = data.rfind(b"\n") + 1
            f.truncate(keep)
            os.fsync(f.fileno())
        log.warning("outbox %s: dropped a torn last line (%d bytes)", self.path, size - keep)

    def _scan(self) -> tuple[int, float | None]:
        count = 0
        oldest: float | None = None
        with self.path.open("rb") as f:
            f.seek(self._offset)
            for line in f:
                item = self._parse(line)
                if item is not None:
                    count += 1
                    oldest = item.queued_at if oldest is None else min(oldest, item.queued_at)
        return count, oldest

    def _parse(self, line: bytes) -> Pending | None:
        try:
            data = json.loads(line)
            return Pending(float(data["queued_at"]), RunRow.from_json(data["row"]))
        except (ValueError, KeyError, TypeError):
            self.skipped_lines += 1
            log.warning("outbox %s: skipped an unreadable line", self.path)
            return None

    def append(self, items: list[Pending]) -> None:
        """Append runs and fsync before returning: once this returns they survive kill -9."""
        if not items:
            return
        payload = b"".join(_encode(p) for p in items)
        with self._lock:
            try:
                with self.path.open("ab") as f:
                    f.write(payload)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise StorageError(f"cannot write outbox {self.path}: {exc.strerror or exc}") from None
            self._count += len(items)
            first = min(p.queued_at for p in items)
            self._oldest = first if self._oldest is None else min(self._oldest, first)

    def peek(self, limit: int) -> tuple[list[Pending], int]:
        """Up to `limit` oldest pending runs, in append order, and the offset that commits them."""
        with self._lock, self.path.open("rb") as f:
            f.seek(self._offset)
            items: list[Pending] = []
            end = self._offset
            while len(items) < limit:
                line = f.readline()
                if not line.endswith(b"\n"):
                    break
                end += len(line)
                item = self._parse(line)
                if item is not None:
                    items.append(item)
            return items, end

    def commit(self, end: int, replayed: int) -> None:
        """Mark everything before byte `end` as stored; truncate when the outbox is empty."""
        with self._lock:
            size = self.path.stat().st_size
            if end >= size:
                with self.path.open("rb+") as f:
                    f.truncate(0)
                    os.fsync(f.fileno())
                self._offset = 0
                self._count = 0
                self._oldest = None
                self._offset_path.unlink(missing_ok=True)
                return
            tmp = self._offset_path.with_name(self._offset_path.name + ".tmp")
            with tmp.open("w", encoding="ascii") as f:
                f.write(str(end))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._offset_path)
            self._offset = end
            self._count = max(0, self._count - replayed)
            self._oldest = self._oldest_after_offset() if self._count else None

    def _oldest_after_offset(self) -> float | None:
        # Appends are in queue order, so the first readable line is (nearly always) the oldest.
        with self.path.open("rb") as f:
            f.seek(self._offset)
            for line in f:
                try:
                    return float(json.loads(line)["queued_at"])
                except (ValueError, KeyError, TypeError):
                    continue
        return None
