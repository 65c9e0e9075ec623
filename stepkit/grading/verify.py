"""Math-aware answer checking with math-verify, in a spawned process pool with a wall-clock timeout.

Why a process pool: math-verify's own timeouts use ``signal.alarm``, which raises "signal only works in
main thread" when called from a thread (case ``mv-signal-timeout-in-threads``), and a pathological
expression can keep sympy busy for minutes. Workers run with math-verify's timeouts disabled
(``parsing_timeout=None``, ``timeout_seconds=None``); the parent waits on each check for at most
``timeout`` seconds and kills and rebuilds a stuck pool. The pool uses the *spawn* context, because the
caller may hold vLLM threads, and forking a threaded process is unsafe.

All numeric settings are pinned here, in one place, and recorded in manifests via ``checker_settings()``.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import re
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from importlib.metadata import version

from math_verify import parse, verify

from stepkit.errors import ConfigError, StepkitError
from stepkit.grading.answers import extract_final_answer

# Base number of decimal places floats are rounded to before comparison (math-verify's default, 6), so
# that 1/3 matches 0.333333. verify_answer raises it per pair to the number of decimals actually written
# in the gold or the prediction: 0.0000001 vs 0.0000002 compares at 7 places and is False (case
# mv-float-rounding-false-positive), while 1/3 vs 0.333333 compares at 6 places and stays True.
FLOAT_ROUNDING = 6
# Significant digits for symbolic-numeric comparison (math-verify's default).
NUMERIC_PRECISION = 15
# math-verify strict mode: variables matter (x+1 != y+1) and sets are not equal to tuples.
STRICT = True
# Seconds allowed for a new pool's workers to start and import sympy/math-verify.
STARTUP_TIMEOUT = 120.0

_FLOAT_ROUNDING_RULE = "max(float_rounding, decimal places written in gold or prediction)"
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_DECIMALS = re.compile(r"\d*\.(\d+)")
_DIGITS = re.compile(r"\d")
# Unit text such as "\mbox{ inches}^2": its exponent is dropped by math-verify and is not a lost number.
_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\s*\{[^{}]*\}(?:\^\{?\d+\}?)?")


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; that is deliberate here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def checker_settings(
    float_rounding: int = FLOAT_ROUNDING, numeric_precision: int = NUMERIC_PRECISION
) -> dict:
    """The answer checker's settings, for run manifests (includes math-verify's version)."""
    return {
        "checker": "math-verify",
        "math_verify_version": version("math-verify"),
        "float_rounding": float_rounding,
        "float_rounding_rule": _FLOAT_ROUNDING_RULE,
        "numeric_precision": numeric_precision,
        "strict": STRICT,
        "wrap": r"\boxed{...} unless the answer already has $...$ or \boxed",
    }


def wrap_answer(answer: str) -> str:
    r"""Wrap a bare answer as ``\boxed{answer}`` so math-verify parses all of it.

    Unwrapped, math-verify parses bare LaTeX only up to its last simple number: ``1 - \sqrt{2}`` becomes
    ``1`` and ``1331 and 1728`` becomes ``1728`` (case ``mv-unwrapped-gold-truncated``). Answers that
    already contain unescaped ``$`` or ``\boxed`` are returned unchanged.
    """
    if _UNESCAPED_DOLLAR.search(answer) or "\\boxed" in answer:
        return answer
    return "\\boxed{" + answer + "}"


def _truncated(gold: str, matched: str) -> bool:
    r"""True when math-verify parsed only a piece of ``gold``: the text it matched is a substring of the
    gold with fewer digits (unit exponents such as ``\mbox{ cm}^2`` not counted). A normalized match
    (``2.5`` -> ``\frac{5}{2}``, ``\frac12`` -> ``\frac{1}{2}``) is not a substring and is accepted."""
    n_digits = len(_DIGITS.findall(_UNIT.sub("", gold)))
    return matched.strip() in gold and len(_DIGITS.findall(matched)) < n_digits


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    """Parse a gold answer; raise ConfigError when it parses to nothing or lost part of its text.

    The general rule behind ``mv-unwrapped-gold-truncated``: math-verify returns ``[expr, matched_text]``;
    a gold whose matched text is a shorter piece of it (``$1$ - \\sqrt{2}`` -> ``1``, see ``_truncated``)
    was parsed from a strict subset of itself, and comparing against it would accept wrong answers.
    Wrapping (``wrap_answer``) prevents this for bare golds; the check catches partially wrapped ones.
    """
    if gold is None or not str(gold).strip():
        raise ConfigError(f"empty gold answer: {gold!r}")
    gold = str(gold)
    parsed = parse(wrap_answer(gold), parsing_timeout=None)
    if not parsed:
        raise ConfigError(f"math-verify cannot parse gold answer {gold!r}")
    matched = parsed[-1] if isinstance(parsed[-1], str) else str(parsed[0])
    if _truncated(gold, matched):
        raise ConfigError(
            f"gold answer {gold!r} parses only as {matched!r}; "
            "give it as plain LaTeX without partial $...$ or \\boxed"
        )
    return parsed


def _decimals(text: str) -> int:
    """Largest number of decimal places of a number written in ``text`` (0 if none)."""
    return max((len(m) for m in _DECIMALS.findall(text)), default=0)


def verify_answer(
    gold: str,
    pred: str | None,
    float_rounding: int = FLOAT_ROUNDING,
    numeric_precision: int = NUMERIC_PRECISION,
) -> bool:
    """In-process check that an extracted answer ``pred`` is equivalent to ``gold`` (math-verify).

    Both are wrapped (``wrap_answer``) and parsed with math-verify's signal timeouts disabled, so this is
    safe in any thread, but has no timeout: use ``AnswerChecker`` for untrusted model output.
    Float rounding is ``max(float_rounding, decimals written in gold or pred)`` (see FLOAT_ROUNDING).

    Returns:
        True when equivalent; False when not, or when ``pred`` is None or does not parse.
    Raises:
        ConfigError: the gold answer is empty, does not parse, or parses to a strict subset of itself.
    """
    gold_parsed = _parse_gold(gold)
    if pred is None or not pred.strip():
        return False
    pred_parsed = parse(wrap_answer(pred), parsing_timeout=None)
    if not pred_parsed:
        return False
    return verify(
        gold_parsed,
        pred_parsed,
        float_rounding=max(float_rounding, _decimals(gold), _decimals(pred)),
        numeric_precision=numeric_precision,
        strict=STRICT,
        timeout_seconds=None,
    )


def _warm_up() -> bool:
    """First task of every worker: import and exercise sympy/math-verify before timed checks."""
    return verify_answer("1", "1")


class AnswerChecker:
    """Checks (gold, predicted answer) pairs with math-verify in a spawned process pool.

    Each check gets ``timeout`` seconds of wall-clock time; a check that exceeds it counts as False, is
    counted in ``timeouts``, and the pool is killed and rebuilt (other in-flight checks are re-run).
    Results are memoized per (gold, pred) pair, including timeouts. Workers start on first use.
    At most ``workers`` checks are in flight, so each one's clock starts when a worker is free.

    Raises (from ``check``/``check_many``):
        ConfigError: a gold answer is empty or unparseable (see ``verify_answer``).
        StepkitError: the pool cannot start, or a pair crashes its worker twice.
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
        self._cache: dict[tuple[str, str], bool] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # one batch at a time when called from several threads

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
        with self._lock:
            todo = list(dict.fromkeys(k for k in keys if k[1] is not None and k not in self._cache))
            if todo:
                self._run(todo)
            return [pred is not None and self._cache[(gold, pred)] for gold, pred in keys]

    def _run(self, keys: list[tuple[str, str]]) -> None:
        queue = deque(keys)
        running: dict[Future, tuple[tuple[str, str], float]] = {}
        crashed: set[tuple[str, str]] = set()
        try:
            while queue or running:
                pool = self._get_pool()
                while queue and len(running) < self.workers:
                    key = queue.popleft()
                    fut = pool.submit(verify_answer, *key, self.float_rounding, self.numeric_precision)
                    running[fut] = (key, time.monotonic() + self.timeout)
                first_deadline = min(deadline for _, deadline in running.values())
                wait(running, timeout=max(0.0, first_deadline - time.monotonic()), return_when=FIRST_COMPLETED)
                now, stuck = time.monotonic(), False
                for fut, (key, deadline) in list(running.items()):
                    if fut.done():
                        del running[fut]
                        try:
                            self._cache[key] = fut.result()
                        except BrokenProcessPool:  # a worker died (e.g. out of memory): retry once
                            if key in crashed:
                                raise StepkitError(f"answer check crashed its worker twice: {key!r}")
                            crashed.add(key)
                            queue.appendleft(key)
                            stuck = True
                    elif deadline <= now:
                        del running[fut]
                        self._cache[key] = False
                        self.timeouts += 1
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
            pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
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
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the worker processes (a later check starts new ones)."""
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
