"""Outbox file: fsync'd framed appends, ordered peek/commit, torn records counted, disk full, restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tokwatch.storage.outbox import RS, Outbox, OutboxWriteError, Pending
from tokwatch.storage.rows import RunRow


def _p(i: int) -> Pending:
    return Pending(1000.0 + i, RunRow(run_id=f"r{i}", time=2000.0 + i, endpoint="e", status="ok"))


def test_append_peek_commit_in_order(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.jsonl")
    box.append([_p(i) for i in range(5)])
    assert box.pending == 5 and box.oldest_queued_at == 1000.0
    items, end = box.peek(3)
    assert [i.row.run_id for i in items] == ["r0", "r1", "r2"]
    box.commit(end, len(items))
    assert box.pending == 2 and box.oldest_queued_at == 1003.0
    reopened = Outbox(tmp_path / "o.jsonl")  # the committed offset survives a restart
    items, end = reopened.peek(10)
    assert [i.row.run_id for i in items] == ["r3", "r4"]
    reopened.commit(end, len(items))
    assert reopened.pending == 0 and (tmp_path / "o.jsonl").stat().st_size == 0


def test_torn_last_line_is_dropped_and_bad_lines_skipped(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    Outbox(path).append([_p(0), _p(1)])
    with path.open("ab") as f:
        f.write(b"not json\n")
        f.write(b'{"queued_at": 5, "row": {"run_id": "torn"')  # crash mid-append
    box = Outbox(path)
    assert box.pending == 2
    assert box.lost_records == 1  # the torn tail, cut off at open
    box.append([_p(2)])
    items, _ = box.peek(10)
    assert [i.row.run_id for i in items] == ["r0", "r1", "r2"]
    assert box.lost_records == 2  # and the unreadable line, counted once when replay passes it
    box.peek(10)
    assert box.lost_records == 2


def test_a_torn_record_does_not_swallow_the_next(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    Outbox(path).append([_p(0)])
    with path.open("ab") as f:
        f.write(RS + b'{"queued_at": 5, "row": {"run_')  # a write cut short, no newline...
    with path.open("ab") as f:
        f.write(RS + b'{"queued_at":1001.5,"row":{"run_id":"r9","time":1.0,"endpoint":"e","status":"ok"}}\n')
    box = Outbox(path)  # ...then another process appended a whole record after it
    items, _ = box.peek(10)
    assert [i.row.run_id for i in items] == ["r0", "r9"]
    assert box.lost_records == 1


def test_plain_json_lines_from_before_framing_are_read(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"queued_at":1.0,"row":{"run_id":"old","time":1.0,"endpoint":"e","status":"ok"}}\n')
    box = Outbox(path)
    box.append([_p(1)])
    assert [i.row.run_id for i in box.peek(10)[0]] == ["old", "r1"]


def test_disk_full_append_keeps_whole_records_and_says_how_many(tmp_path: Path, disk_full: Any) -> None:
    path = tmp_path / "o.jsonl"
    box = Outbox(path)
    batch = [_p(i) for i in range(100)]  # about 9 KiB: cut short at 4 KiB
    with disk_full.active(), pytest.raises(OutboxWriteError) as err:
        box.append(batch)
    stored = err.value.stored
    assert 0 < stored < 100 and "File too large" in str(err.value)
    assert path.stat().st_size <= disk_full.limit
    assert path.read_bytes().endswith(b"\n")  # cut back to the last whole record: no torn line left
    assert box.pending == stored
    with disk_full.active(), pytest.raises(OutboxWriteError) as again:  # still full: nothing more fits
        box.append([_p(100)])
    assert again.value.stored == 0
    reopened = Outbox(path)
    items, _ = reopened.peek(1000)
    assert [i.row.run_id for i in items] == [f"r{i}" for i in range(stored)]
    assert reopened.lost_records == 0


def test_row_round_trip_ignores_unknown_keys() -> None:
    row = RunRow(run_id="x", time=1.5, endpoint="e", status="timeout", error_message="boom", cold=True)
    data = row.to_json() | {"added_in_a_later_version": 1}
    assert RunRow.from_json(data) == row
