"""The argument parser of every tokwatch command (re-exported by tokwatch.settings.argtypes): usage errors
are one
line naming the flag. A module of its own so `tokwatch healthcheck` parses without pydantic."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming the flag (exit 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        """`PROG: error: MESSAGE (see PROG --help)` on stderr, exit 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
