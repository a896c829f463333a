"""`tokwatch` commands and simulators as separate processes, as a user or a CI job runs them."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from tests.support.waiting import wait_until


async def tokwatch_cli(*argv: str, limit_s: float = 120.0) -> tuple[int, str, str]:
    """`python -m tokwatch ARGV`; returns (exit code, stdout, stderr). Killed after `limit_s`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tokwatch", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def bench_ran(code: int, err: str) -> bool:
    """A `tokwatch bench` run went through: exit 0, or 6 when the host was too busy for the client's own
    figures (its summary on stderr then says `[FAIL] client timing`: docs/bench.md, "Exit codes")."""
    return code == 0 or (code == 6 and "[FAIL] client timing" in err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def sim_process(
    tmp_path: Path, config: str, ready_path: str = "/oa/v1/models"
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """`python -m tokwatch sim` with `config` (`{port}` filled in), once `ready_path` answers 200 (60 s at
    most: a busy host starts a Python process slowly); yields (process, port) and kills it on exit."""
    port = _free_port()
    path = tmp_path / "sim.yml"
    path.write_text(config.format(port=port))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tokwatch", "sim", "--config", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                assert proc.returncode is None, f"the simulator exited with {proc.returncode}"
                try:
                    async with session.get(f"http://127.0.0.1:{port}{ready_path}") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_until(ready, 60, f"the simulator to answer {ready_path}", interval=0.1)
        yield proc, port
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def until_served(port: int, count: int, limit_s: float = 60.0) -> None:
    """Return once the simulator on `port` has completed `count` requests (its truth records; up to 100
    more recent ones may still be in flight)."""
    async with aiohttp.ClientSession() as session:

        async def served() -> bool:
            async with session.get(f"http://127.0.0.1:{port}/_sim/requests?last={count + 100}") as resp:
                records = (await resp.json())["requests"]
            return sum(1 for r in records if r["completed"]) >= count

        await wait_until(served, limit_s, f"{count} requests completed by the simulator", interval=0.1)
