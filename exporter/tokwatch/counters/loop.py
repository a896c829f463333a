"""One background task per watcher: started idempotently, cancelled and awaited on close."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


class BackgroundLoop:
    """Runs `make()` as a named task; `start()` is idempotent and `close()` waits for the task to end."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._make = make
        self._name = name
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the loop unless it is already running."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._make(), name=self._name)

    async def close(self) -> None:
        """Cancel the loop and wait for it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
