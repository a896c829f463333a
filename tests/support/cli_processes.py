"""The command line as a process of its own, for tests: `tokwatch ...` through the interpreter running the
tests, the simulator config they share, waiting for a port to answer, stopping a process and reading its
run count."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

SIM = """
listen: 127.0.0.1:{port}
seed: 3
servers:
  - name: oa
    dialect: openai
    models:
      - {{name: m, decode_tps: 2000, prefill_tps: 100000}}
      - {{name: limited, decode_tps: 2000, faults: {{http_429: 1.0}}}}
      - {{name: stuck, decode_tps: 2000, faults: {{stall: 1.0}}}}
"""


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout}s")


def tokwatch(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tokwatch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )  # type: ignore[call-overload]


def read_lines_until(stream: IO[str], done: Callable[[list[str]], bool], timeout: float) -> list[str]:
    """The lines a process writes to `stream` until `done(lines)`, end of stream or `timeout` seconds.

    A thread reads, so lines Python already buffered are never stranded behind a select() on the descriptor.
    """
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not done(seen):
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
    return seen


def stop(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def runs_total(port: int) -> int:
    """The exporter's tokwatch_probe_runs_total, summed over every series."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in body.splitlines()
        if line.startswith("tokwatch_probe_runs_total{")
    )


@contextmanager
def cli_sim(tmp_path: Path, port: int) -> Iterator[str]:
    """`tokwatch sim` with `SIM` on `port` as a process of its own; its base URL while it runs."""
    cfg = tmp_path / "sim.yml"
    cfg.write_text(SIM.format(port=port))
    proc = tokwatch("sim", "--config", str(cfg))
    try:
        wait_http(f"http://127.0.0.1:{port}/oa/v1/models")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
