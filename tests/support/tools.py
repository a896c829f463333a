"""Python tools of the test environment, run by the interpreter running the tests (never whatever `python`
or console script is first on PATH: a venv used without activating it has neither on PATH)."""

from __future__ import annotations

import importlib.util
import sys


def python_module(module: str) -> list[str] | None:
    """`[sys.executable, "-m", module]`, or None when that interpreter does not have the module."""
    if importlib.util.find_spec(module) is None:
        return None
    return [sys.executable, "-m", module]
