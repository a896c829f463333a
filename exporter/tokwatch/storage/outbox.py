"""Durable local outbox: an append-only, fsync'd file of runs not yet in the database.

Records are framed as a JSON text sequence (RFC 7464): RS (0x1E), one JSON object, LF. A write cut short
(disk full, crash) leaves a fragment that the next record's RS separates from it, so the fragment is
detected and counted as lost instead of swallowing the record after it. Replay reads from a committed
byte offset (kept in `<file>.offset`, replaced atomically), so a crash during replay re-sends at most one
batch; the database ignores run ids it already has. When everything is replayed, both files are truncated.
Files from before framing (plain JSON lines) are read as well.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from tokwatch.figures.wording import counted
from tokwatch.storage.errors import StorageError
from tokwatch.storage.rows import RunRow

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pending:
    """A run waiting for the database, with the wall time it was submitted."""

    queued_at: float
    row: RunRow


RS = b"\x1e"  # json.dumps escapes control characters, so RS never occurs inside a record


class OutboxWriteError(StorageError):
    """An append failed part-way; the first `stored` runs are durable, the rest were not written."""

    def __init__(self, message: str, stored: int) -> None:
        super().__init__(message)
        self.stored = stored


def _encode(item: Pending) -> bytes:
    body = json.dumps({"queued_at": item.queued_at, "row": item.row.to_json()}, separators=(",", ":"))
    return RS + body.encode() + b"\n"


def _decode(fragment: bytes) -> Pending | None:
    try:
        data = json.loads(fragment)
        return Pending(float(data["queued_at"]), RunRow.from_json(data["row"]))
    except (ValueError, KeyError, TypeError):
        return None


def count_pending(path: Path) -> int:
    """Runs waiting in an outbox, read without changing it (an exporter may be appending to it right now:
    `db status` must not cut its record in progress as a torn tail)."""
    offset_path = path.with_name(path.name + ".offset")
    try:
        offset = int(offset_path.read_text(encoding="ascii").strip() or 0)
    except (FileNotFoundError, ValueError):
        offset = 0
    count = 0
    with path.open("rb") as f:
        f.seek(max(0, offset))
        for line in f:
            if line.endswith(b"\n"):
                count += sum(1 for frag in line.split(RS) if frag.strip() and _decode(frag) is not None)
    return count


class Outbox:
    """Thread-safe JSONL outbox; every public method may do file I/O (call it off the event loop)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset_path = path.with_name(path.name + ".offset")
        self._lock = threading.Lock()
        self._offset = 0
        self._count = 0
        self._oldest: float | None = None
        self.lost_records = 0  # torn or unreadable records met at open or replay (each counted once)
        self._counted_to = 0  # byte offset up to which replay has counted lost records
        self._open()

    @property
    def pending(self) -> int:
        """Runs in the outbox not yet replayed."""
        return self._count

    @property
    def offset(self) -> int:
        """Byte offset up to which runs are stored in the database."""
        return self._offset

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
        # A crash mid-append can leave a record without its newline: that run is lost; say so and count it.
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
        if keep >= self._offset:
            self.lost_records += 1
        log.warning("outbox %s: dropped a torn last record (%d bytes): 1 run lost", self.path, size - keep)

    def _scan(self) -> tuple[int, float | None]:
        count = 0
        oldest: float | None = None
        with self.path.open("rb") as f:
            f.seek(self._offset)
            for line in f:
                for item in self._parse(line, count_losses=False):
                    count += 1
                    oldest = item.queued_at if oldest is None else min(oldest, item.queued_at)
        return count, oldest

    def _parse(self, line: bytes, *, count_losses: bool = True) -> list[Pending]:
        """The records of one line: normally one; a torn record before it is a lost run."""
        items = []
        lost = 0
        for fragment in line.split(RS):
            if not fragment.strip():
                continue
            item = _decode(fragment)
            if item is None:
                lost += 1
            else:
                items.append(item)
        if lost and count_losses:
            self.lost_records += lost
            log.warning(
                "outbox %s: %s skipped: runs lost", self.path, counted(lost, "torn or unreadable record")
            )
        return items

    def append(self, items: list[Pending]) -> None:
        """Append runs and fsync before returning: once this returns they survive kill -9.

        A failed write (disk full) is cut back to the last whole record and raises OutboxWriteError
        saying how many of `items` are stored, so the caller keeps the others and nothing is lost silently.
        """
        if not items:
            return
        records = [_encode(p) for p in items]
        payload = b"".join(records)
        with self._lock:
            written = 0
            start = 0
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            except OSError as exc:
                raise OutboxWriteError(f"cannot write outbox {self.path}: {exc.strerror or exc}", 0) from None
            try:
                start = os.fstat(fd).st_size
                view = memoryview(payload)
                while written < len(payload):
                    written += os.write(fd, view[written:])
                os.fsync(fd)
            except OSError as exc:
                stored = self._cut_back(fd, start, records, written if written < len(payload) else 0)
                self._account(items[:stored])
                raise OutboxWriteError(
                    f"cannot write outbox {self.path}: {exc.strerror or exc}", stored
                ) from None
            finally:
                os.close(fd)
            self._account(items)

    def _cut_back(self, fd: int, start: int, records: list[bytes], written: int) -> int:
        """Truncate a failed append to its last whole record; returns how many records that keeps."""
        stored = 0
        keep = 0
        for record in records:
            if keep + len(record) > written:
                break
            keep += len(record)
            stored += 1
        try:
            os.ftruncate(fd, start + keep)
            os.fsync(fd)
        except OSError:
            # The fragment stays; replay finds and counts it. The kept records may not be on disk.
            log.error("outbox %s: could not cut back a failed append", self.path)
            return 0
        return stored

    def _account(self, items: list[Pending]) -> None:
        if not items:
            return
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
                items.extend(self._parse(line, count_losses=end > self._counted_to))
                self._counted_to = max(self._counted_to, end)  # a peek again after a failed write
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
                self._counted_to = 0
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
                items = self._parse(line, count_losses=False)
                if items:
                    return items[0].queued_at
        return None
