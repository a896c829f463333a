"""How the bench stamps what it receives: its HTTP client, and what `summary.json` says stamped the reads."""

from __future__ import annotations

from tokwatch import __version__
from tokwatch.bench.config import BenchOptions
from tokwatch.transport import rxwatch
from tokwatch.transport.http import HttpClient

BENCH_USER_AGENT = f"tokwatch-bench/{__version__}"


def bench_http_client(opts: BenchOptions) -> HttpClient:
    """The run's client: no connection-pool cap (no request ever waits for a connection after its send
    time), the kernel's receive stamps and the receive watcher as the options say."""
    return HttpClient(
        limit=0,
        user_agent=BENCH_USER_AGENT,
        watch_receives=opts.watch_receives,
        kernel_stamps=opts.kernel_stamped,
    )


def receive_stamps(opts: BenchOptions, base_url: str) -> str:
    """What stamped the run's reads (summary.json `client.receive_stamps`): `kernel` (the kernel's receive
    time), `watcher_thread`, both (`kernel+watcher_thread`) or `event_loop` (always over TLS)."""
    if not base_url.lower().startswith("http://"):
        return "event_loop"
    watcher = opts.watch_receives and rxwatch.available()
    if opts.kernel_stamped:
        return "kernel+watcher_thread" if watcher else "kernel"
    return "watcher_thread" if watcher else "event_loop"
