"""Chunks in flight: how :func:`stepkit.runner.shard.run_shard` runs a shard's chunks through a stage.

A stage on the engine's asynchronous path (:attr:`stepkit.stage.Stage.asynchronous`) runs up to
``window`` chunks at once on one event loop (``await stage.aprocess(rows)`` per chunk), so the next
chunk's requests join the engine's batch while the previous chunk's slowest searches finish, instead of
each chunk being a barrier. Chunks still finish (are committed) in index order: a chunk done early waits
in memory for the ones before it, so a killed run has committed a prefix of the chunks it started plus
what an earlier run committed, and redoes at most the ``window`` chunks that were in flight. Any other
stage runs one chunk at a time (``stage.process(rows)``), as before.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

from stepkit.aio import run_sync
from stepkit.stage import Stage

Chunk = tuple[int, list[dict]]

ROWS_IN_FLIGHT = 128
"""Rows the default window keeps in flight (:func:`default_window`)."""
MIN_WINDOW, MAX_WINDOW = 4, 64


def default_window(chunk_size: int) -> int:
    """The window when ``--chunks-in-flight`` is not given: enough chunks of ``chunk_size`` rows for
    :data:`ROWS_IN_FLIGHT` rows, at least 4 and at most 64 (mcts-label's chunks of 8 problems: 16; binary
    mc-label's of 16 rows: 8; judge's, rollout's of 32: 4). A window counted in rows, not chunks: the
    engine sees as many searches at once whatever the chunk size, and what a killed run redoes (the chunks
    in flight) and what waits in memory for an earlier chunk's commit stay about 128 rows' worth.

    Why more than a few chunks: chunks commit in order, so a chunk whose slowest search is still running
    holds the window's later chunks, finished, in memory; the engine then only sees that search and the
    chunks still running. The deeper the window, the longer the engine stays full behind a slow chunk."""
    return max(MIN_WINDOW, min(MAX_WINDOW, -(-ROWS_IN_FLIGHT // max(1, chunk_size))))


def run_chunks(stage: Stage, chunks: Iterable[Chunk | None], window: int,
               start: Callable[[int, list[dict]], Any], finish: Callable[[int, list[dict], Any, tuple], None]) -> None:
    """Run every chunk of ``chunks`` through ``stage``, at most ``window`` at once for an asynchronous stage.

    Args:
        stage: the open stage.
        chunks: ``(index, rows)`` in the order to commit them; a None is a barrier (every chunk before it
            is finished before the next one is read: the parts pass of
            :func:`stepkit.runner.parts._uncommitted_chunks` looks at what was committed there).
        window: chunks in flight at once (1: one after another); ignored for a stage that is not
            asynchronous.
        start: ``start(i, rows) -> token``, called as chunk ``i`` starts (log, side-input joins), before the
            stage sees its rows.
        finish: ``finish(i, rows, token, result)`` with the stage's result, in index order (the commit).

    Raises:
        whatever the stage, ``finish`` or reading ``chunks`` raise (a chunk that fails, or cannot be read,
        stops the run once the chunks before it are finished; the chunks after it are cancelled, never
        committed).
    """
    if not stage.asynchronous:
        for item in chunks:
            if item is not None:
                i, rows = item
                token = start(i, rows)
                finish(i, rows, token, stage.process(rows))
        return
    _run_window(_window(stage, chunks, max(1, window), start, finish))


def _run_window(coro) -> None:
    """Run the window's coroutine on a loop of its own. In the main thread, SIGINT and SIGTERM (when a Python
    handler has them: the CLI's, or Ctrl-C's) are taken by the loop while it runs: the first cancels the window
    (the chunks in flight are cancelled and awaited, so nothing is left pending), then the handler that had the
    signal is called, and raises as it would have (``Interrupted``: one line); a second signal during that calls
    it at once. Without this, the handler's exception was raised inside a chunk's task, and the loop closed on
    tasks still pending: dozens of lines of asyncio tracebacks after the one line (breaking run, 2026-12-03)."""
    import asyncio
    import signal
    import threading

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:  # (beside a running loop: in a thread of its own, where no signal arrives)
        run_sync(coro)
        return
    loop = asyncio.new_event_loop()
    main = loop.create_task(coro)
    caught: list[int] = []
    previous: dict = {}

    def on_signal(signum: int) -> None:
        if caught:  # a second signal while the window unwinds: at once
            previous[signum](signum, None)
        caught.append(signum)
        main.cancel()

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(s)
            if callable(handler):
                previous[s] = handler
                loop.add_signal_handler(s, on_signal, s)
    try:
        loop.run_until_complete(main)
    except asyncio.CancelledError:
        if not caught:
            raise
    finally:
        try:
            rest = asyncio.all_tasks(loop)
            for task in rest:
                task.cancel()
            if rest:
                loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            for s, handler in previous.items():
                loop.remove_signal_handler(s)
                signal.signal(s, handler)
            loop.close()
    if caught:
        previous[caught[0]](caught[0], None)  # raises (Interrupted, KeyboardInterrupt)
        raise KeyboardInterrupt  # (a handler that returned)


async def _window(stage: Stage, chunks: Iterable[Chunk | None], window: int, start, finish) -> None:
    import asyncio  # (the running loop has loaded it)

    pending: collections.deque = collections.deque()  # (i, rows, token, task), in index order

    async def drain(keep: int) -> None:
        while len(pending) > keep:
            i, rows, token, task = pending[0]
            result = await task
            pending.popleft()
            finish(i, rows, token, result)

    chunks = iter(chunks)
    try:
        while True:
            try:
                item = next(chunks)
            except StopIteration:
                break
            except Exception:  # the next chunk cannot be read (bad input): the chunks before it still commit
                await drain(0)
                raise
            if item is None:
                await drain(0)
                continue
            i, rows = item
            token = start(i, rows)
            pending.append((i, rows, token, asyncio.ensure_future(stage.aprocess(rows))))
            await drain(window - 1)
        await drain(0)
    finally:  # a failure or an interrupt: the chunks still in flight are never committed
        tasks = [task for *_, task in pending]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
