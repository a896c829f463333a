"""`tokwatch.cli.main` sets the root logger up as a process does once: its handlers replaced by one writing
to stderr. Called inside a test, that handler would outlive the test on a stream pytest has closed (every
later record then prints a "Logging error" traceback). `own_root_handlers` gives the test a handler list of
its own, without such leftovers, and puts the original back after it."""

from __future__ import annotations

import logging

import pytest


def own_root_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """For one test: the root logger's handlers (pytest's own kept) and level, restored afterwards."""
    root = logging.getLogger()
    kept = [h for h in root.handlers if type(h) is not logging.StreamHandler]  # pytest's are subclasses
    monkeypatch.setattr(root, "handlers", kept)
    monkeypatch.setattr(root, "level", root.level)
