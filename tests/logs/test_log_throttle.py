"""Repeats of one message collapse with a count; a different message always passes; bursts give one line."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tokwatch.logs.log_throttle import ALWAYS_LOG, BurstLog, RepeatThrottle


def _record(level: int, msg: str, *args: object, name: str = "psycopg.pool") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


class Collect(logging.Handler):
    """The lines a handler with the throttle writes."""

    def __init__(self, throttle: RepeatThrottle) -> None:
        super().__init__()
        self.addFilter(throttle)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_repeats_of_one_message_collapse_with_the_count() -> None:
    now = [0.0]
    throttle = RepeatThrottle(period_s=60, clock=lambda: now[0])
    template = "error connecting in %r: %s"
    assert throttle.filter(_record(logging.WARNING, template, "pool", "refused"))
    assert not any(throttle.filter(_record(logging.WARNING, template, "pool", "refused")) for _ in range(9))
    now[0] = 61.0
    again = _record(logging.WARNING, template, "pool", "refused")
    assert throttle.filter(again)
    assert again.getMessage() == "error connecting in 'pool': refused (repeated 9 times in the last 60s)"
    now[0] = 200.0
    quiet = _record(logging.WARNING, template, "pool", "refused")
    assert throttle.filter(quiet) and quiet.getMessage() == "error connecting in 'pool': refused"


def test_a_different_message_always_passes() -> None:
    throttle = RepeatThrottle(period_s=60, clock=lambda: 0.0)
    template = "error connecting in %r: %s"
    assert throttle.filter(_record(logging.WARNING, template, "pool", "refused"))
    # The same template with other values is another error, and another template another message.
    assert all(throttle.filter(_record(logging.WARNING, template, "pool", f"refused {i}")) for i in range(5))
    assert throttle.filter(_record(logging.WARNING, "storage: %s", "something else"))
    forced = _record(logging.ERROR, "storage: %s", "something else")
    setattr(forced, ALWAYS_LOG, True)
    assert throttle.filter(forced) and throttle.filter(forced)


def test_info_lines_are_never_throttled() -> None:
    throttle = RepeatThrottle(period_s=60, clock=lambda: 0.0)
    assert all(throttle.filter(_record(logging.INFO, "endpoint %s: timeout", "a")) for _ in range(5))


async def test_five_different_reload_errors_give_five_lines_and_repeats_collapse(tmp_path: Path) -> None:
    """The app's own reload path, through the throttle of `tokwatch serve`'s log handler."""
    from tokwatch.service.app import App
    from tokwatch.settings.config import load_config

    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text("endpoints: [{name: a, kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}]\n")
    app = App(load_config(cfg), str(cfg))
    handler = Collect(RepeatThrottle(period_s=60))
    logger = logging.getLogger("tokwatch")
    logger.addHandler(handler)
    try:
        bad = [
            "endpoints: [{name: a, kind: nope, base_url: 'http://127.0.0.1:9/v1', model: m}]\n",
            "endpoints: [{name: a, kind: openai, base_url: 'ftp://x', model: m}]\n",
            "listen: localhost\n",
            "endpoints: [{name: a, kind: openai, base_url: 'http://127.0.0.1:9/v1'}]\n",
            "schedule: {interval: soon}\n",
        ]
        for text in bad:
            cfg.write_text(text)
            assert not (await app.reload())[0]
        failed = [line for line in handler.lines if line.startswith("config reload failed")]
        assert len(failed) == 5 and len(set(failed)) == 5
        for _ in range(3):
            assert not (await app.reload())[0]  # the last bad file again: the same error, held back
        assert len([line for line in handler.lines if line.startswith("config reload failed")]) == 5
    finally:
        logger.removeHandler(handler)


async def test_a_burst_gives_one_line_with_its_count(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("tokwatch.test.burst")
    burst = BurstLog(log, logging.ERROR, lambda n, s: f"{n} dropped", quiet_s=0.2)
    with caplog.at_level(logging.ERROR, logger="tokwatch.test.burst"):
        for _ in range(9):
            burst.add()
        assert caplog.messages == []  # the burst is still going
        for _ in range(50):
            if caplog.messages:
                break
            await asyncio.sleep(0.05)
        assert caplog.messages == ["9 dropped"]
        burst.add(2)
        burst.flush()
        assert caplog.messages == ["9 dropped", "2 dropped"]
