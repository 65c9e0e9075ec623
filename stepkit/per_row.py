"""The per-row patterns every LLM stage shares, written once below the stages.

* :func:`sample_parsed`: sample replies to one prompt until ``want`` of them parse, with up to ``retries``
  extra rounds (``retries=0`` and a parse that keeps the completion: one request of ``want`` samples, what
  ``rollout`` and ``mc-label`` ask for) (none at temperature 0, where the same prompt gives the same reply), each round's seed
  shifted so a per-request seed (GPU, servers) does not give the same unparseable reply again. It runs on
  the engine's asynchronous path (``await engine.agenerate``): a stage gathers one coroutine per row or
  item and the engine batches whatever is in flight, so no row waits for another's retries (the
  self-consistency loop of ProcessBench's critic, of ABSeeker's clue recovery, of an LLM verdict).
* :func:`engine_error`: an engine's error completion as the stage's :class:`~stepkit.errors.RowError`
  (the runner counts those against ``--max-error-rate``; the stage's own columns are nulled by the runner).
* :class:`Counters`: a stage's counters for one chunk (``counters.add("replies")``), the runner's summary
  and manifest read them as a plain dict (datatrove's ``stat_update``).
* :class:`ContinuationTally`: what the Monte Carlo labellers (``mc-label``, ``mcts-label``) check about the
  continuations themselves, beside grading them: how many are *empty* (:attr:`Completion.empty`: counted
  apart, a run where most are refused, :func:`empty_refusal`) and how many of a prefix's continuations are
  *distinct* texts (a run whose :func:`distinct_share` is below :data:`MIN_DISTINCT_SHARE` gets one
  warning, :func:`distinct_warning`).
* :func:`first_success`: a binary-search probe (``mc-label --mode binary``, ``mcts-label``) is decided by
  its first correct sample (the prefix's value is > 0 whatever the others say), so the search sends its
  next probe while the probe's other samples finish (:meth:`~stepkit.engines.base.Engine.agenerate_each`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepkit.engines.base import Completion, Request, SamplingConfig
from stepkit.errors import RowError, StepkitError

RETRY_SEED_STRIDE = 1_000_003
"""A retry round ``k`` samples with seed ``seed + k * RETRY_SEED_STRIDE``: per-request seeds are ``seed +
request index``, so a plain ``+ k`` would reuse another request's seed."""


