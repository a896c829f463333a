"""What the commands that run in the foreground share (`serve`, `probe`, `demo`, `sim`): start the exporter,
wait for a signal, print runs as a table, and the `--web-config` flag."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from rich.console import Console
from rich.table import Table

from tokwatch.figures.result import RunResult
from tokwatch.serve.server import start_site
from tokwatch.settings.webconfig import WebConfig

if TYPE_CHECKING:
    from tokwatch.service.app import App


async def until_signal(on_hup: Callable[[], object] | None = None) -> None:
    """Wait for SIGTERM or SIGINT; SIGHUP calls `on_hup` when given. The handlers are removed on return."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_hup is not None:
        loop.add_signal_handler(signal.SIGHUP, on_hup)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


async def start_exporter(
    app: App, host: str, port: int, web_config: tuple[WebConfig, Path] | None = None
) -> tuple[web.AppRunner, int] | None:
    """Start probing and serving; None (after a clear message, app stopped) when the port can't be bound."""
    await app.start()
    try:
        return await start_site(app, host, port, web_config)
    except OSError as exc:
        await app.stop()
        print(f"tokwatch: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return None


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def print_results(results: Sequence[RunResult], title: str = "tokwatch probe") -> None:
    """A table of runs: endpoint, workload, status, tok/s and source, prefill tok/s, TTFT, ITL, tokens."""
    table = Table(title=title)
    for col in (
        "endpoint",
        "workload",
        "status",
        "tok/s",
        "source",
        "prefill tok/s",
        "TTFT ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "tokens",
        "error",
    ):
        table.add_column(
            col,
            justify="right" if col not in ("endpoint", "workload", "status", "source", "error") else "left",
        )
    for r in results:
        prefill = r.prefill_tokens_per_second
        table.add_row(
            r.endpoint,
            r.workload,
            r.status.value,
            "-" if r.tokens_per_second is None else f"{r.tokens_per_second:.1f}",
            r.source.value if r.source else "-",
            "-" if prefill is None else f"{prefill:.0f}",
            _ms(r.ttft_s),
            _ms(r.itl_percentile(50)),
            _ms(r.itl_percentile(99)),
            "-" if r.output_tokens is None else str(r.output_tokens + (r.think_tokens or 0)),
            (r.error_class or "") if not r.ok else "",
        )
    Console(width=160).print(table)


def add_web_config_option(p: argparse.ArgumentParser) -> None:
    """`--web-config FILE` (TLS and basic auth, Prometheus exporter-toolkit format)."""
    p.add_argument(
        "--web-config",
        metavar="FILE",
        help="TLS and basic auth for every route, Prometheus exporter-toolkit format (docs/security.md)",
    )
