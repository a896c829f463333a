"""Rules the test suite keeps so that it runs the same wherever it is started (README, "Test lanes")."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# `"python"` or `"python3"` as a command word, or a console script of the test extra looked up on PATH
FROM_PATH = re.compile(
    r"""["']python3?(\.\d+)?["']\s*[,\])]|which\(["'](python|tokwatch|check-jsonschema|kubernetes-validate)"""
)


def test_no_test_runs_python_or_its_tools_from_path() -> None:
    """The package and its Python tools run with `sys.executable` (tests/support/tools.py): a venv used
    without activating it (`venv/bin/python -m pytest`) has neither `python` nor its scripts on PATH."""
    found = [
        f"{path.relative_to(TESTS.parent)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if "node_modules" not in path.parts and path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if FROM_PATH.search(line)
    ]
    assert not found, "run these with sys.executable:\n" + "\n".join(found)