class Counters(Counter):
    """A chunk's counters: ``counters.add(name, n=1)``; a :class:`collections.Counter` (a dict of ints), so
    the runner sums and reports it like the plain dict a stage may also return. Names with a zero count
    are kept when named at construction (``Counters("replies", "ties")``), so the summary shows them."""

    def __init__(self, *names: str):
        super().__init__({n: 0 for n in names})

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` (an int, or a bool counted as 0/1) to counter ``name``."""
        self[name] += int(n)


def engine_error(stage: str, completion: Completion) -> RowError:
    """The row error of an engine's error completion: ``"<stage>: engine: <why>"``."""
    return RowError(stage, f"engine: {completion.error}")


@dataclass
class Sampled:
    """What :func:`sample_parsed` got for one prompt.

    Attributes:
        parsed: the parsed values of the replies that parsed, in the order received (at most ``want``).
        replies: every reply's text in the order received, valid or not.
        failures: replies that failed to parse (retries included).
        last_failure: the last parse failure's message (None when none failed).
        error: the engine's row error when a reply was an error completion (sampling stopped there).
        retry_replies: replies sampled in a retry round.
        received: completions the engine returned, error completions included.
        completions: those completions, in the order received (error completions included).
    """

    parsed: list[Any] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    failures: int = 0
    last_failure: str | None = None
    error: RowError | None = None
    retry_replies: int = 0
    received: int = 0
    completions: list[Completion] = field(default_factory=list)


async def sample_parsed(engine, prompt: str, sampling: SamplingConfig, parse: Callable[[Completion], Any],
                        stage: str, want: int = 1, retries: int = 0,
                        parse_errors: tuple[type[Exception], ...] = (ValueError,),
                        stop_on_error: bool = True, seed_index: int | None = None) -> Sampled:
    """Sample replies to ``prompt`` until ``want`` parse, in at most ``1 + retries`` rounds.

    Round ``k`` asks for the ``want - len(parsed)`` replies still missing in one request (``n`` of them, so a
    prefix cache shares the prompt) with seed ``sampling.seed + k * RETRY_SEED_STRIDE``. ``parse(completion)``
    returns the parsed value or raises one of ``parse_errors`` (a parse failure: counted, its message kept,
    never a value). At temperature 0 there is one round whatever ``retries`` says. An error completion
    stops the sampling and is returned as :attr:`Sampled.error` (:func:`engine_error`); with
    ``stop_on_error`` off the round's other completions are still read (a stage that keeps every sample:
    rollout's rows, mc-label's counts), :attr:`Sampled.error` is the first error, and no retry round follows.

    Args:
        engine: an :class:`~stepkit.engines.base.Engine` (its ``agenerate``).
        prompt: the rendered prompt.
        sampling: the stage's sampling parameters.
        parse: reads one completion (its text and finish reason).
        stage: the stage's name, for the row error.
        want: replies that must parse (``votes`` for a judge, 1 for a clue list or a verdict).
        retries: extra rounds for replies that failed to parse.
        parse_errors: the exceptions that mean "did not parse".
        stop_on_error: stop at the first error completion (else read the rest of its round).
        seed_index: the request's :attr:`~stepkit.engines.base.Request.seed_index` (None: the engine's own
            numbering).

    Returns:
        A :class:`Sampled`.
    """
    out = Sampled()
    rounds = 1 + (retries if sampling.temperature > 0 else 0)
    for attempt in range(rounds):
        missing = want - len(out.parsed)
        if missing <= 0 or out.error is not None:
            break
        shifted = sampling if attempt == 0 else dataclasses.replace(
            sampling, seed=sampling.seed + attempt * RETRY_SEED_STRIDE)
        for c in await engine.agenerate(Request(prompt, missing, seed_index), shifted):
            out.received += 1
            out.completions.append(c)
            if c.finish_reason == "error":
                out.error = out.error or engine_error(stage, c)
                if stop_on_error:
                    return out
                continue
            out.replies.append(c.text)
            out.retry_replies += attempt > 0
            try:
                out.parsed.append(parse(c))
            except parse_errors as e:
                out.failures += 1
                out.last_failure = str(e)
    return out


async def first_success(draws: list, verdict: Callable[[Any], bool | None]) -> bool:
    """Wait on one probe's samples until one succeeds (True) or all of them are done (False).

    Args:
        draws: the probe's samples as asyncio futures or tasks (one per sample, any order of completion).
        verdict: ``verdict(result)`` of a finished sample: True a success (e.g. graded correct), False not,
            None a failure (an error completion). After a failure, or a sample that raised or was
            cancelled, no success decides early: the caller reads every sample, and the failure, in order.

    Returns:
        True as soon as a sample succeeded (the other samples may still be running: the caller reads them
        later for its counts), False once every sample is done with none succeeding (or a failure seen).
    """
    import asyncio  # (imported where used: a command's --help loads no asyncio)

    pending, failed = set(draws), False
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for d in done:
            v = None if d.cancelled() or d.exception() is not None else verdict(d.result())
            failed = failed or v is None
            if v and not failed:
                return True
    return False


MIN_DISTINCT_SHARE = 0.5
"""A labelling run whose :func:`distinct_share` is below this gets one warning: fewer than half of the
continuations beyond each prefix's first differ from the ones sampled before them at that prefix."""

MAX_EMPTY_SHARE = 0.5
"""A labelling run where more than this share of the continuations is empty is refused (:func:`empty_refusal`)."""


async def check_answers(checker, pairs: list[tuple[str, str | None]]) -> list[bool]:
    """``checker.check_many(pairs)`` from a coroutine without holding up the event loop: the checker's
    :meth:`~stepkit.grading.verify.AnswerChecker.acheck_many` when it has one (checks not memoized wait on
    its pool from a worker thread), else ``check_many`` itself (a stand-in checker)."""
    acheck = getattr(checker, "acheck_many", None)
    return await acheck(pairs) if acheck is not None else checker.check_many(pairs)


async def check_golds(checker, golds: list[str]) -> dict[str, str | None]:
    """``checker.gold_problems(golds)`` from a coroutine, as :func:`check_answers` does for answers."""
    agold = getattr(checker, "agold_problems", None)
    return await agold(golds) if agold is not None else checker.gold_problems(golds)


def distinct_texts(texts) -> int:
    """How many different texts ``texts`` holds (exact string equality: two samples that differ by one
    character are distinct)."""
    return len(set(texts))


class ContinuationTally:
    """The continuations of one prefix, as the labellers count them apart from their grades.

    ``add(texts)`` takes the texts of one prefix's non-empty, non-error continuations; the counters are
    ``distinct_continuations`` (distinct texts) and ``repeated_continuations`` (copies of a text already
    sampled at that prefix), over the *compared prefixes* (``compared_prefixes``: those with at least two
    such continuations; a single sample cannot repeat), which is what :func:`distinct_share` reads.
    """

    NAMES = ("compared_prefixes", "distinct_continuations", "repeated_continuations")

    @staticmethod
    def add(counters: dict, texts: list[str]) -> int:
        """Add one prefix's non-empty continuation texts to ``counters``; return their distinct count."""
        d = distinct_texts(texts)
        if len(texts) >= 2:
            counters["compared_prefixes"] = counters.get("compared_prefixes", 0) + 1
            counters["distinct_continuations"] = counters.get("distinct_continuations", 0) + d
            counters["repeated_continuations"] = counters.get("repeated_continuations", 0) + len(texts) - d
        return d


def distinct_share(counters: dict) -> float | None:
    """The share of a run's continuations, beyond the first of each compared prefix, whose text differs
    from every earlier one of the same prefix: ``(distinct - P) / (distinct + repeated - P)`` over the P
    compared prefixes (:class:`ContinuationTally`). 1.0: every continuation distinct; 0.0: every prefix's K
    continuations are copies of one text, whatever K. None when no prefix had two continuations."""
    p = counters.get("compared_prefixes", 0)
    d, rep = counters.get("distinct_continuations", 0), counters.get("repeated_continuations", 0)
    beyond = d + rep - p
    return (d - p) / beyond if p and beyond > 0 else None


def distinct_warning(stage: str, counters: dict, temperature: float | None = None) -> str | None:
    """The one warning of a run whose :func:`distinct_share` is below :data:`MIN_DISTINCT_SHARE`, or None.
    Its values are then estimated from copies of a few samples (an engine that ignores per-request seeds
    with n > 1, a GPU build that repeats samples, a deterministic server, temperature 0)."""
    share = distinct_share(counters)
    if share is None or share >= MIN_DISTINCT_SHARE:
        return None
    cause = ("temperature 0 makes every continuation of a prefix the same" if temperature == 0 else
             "the engine repeats samples (one that ignores per-request seeds with n > 1, a GPU build that "
             "repeats samples, a deterministic server or scripted stand-in)")
    return (f"{stage}: distinct share {share:.0%} (below {MIN_DISTINCT_SHARE:.0%}): of "
            f"{counters.get('distinct_continuations', 0) + counters.get('repeated_continuations', 0)} continuations "
            f"of {counters.get('compared_prefixes', 0)} prefixes, {counters.get('repeated_continuations', 0)} repeat "
            f"a text already sampled at their prefix, so the values come from copies of few samples; likely cause: "
            f"{cause}")


def empty_refusal(stage: str, empty: int, total: int) -> StepkitError | None:
    """The error that refuses a run where most continuations were empty (more than :data:`MAX_EMPTY_SHARE`
    of ``total``, the continuations that were not error completions), or None. One line naming the likely
    cause: the prompt already ends the assistant turn, or the model ends its turn at the prefix."""
    if total <= 0 or empty <= MAX_EMPTY_SHARE * total:
        return None
    return StepkitError(
        f"{stage}: {empty} of {total} continuations ({empty / total:.0%}) stopped at once with no text, so the "
        f"prefixes cannot be valued; likely cause: the chat template closes the assistant turn after the prefix "
        f"(the prompt ends with an end-of-turn token), or the model ends its turn at the prefix (look at a "
        f"rendered prompt and the model's stop tokens); the chunks committed so far are kept")
