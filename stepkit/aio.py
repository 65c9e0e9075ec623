"""Run a coroutine to completion from synchronous code, whether or not this thread already runs an event loop.

A command run in-process beside another library's loop (Playwright's sync API, a notebook) would otherwise fail
with ``asyncio.run() cannot be called from a running event loop``."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Coroutine
from typing import Any


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run(coro)``; when this thread already runs a loop, the same in a worker thread of its own.

    Returns what ``coro`` returns and raises what it raises."""
    import asyncio  # (imported where used: importing a stage loads no asyncio)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stepkit-aio") as pool:
        return pool.submit(asyncio.run, coro).result()
