"""The answer checker: equivalence checks (:mod:`stepkit.grading.equivalence`) in a spawned process pool,
each with a wall-clock timeout.

Why a process pool: math-verify's own timeouts use ``signal.alarm``, which raises "signal only works in
main thread" when called from a thread (case ``mv-signal-timeout-in-threads``), and a pathological
expression can keep sympy busy for minutes. Workers run with math-verify's timeouts disabled
(``parsing_timeout=None``, ``timeout_seconds=None``); the parent waits on each check for at most
``timeout`` seconds and kills and rebuilds a stuck pool. The pool uses the *spawn* context, because the
caller may hold vLLM threads, and forking a threaded process is unsafe.

Importing this module is light: sympy and math-verify are imported by the workers only (the tasks sent to
them are this module's ``_check_pair``/``_check_gold``, which import the equivalence module there), and
the pool starts on the first check, so a stage that never grades pays nothing for its checker.

The equivalence functions stay importable from here (``from stepkit.grading.verify import verify_answer``
imports :mod:`stepkit.grading.equivalence` on first use); the settings are
:mod:`stepkit.grading.settings`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from stepkit.errors import ConfigError, StepkitError
from stepkit.grading.answers import extract_final_answer
from stepkit.grading.settings import FLOAT_ROUNDING, NUMERIC_PRECISION, checker_settings
from stepkit.grading.values import quote

# Seconds allowed for a new pool's workers to start and import sympy/math-verify.
STARTUP_TIMEOUT = 120.0

# Names of the equivalence module (and its settings) that stay importable from here, loaded on first use.
_EQUIVALENCE_NAMES = frozenset({
    "verify_answer", "gold_problem", "wrap_answer", "whole_answer", "exact_numbers_equal",
    "EXACT_BITS", "EXACT_DIGITS", "STRICT",
})


def __getattr__(name: str):
    """``verify_answer``, ``gold_problem``, ``whole_answer``, ... from :mod:`stepkit.grading.equivalence`,
    imported when first asked for (PEP 562), so that importing this module loads no sympy."""
    if name in _EQUIVALENCE_NAMES:
        from stepkit.grading import equivalence

        return getattr(equivalence, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_pair(gold: str, pred: str, float_rounding: int, numeric_precision: int) -> bool:
    """Worker task: ``verify_answer`` (imported in the worker, never in the parent)."""
    from stepkit.grading.equivalence import verify_answer

    return verify_answer(gold, pred, float_rounding, numeric_precision)


def _check_gold(gold: str) -> str | None:
    """Worker task: ``gold_problem`` (imported in the worker, never in the parent)."""
    from stepkit.grading.equivalence import gold_problem

    return gold_problem(gold)


def _exit_with_parent(parent_pid: int) -> None:
    """Worker initializer: exit when the parent process is gone (e.g. killed with SIGKILL alone, which
    leaves no chance to shut the pool down), instead of lingering as an orphan. Ctrl-C is ignored: a
    terminal sends SIGINT to the whole process group, and the parent shuts the pool down itself (a worker
    dying on it would print a traceback)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, daemon=True, name="stepkit-parent-watch").start()


def _warm_up() -> bool:
    """First task of every worker: import and exercise sympy/math-verify before timed checks."""
    return _check_pair("1", "1", FLOAT_ROUNDING, NUMERIC_PRECISION)


