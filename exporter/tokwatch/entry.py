"""The `tokwatch` command's entry point. `tokwatch healthcheck ...`, exec'd every few seconds by container
probes, runs from tokwatch.commands.healthcheck alone: importing tokwatch.cli (the exporter, aiohttp, the
storage
backends) would cost it ~0.9 s of CPU and 80 MB each time. Every other command goes through tokwatch.cli,
which registers healthcheck too (after top-level flags such as `--log-level`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    # The imports are the choice this module exists for: only the command's own modules load.
    if args[:1] == ["healthcheck"]:
        from tokwatch.commands.healthcheck import main as healthcheck

        return healthcheck(args)
    from tokwatch.cli import main as cli

    return cli(args)
