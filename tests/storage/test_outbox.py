"""Outbox file: fsync'd appends, ordered peek/commit, torn-tail repair, restart."""

from __future__ import annotations

from pathlib import Path

from tokwatch.storage.outbox import Outbox, Pending
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
    box.append([_p(2)])
    items, _ = box.peek(10)
    assert [i.row.run_id for i in items] == ["r0", "r1", "r2"]
    assert box.skipped_lines >= 1


def test_row_round_trip_ignores_unknown_keys() -> None:
    row = RunRow(run_id="x", time=1.5, endpoint="e", status="timeout", error_message="boom", cold=True)
    data = row.to_json() | {"added_in_a_later_version": 1}
    assert RunRow.from_json(data) == row