class AnswerChecker:
    """Checks (gold, predicted answer) pairs with math-verify in a spawned process pool.

    Each check gets ``timeout`` seconds of wall-clock time; a check that exceeds it counts as False, is
    counted in ``timeouts``, and the pool is killed and rebuilt (other in-flight checks are re-run).
    A check whose worker dies (killed from outside, out of memory) is run again once on a fresh pool; a
    pair that kills its worker a second time counts as False too and is counted in ``crashes``. Either way
    the pair is *ungradable* (:meth:`ungradable`): stages that grade an outcome leave it ungraded, and the
    run goes on. Results are memoized per (gold, pred) pair, including timeouts. Building a checker starts
    no process and imports no sympy: the pool starts on the first check (``check_many`` or
    ``gold_problems`` with something to check), so a stage that never grades pays nothing for it.
    At most ``workers`` checks are in flight, so each one's clock starts when a worker is free.

    Validate gold answers before generating with ``gold_problems``; ``check_many`` raises on a bad gold.

    Raises (from ``check``/``check_many``):
        ConfigError: a gold answer is unusable (see ``gold_problem``).
        StepkitError: the pool cannot start.
    """

    def __init__(
        self,
        timeout: float = 5.0,
        workers: int = 2,
        float_rounding: int = FLOAT_ROUNDING,
        numeric_precision: int = NUMERIC_PRECISION,
    ):
        if timeout <= 0 or workers < 1:
            raise ConfigError(f"answer checker needs timeout > 0 and workers >= 1, got {timeout}, {workers}")
        self.timeout, self.workers = timeout, workers
        self.float_rounding, self.numeric_precision = float_rounding, numeric_precision
        self.timeouts = 0
        self.crashes = 0
        self._ungradable: set[tuple[str, str]] = set()
        self._cache: dict[tuple[str, str], bool] = {}
        self._gold_cache: dict[str, str | None] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # one batch at a time when called from several threads
        self._closes = 0  # close() calls so far: a check asked for before the last one is abandoned

    def settings(self) -> dict:
        """``checker_settings()`` of this checker plus its timeout and worker count."""
        return {
            **checker_settings(self.float_rounding, self.numeric_precision),
            "timeout_s": self.timeout,
            "workers": self.workers,
        }

    def check(self, gold: str, pred: str | None) -> bool:
        """Check one pair; see ``check_many``."""
        return self.check_many([(gold, pred)])[0]

    def check_many(self, pairs: list[tuple[str, str | None]]) -> list[bool]:
        """Check (gold, extracted prediction) pairs; a None prediction is False. Order is kept."""
        keys = [(gold, pred) for gold, pred in pairs]
        asked = self._closes
        with self._lock:
            todo = list(dict.fromkeys(k for k in keys if k[1] is not None and k not in self._cache))
            if todo:
                self._run(todo, self._submit_pair, self._cache, timed_out=False, crashed=False,
                          failed=self._ungradable, asked=asked)
            return [pred is not None and self._cache[(gold, pred)] for gold, pred in keys]

    async def acheck_many(self, pairs: list[tuple[str, str | None]]) -> list[bool]:
        """``check_many`` for a coroutine: pairs all checked before (memoized) are answered at once; any
        other waits on the pool from a worker thread, so the event loop (the other searches' requests)
        keeps going meanwhile. Same results and errors as ``check_many``."""
        if all(pred is None or (gold, pred) in self._cache for gold, pred in pairs):
            return self.check_many(pairs)
        import asyncio

        return await asyncio.to_thread(self.check_many, pairs)

    def ungradable(self, gold: str, pred: str | None) -> bool:
        """True when the check of this pair (already made by ``check_many``) timed out or crashed its
        worker twice: its False says nothing about the answer."""
        return (gold, pred) in self._ungradable

    def grade_many(self, pairs: list[tuple[str, str | None]]) -> list[bool | None]:
        """``check_many``, with None for an ungradable pair (timed out, or crashed its worker twice)."""
        return self._graded(pairs, self.check_many(pairs))

    async def agrade_many(self, pairs: list[tuple[str, str | None]]) -> list[bool | None]:
        """``grade_many`` for a coroutine, waiting as :meth:`acheck_many` does (the event loop keeps going)."""
        return self._graded(pairs, await self.acheck_many(pairs))

    def _graded(self, pairs, oks: list[bool]) -> list[bool | None]:
        return [None if self.ungradable(*k) else ok for k, ok in zip(pairs, oks)]

    def gold_problems(self, golds: list[str]) -> dict[str, str | None]:
        """Validate gold answers before generating: gold -> one-line reason it is unusable, or None.

        Runs ``gold_problem`` in the pool with the same timeout (a gold whose parse times out is
        reported), memoized per gold. Never raises for a bad gold (empty, ``}``, mixed ``$1$ - \\sqrt{2}``,
        unparseable, parsed from a part of itself); a gold reported here makes ``check_many`` raise
        ConfigError.

        Raises:
            StepkitError: the pool cannot start.
        """
        asked = self._closes
        with self._lock:
            todo = list(dict.fromkeys(g for g in golds if g not in self._gold_cache))
            if todo:
                self._run(
                    todo,
                    self._submit_gold,
                    self._gold_cache,
                    timed_out=f"parsing it took longer than the {self.timeout:g} s answer-check timeout",
                    crashed="parsing it crashed the answer-check worker",
                    asked=asked,
                )
            return {g: self._gold_cache[g] for g in golds}

    async def agold_problems(self, golds: list[str]) -> dict[str, str | None]:
        """``gold_problems`` for a coroutine: golds all validated before are answered at once; others wait
        on the pool from a worker thread (the event loop keeps going). Same results and errors."""
        if all(g in self._gold_cache for g in golds):
            return self.gold_problems(golds)
        import asyncio

        return await asyncio.to_thread(self.gold_problems, golds)

    def _submit_pair(self, pool: ProcessPoolExecutor, key: tuple[str, str]) -> Future:
        return pool.submit(_check_pair, *key, self.float_rounding, self.numeric_precision)

    def _submit_gold(self, pool: ProcessPoolExecutor, gold: str) -> Future:
        return pool.submit(_check_gold, gold)

    def _run(self, keys: list, submit, cache: dict, timed_out, crashed, failed: set | None = None,
             asked: int | None = None) -> None:
        """Run ``submit(pool, key)`` for each key, storing results in ``cache``.

        ``asked``: the checker's count of ``close()`` calls when the check was asked for; a check the checker
        was closed after (a run stopped while worker threads still waited to check its answers) raises
        StepkitError instead of starting a new pool that nothing would close.

        A key running past ``timeout`` gets ``timed_out`` (counted in ``timeouts``; the pool is rebuilt).
        A key whose worker dies is retried once, alone on the pool; dying twice gives ``crashed`` (counted in ``crashes``), or
        raises StepkitError when ``crashed`` is None. Keys that timed out or crashed go into ``failed``.
        Other exceptions from a worker propagate.
        """
        queue = deque(keys)
        running: dict[Future, tuple[object, float]] = {}
        died: set = set()
        try:
            while queue or running:
                if asked is not None and asked != self._closes:
                    raise StepkitError("the answer checker was closed while this check waited (the run stopped)")
                pool = self._get_pool()
                # A key whose worker died runs again alone: a pool breaks as a whole, so a key that kills
                # its worker must not take the other keys in flight down with it a second time.
                alone = any(k in died for k, _ in running.values())
                while queue and len(running) < self.workers and not alone:
                    if queue[0] in died and running:
                        break
                    key = queue.popleft()
                    running[submit(pool, key)] = (key, time.monotonic() + self.timeout)
                    alone = key in died
                first_deadline = min(deadline for _, deadline in running.values())
                wait(running, timeout=max(0.0, first_deadline - time.monotonic()), return_when=FIRST_COMPLETED)
                now, stuck = time.monotonic(), False
                for fut, (key, deadline) in list(running.items()):
                    if fut.done():
                        del running[fut]
                        try:
                            cache[key] = fut.result()
                        except BrokenProcessPool:  # a worker died (e.g. out of memory): retry once
                            if key in died:
                                if crashed is None:
                                    raise StepkitError(f"answer check crashed its worker twice: {quote(key)}") from None
                                cache[key] = crashed
                                self.crashes += 1
                                if failed is not None:
                                    failed.add(key)
                            else:
                                died.add(key)
                                queue.appendleft(key)
                            stuck = True
                    elif deadline <= now:
                        del running[fut]
                        cache[key] = timed_out
                        self.timeouts += 1
                        if failed is not None:
                            failed.add(key)
                        stuck = True
                if stuck:  # re-run unfinished checks on a fresh pool
                    queue.extendleft(key for key, _ in running.values())
                    running.clear()
                    self._kill_pool()
        except BaseException:
            if running:
                self._kill_pool()
            raise

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_exit_with_parent, initargs=(os.getpid(),))
            warm = [pool.submit(_warm_up) for _ in range(self.workers)]
            done, not_done = wait(warm, timeout=STARTUP_TIMEOUT)
            self._pool = pool
            errors = [f.exception() for f in done if f.exception() is not None]
            if not_done or errors:
                self._kill_pool()
                why = f"failed: {errors[0]!r}" if errors else f"did not start within {STARTUP_TIMEOUT:.0f} s"
                raise StepkitError(f"answer-check worker processes {why}")
        return self._pool

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # ProcessPoolExecutor has no public kill before Python 3.14 (kill_workers); _processes is stable.
        procs = list((pool._processes or {}).values())
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.join(5)
        manager = getattr(pool, "_executor_manager_thread", None)  # (shutdown forgets it)
        pool.shutdown(wait=False, cancel_futures=True)
        # Let the pool's manager thread see its dead workers and finish: one still closing its wake-up pipe
        # when the interpreter exits (a Ctrl-C mid-check) makes concurrent.futures print an OSError traceback.
        if manager is not None:
            manager.join(5)

    def close(self) -> None:
        """Stop the worker processes (a check asked for later starts new ones; one asked for before and still
        waiting raises StepkitError instead)."""
        self._closes += 1
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> AnswerChecker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def grade_text(checker: AnswerChecker, gold: str, text: str) -> tuple[str | None, bool]:
    """Extract the final answer of a solution/continuation ``text`` and check it against ``gold``.

    Returns:
        (extracted answer or None, correct). No extractable answer gives (None, False).
    Raises:
        ConfigError: bad gold answer (see ``verify_answer``).
    """
    answer = extract_final_answer(text)
    return answer, checker.check(gold, answer)
