"""Fixtures for the simulator tests; puts this folder on sys.path so tests can import `simhelpers`."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session (30 s total timeout) that never reuses connections, so close_after_stream is safe."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as s:
        yield s
