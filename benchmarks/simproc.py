"""The simulator in its own process for benchmarks, so client and server never share a loop or a lock."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

_CHILD = """
import asyncio, signal, sys
from tokwatch.sim import load_sim_config
from tokwatch.sim.server import start_runner

async def main():
    config = load_sim_config(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    started = [await start_runner(config, "127.0.0.1", 0) for _ in range(count)]
    print(" ".join(str(port) for _, _, port in started), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for runner, _, _ in started:
        await runner.cleanup()

asyncio.run(main())
"""


@contextlib.contextmanager
def simulator(config_text: str, *, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Run `tokwatch.sim` with this config in a child process; yields its base URL, stops it on exit."""
    with simulators(config_text, 1, start_timeout_s=start_timeout_s) as urls:
        yield urls[0]


@contextlib.contextmanager
def simulators(config_text: str, count: int, *, start_timeout_s: float = 30.0) -> Iterator[list[str]]:
    """`count` independent simulators of this config (each its own port, so tokwatch sees `count` servers)
    in one child process; yields their base URLs, stops them on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "sim.yml"
        cfg.write_text(config_text)
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(cfg), str(count)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        try:
            ports = _readline(proc, start_timeout_s).split()
            if len(ports) != count or not all(p.isdigit() for p in ports):
                raise SystemExit(f"simulator did not start (got {ports!r})")
            yield [f"http://127.0.0.1:{int(p)}" for p in ports]
        finally:
            stop(proc)


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    ready = sel.select(timeout_s)
    sel.close()
    return proc.stdout.readline() if ready else ""


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
