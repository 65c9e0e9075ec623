"""Run a coroutine to completion from synchronous code, whether or not this thread already runs an event loop.

A command run in-process beside another library's loop (Playwright's sync API, a notebook) would otherwise fail
with ``asyncio.run() cannot be called from a running event loop``."""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
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


def awaitable(fut: concurrent.futures.Future):
    """An asyncio future of this thread's running loop that takes the outcome of ``fut``, a future another
    thread resolves (an engine's request): :func:`asyncio.wrap_future` without one wake-up per future.

    ``wrap_future`` hands every outcome to the loop with ``call_soon_threadsafe``, which writes a byte to the
    loop's self-pipe, the pipe through which the loop also learns of SIGINT and SIGTERM. Hundreds of
    requests answered while the loop is busy (a scripted engine answers as each request is sent; vLLM
    finishes dozens of samples in one step) filled it, and a Ctrl-C was dropped ("Exception ignored when
    trying to write to the signal wakeup fd"), the run going on to its end. Here a future already done is
    copied at once, and outcomes that arrive from other threads wait in one list the loop empties, with at
    most one wake-up pending per loop. Cancelling the returned future cancels ``fut`` (as ``wrap_future``).
    """
    import asyncio  # (imported where used: importing a stage loads no asyncio)

    loop = asyncio.get_running_loop()
    out = loop.create_future()
    if fut.done():
        _copy_outcome(fut, out)
        return out
    with _WAKEUPS_LOCK:
        wakeups = _WAKEUPS.get(loop)
        if wakeups is None:
            wakeups = _WAKEUPS[loop] = _Wakeups(loop)
    out.add_done_callback(lambda o: fut.cancel() if o.cancelled() else None)
    fut.add_done_callback(lambda f: wakeups.add(f, out))
    return out


def _copy_outcome(fut: concurrent.futures.Future, out) -> None:
    if out.done():  # cancelled by its waiter meanwhile
        return
    if fut.cancelled():
        out.cancel()
    elif (exc := fut.exception()) is not None:
        out.set_exception(exc)
    else:
        out.set_result(fut.result())


class _Wakeups:
    """The outcomes one loop has still to copy, and whether a wake-up for them is already pending."""

    def __init__(self, loop):
        self.loop, self.lock, self.ready, self.pending = loop, threading.Lock(), [], False

    def add(self, fut: concurrent.futures.Future, out) -> None:
        with self.lock:
            self.ready.append((fut, out))
            if self.pending:
                return
            self.pending = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody waits for these any more
            pass

    def _drain(self) -> None:
        with self.lock:
            ready, self.ready, self.pending = self.ready, [], False
        for fut, out in ready:
            _copy_outcome(fut, out)


_WAKEUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_WAKEUPS_LOCK = threading.Lock()
