"""What the test session lends to the commands it runs in-process: one answer-checker pool and at most one
loaded vLLM engine.

A command run in a fresh process starts its own answer-check workers (a spawn pool, ~2 s) and loads its
own model (~45 s on CPU). Run in-process by :func:`tests.conftest.run_cli`, it borrows them instead:

* the checker: each command still gets a new :class:`~stepkit.grading.verify.AnswerChecker` (its own memo,
  its own ``timeouts``/``crashes`` counters, its own settings), only its worker pool is the session's.
  A checker that kills its pool (a timeout) kills the shared one, and the next check starts a new one.
* the engine: ``make_engine("vllm", model, seed, **options)`` returns the session's engine when model,
  seed and options are the same as its own, with fresh ``stats`` and a ``close`` that keeps it loaded;
  anything else closes it first and loads the new one, so never two engines are alive at once (two CPU
  engines may not both fit in memory). Tests that use the Python API take the same engine with
  :func:`vllm_engine`.

:func:`release` closes the engine; a test that starts an engine in another process (a subprocess, a
server, a Ray actor) calls it first (the ``own_engine`` marker does that, see ``conftest.py``).
"""

from __future__ import annotations

import contextlib
from typing import Any

_pools: dict[int, Any] = {}  # workers -> the session's answer-check ProcessPoolExecutor
_engine: tuple[tuple, Any] | None = None  # (key, VLLMEngine)
_server: tuple[contextlib.ExitStack, Any] | None = None  # (its context, the ServerURL)
loads: list[tuple] = []  # every engine load of the session, in order (for the session's summary line)


def _lent_checker_class():
    from stepkit.grading.verify import AnswerChecker

    class LentChecker(AnswerChecker):
        """An AnswerChecker whose worker pool is the session's (see the module docstring)."""

        def _get_pool(self):
            pool = _pools.get(self.workers)
            if pool is None:
                pool = super()._get_pool()  # starts and warms a pool into self._pool
                _pools[self.workers] = pool
            self._pool = pool
            return pool

        def _kill_pool(self):
            if _pools.get(self.workers) is self._pool:
                del _pools[self.workers]
            super()._kill_pool()

        def close(self):
            self._pool = None  # the pool stays the session's

    return LentChecker


def vllm_engine(model: str = "smollm2-135m", seed: int = 0, **options):
    """The session's vLLM engine for ``model``/``seed``/``options``, loading it (and closing any other
    first) when needed. Its ``close`` is the real one: call :func:`release` instead."""
    global _engine
    import inspect

    from stepkit.engines.vllm_engine import VLLMEngine

    # the key is the engine as built: an option given at its default is the same engine as one left out
    defaults = {n: p.default for n, p in inspect.signature(VLLMEngine).parameters.items()
                if p.default is not inspect.Parameter.empty and n != "seed"}
    key = (model, seed, tuple(sorted({**defaults, **options}.items())))
    if _engine is not None and _engine[0] == key:
        return _engine[1]
    release()
    engine = VLLMEngine(model, seed=seed, **options)
    loads.append(key)
    _engine = (key, engine)
    return engine


def vllm_server():
    """The session's real vLLM OpenAI-compatible server for the bundled model (a
    :class:`tests.servers.ServerURL`), started when needed, after the session's engine is closed."""
    global _server
    if _server is not None and _server[1].server.running():
        return _server[1]
    release()
    from stepkit.models import resolve_model
    from tests.servers import vllm_server as start

    stack = contextlib.ExitStack()
    url = stack.enter_context(start(resolve_model("smollm2-135m")))
    loads.append(("server",))
    _server = (stack, url)
    return url


def release_engine() -> None:
    """Close the session's engine, if one is loaded."""
    global _engine
    if _engine is not None:
        _, engine = _engine
        _engine = None
        engine.close()


def release() -> None:
    """Close the session's engine and stop its server: nothing of the session's holds a model after."""
    global _server
    release_engine()
    if _server is not None:
        stack, _ = _server
        _server = None
        stack.close()


def close_all() -> None:
    """End of session: the engine and the checker pools."""
    release()
    for pool in list(_pools.values()):
        pool.shutdown(wait=True, cancel_futures=True)
    _pools.clear()


@contextlib.contextmanager
def lent():
    """While a command runs in-process: its answer checkers and vLLM engines are the session's."""
    from stepkit.engines import base
    from stepkit.grading import verify

    real_checker, real_make_engine = verify.AnswerChecker, base.make_engine
    borrowed = []

    def make_engine(name: str, model: str, seed: int = 0, **options):
        if name != "vllm":
            return real_make_engine(name, model, seed=seed, **options)
        base.checked_engine_options(name, options)  # a bad option fails as it would without the loan
        engine = vllm_engine(model, seed, **options)
        engine.stats = base.EngineStats()
        engine.reset_prefix_cache()  # as a fresh process sees it: no blocks an earlier test computed
        engine.close = lambda: None  # the session closes it
        borrowed.append(engine)
        return engine

    verify.AnswerChecker, base.make_engine = _lent_checker_class(), make_engine
    try:
        yield
    finally:
        verify.AnswerChecker, base.make_engine = real_checker, real_make_engine
        for engine in borrowed:
            engine.__dict__.pop("close", None)
