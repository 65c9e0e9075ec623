"""``mc-label``: Monte Carlo (MC) continuation estimates of the value of every step prefix.

Method (Math-Shepherd, Wang et al. 2024; PAV "Rewarding Progress", Setlur et al. 2024; OmegaPRM,
Luo et al. 2024). For a solution with M steps:

* the value after step i (i = 1..M-1) is estimated from K continuations of the prefix ``steps[:i]``:
  ``v_i = successes / (rollouts - truncated - empty)`` (continuations cut off by ``max_tokens``, and
  *empty* ones that stop at once with no text, are excluded from the denominator and reported, never
  counted as wrong: an empty continuation has no answer to grade; ``rollout`` keeps an empty completion
  as a row error for the same reason);
* the value after the last step, ``v_M``, is the graded outcome itself (1.0 / 0.0, no continuations);
* ``v_0`` (``mc_value_start``) comes from K continuations of the bare problem.

Per step s = 0..M-1 (the step that ends prefix i = s + 1) the row gets list columns with one entry per
step: ``mc_rollouts``, ``mc_successes``, ``mc_truncated``, ``mc_empty``, ``mc_distinct`` (counts),
``mc_value`` (soft label, null when not
estimated or all truncated), ``mc_label`` (hard label: value > 0, Math-Shepherd's hard estimation),
``mc_estimated`` (the value is known: continuations were run, or it is the graded last step),
``mc_progress`` (``v_i - v_{i-1}``, PAV's progress/advantage). Per row: ``mc_value_start``,
``mc_first_error`` (ProcessBench convention: 0-based index of the first step whose value is 0, -1 if
none) and ``mc_status``:

* ``ok``;
* ``ungraded``: the row has no graded outcome (``outcome_correct`` null, e.g. a rollout cut off by
  ``max_tokens``), so it is passed through unlabelled; rows with an ``error`` from an earlier stage
  are passed through too;
* ``no_signal``: no continuation from any prefix succeeded (all failed or were truncated), so the
  completer cannot solve the problem and the labels carry no information: ``mc_label`` and ``mc_first_error`` are null (never "step 0 is
  wrong"); counts and values are kept.

Checks on the continuations themselves (:mod:`stepkit.per_row`, shared with ``mcts-label``):

* ``mc_distinct`` counts the distinct texts among a prefix's non-empty continuations (K copies of one
  sample: 1). The manifest counts ``compared_prefixes``, ``distinct_continuations`` and
  ``repeated_continuations`` (v_0 included); a run whose distinct share (the share of continuations beyond
  each prefix's first that differ from the earlier ones, :func:`stepkit.per_row.distinct_share`) is below
  :data:`stepkit.per_row.MIN_DISTINCT_SHARE` (0.5) gets one warning with the share: its values come from
  copies of few samples (an engine that ignores per-request seeds with n > 1, temperature 0, ...).
* a run where more than half of the continuations are empty is refused with one line
  (:func:`stepkit.per_row.empty_refusal`: the chat template closes the assistant turn, or the model ends
  its turn at the prefix), checked as each chunk commits over this run's continuations up to that chunk
  (:meth:`MCLabelStage.refusal`, in commit order whatever the chunks in flight).

Modes:

* ``exhaustive``: every prefix, K * M continuations per row, a chunk's requests all sent at once on the
  engine's asynchronous path, so the runner overlaps chunks (the next chunk's requests join the engine's
  batch while this chunk's longest continuations finish; chunks are no barrier).
* ``binary``: OmegaPRM's binary search for the first error, assuming values do not recover once they
  reach 0. A row with a correct outcome has no first error under that assumption (no search); for an
  incorrect one the search over prefixes 1..M (``v_M = 0`` known) takes at most ceil(log2 M) probes, so
  a row costs at most K * (ceil(log2 M) + 1) continuations including ``v_0``. Steps that were not
  estimated have null value/progress, ``mc_estimated`` false, and a label inferred from the search
  (true before the first error, false from it on).
  A probe is decided by its first correct continuation (its value is > 0 whatever the others say), so
  the next probe is sent while the probe's other continuations finish (on an engine that finishes
  samples apart, :meth:`~stepkit.engines.base.Engine.submit_each`); every probe still counts its K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepkit.columns import Column
from stepkit.engines.base import EngineSpec, Request, SamplingConfig
from stepkit.errors import RowError
from stepkit.grading.answers import extract_final_answer
from stepkit.grading.verdicts import labels_from_first_error
from stepkit.options import Config, opt
from stepkit.per_row import (
    ContinuationTally,
    check_answers,
    check_golds,
    distinct_warning,
    empty_refusal,
    engine_error,
    first_success,
    sample_parsed,
)
from stepkit.prompts import CONTINUATION, PromptTemplate, render_continuation
from stepkit.schema import LABELER_REQUIRED
from stepkit.stage import LabelerStage

MODES = ("exhaustive", "binary")

_INT, _FLOAT, _BOOL = pa.list_(pa.int32()), pa.list_(pa.float32()), pa.list_(pa.bool_())
COLUMNS = (  # per step s: the prefix that ends with step s (i = s + 1)
    Column("mc_rollouts", _INT, "continuations run from the prefix", per_step=True),
    Column("mc_successes", _INT, "continuations whose final answer is equivalent to the reference", per_step=True),
    Column("mc_truncated", _INT, "continuations cut off by max_tokens (out of the denominator)", per_step=True),
    Column("mc_empty", _INT, "continuations that stopped at once with no text (out of the denominator)",
           per_step=True),
    Column("mc_distinct", _INT, "distinct texts among the non-empty continuations (K copies of one sample: 1)",
           per_step=True),
    Column("mc_value", _FLOAT, "successes / (rollouts - truncated - empty), the last step's the graded outcome; "
           "null: not estimated", per_step=True, role="value", scale="unit", status="mc_status"),
    Column("mc_label", _BOOL, "hard label: value > 0 (Math-Shepherd's hard estimate), or inferred by the binary "
           "search", per_step=True, role="label", status="mc_status"),
    Column("mc_estimated", _BOOL, "the value is known (continuations run, or the graded last step)", per_step=True),
    Column("mc_progress", _FLOAT, "v_i - v_(i-1), PAV's progress", per_step=True, role="value", scale="difference",
           status="mc_status"),
    Column("mc_value_start", pa.float32(), "v_0: the value of the bare problem (K continuations)"),
    Column("mc_first_error", pa.int32(), "0-based index of the first step whose value is 0, -1 if none",
           role="first_error", status="mc_status"),
    Column("mc_status", pa.string(), "ok; no_signal: no continuation succeeded (labels say nothing); ungraded: no "
           "graded outcome", role="status", values=("ok", "no_signal", "ungraded"), no_labels=("no_signal", "ungraded")),
)


@dataclass(frozen=True)
class MCLabelConfig(Config):
    """Options of ``mc-label`` (each one drives its flag, its validation and the manifest identity).

    Raises:
        ConfigError: continuations < 1 or an unknown mode.
    """

    continuations: int = opt(8, "K: continuations per step prefix.", short="-k", min=1, max=4096)
    mode: str = opt("exhaustive", "exhaustive: every prefix; binary: OmegaPRM binary search for the first error.",
                    choices=MODES)
    stop: tuple[str, ...] = opt((), "Extra stop string(s) for continuations.", identity=False)  # in sampling


@dataclass
class PrefixEstimate:
    """Counts of the K continuations of one prefix."""

    rollouts: int = 0
    successes: int = 0
    truncated: int = 0
    empty: int = 0  # stopped at once with no text: out of the denominator, like truncated ones
    distinct: int = 0  # distinct texts among the non-empty continuations

    @property
    def value(self) -> float | None:
        """``successes / (rollouts - truncated - empty)``, or None when no continuation was graded."""
        graded = self.rollouts - self.truncated - self.empty
        return self.successes / graded if graded > 0 else None


class FirstErrorSearch:
    """OmegaPRM's binary search for the first prefix whose MC value is 0.

    Prefix lengths are 1..M; ``v_M`` is the outcome. With an incorrect outcome the first zero lies in
    [1, M]; ``next_probe`` returns the prefix length to estimate next, or None when the search is done.
    A probe whose value is unknown (all continuations truncated) counts as non-zero.
    """

    def __init__(self, n_steps: int, outcome_correct: bool):
        self.lo, self.hi = 1, n_steps
        self.done = bool(outcome_correct)  # no error to search for under the no-recovery assumption

    def next_probe(self) -> int | None:
        """The prefix length to estimate next, or None when the first zero is found."""
        if self.done or self.lo >= self.hi:
            return None
        return (self.lo + self.hi) // 2

    def observe(self, i: int, value: float | None) -> None:
        """Record the estimated value of prefix length ``i`` (None: all continuations truncated)."""
        if value is not None and value == 0:
            self.hi = i
        else:
            self.lo = i + 1


def label_row(n_steps: int, outcome_correct: bool, est: dict[int, PrefixEstimate], mode: str) -> dict[str, Any]:
    """The ``mc_*`` columns of one row from its prefix estimates.

    Args:
        n_steps: M >= 1.
        outcome_correct: the graded outcome (gives ``v_M``).
        est: prefix length i (0 <= i < M) -> counts of its continuations; ``est[0]`` is ``v_0``.
        mode: ``exhaustive`` or ``binary`` (changes how unestimated steps are labelled).
    """
    values: list[float | None] = []
    estimated: list[bool] = []
    for i in range(1, n_steps + 1):
        if i == n_steps:
            values.append(1.0 if outcome_correct else 0.0)
            estimated.append(True)
        else:
            v = est[i].value if i in est else None
            values.append(v)
            estimated.append(v is not None)
    first_error = next((s for s in range(n_steps) if estimated[s] and values[s] == 0), -1)
    # Binary mode infers the unestimated labels from the search, computed once per row (linear in M).
    inferred = labels_from_first_error(first_error, n_steps) if mode == "binary" else [None] * n_steps
    labels: list[bool | None] = [values[s] > 0 if estimated[s] else inferred[s] for s in range(n_steps)]
    start = est[0].value if 0 in est else None
    prev = [start] + values[:-1]
    progress = [None if (a is None or b is None) else b - a for a, b in zip(prev, values)]
    # No continuation succeeded (all failed or were truncated): the completer gives no information.
    # In binary mode a correct outcome needs no search (its labels follow from the no-recovery
    # assumption alone), so its v_0 sample says nothing about the labels.
    used = {} if (mode == "binary" and outcome_correct) else est
    status = "no_signal" if used and sum(e.successes for e in used.values()) == 0 else "ok"
    if status == "no_signal":
        labels, first_error = [None] * n_steps, None
    return {
        "mc_rollouts": [est[i].rollouts if i in est else 0 for i in range(1, n_steps + 1)],
        "mc_successes": [est[i].successes if i in est else 0 for i in range(1, n_steps + 1)],
        "mc_truncated": [est[i].truncated if i in est else 0 for i in range(1, n_steps + 1)],
        "mc_empty": [est[i].empty if i in est else 0 for i in range(1, n_steps + 1)],
        "mc_distinct": [est[i].distinct if i in est else 0 for i in range(1, n_steps + 1)],
        "mc_value": values,
        "mc_label": labels,
        "mc_estimated": estimated,
        "mc_progress": progress,
        "mc_value_start": start,
        "mc_first_error": first_error,
        "mc_status": status,
    }


_EMPTY = {c.name: None for c in COLUMNS}


class MCLabelStage(LabelerStage):
    """The ``mc-label`` stage (see the module docstring for the method).

    Args:
        cfg: the stage's options (:class:`MCLabelConfig`).
        engine: the engine to continue prefixes with (built once, only if there is work).
        sampling: explicit sampling parameters (the CLI adds the default stop strings and ``cfg.stop``).
        checker_factory: builds the answer checker (default: :class:`stepkit.grading.verify.AnswerChecker`).
        template: the continuation prompt template.
    """

    name = "mc-label"
    required_columns = LABELER_REQUIRED
    default_chunk_size = 16
    columns = COLUMNS

    def __init__(self, cfg: MCLabelConfig, engine: EngineSpec, sampling: SamplingConfig, checker_factory=None,
                 template: PromptTemplate = CONTINUATION):
        super().__init__(cfg, engine, sampling, checker_factory)
        self.k, self.mode, self.template = cfg.continuations, cfg.mode, template

    # -- runner interface -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {**super().config(), "prompt_template": {"version": self.template.version, "hash": self.template.hash()}}

    # -- the method ---------------------------------------------------------------------------------
    asynchronous = True  # both modes submit on the engine's asynchronous path: the runner overlaps chunks

    async def aprocess(self, rows: list[dict]) -> tuple[list[dict], dict[str, int]]:
        """Label one chunk on the engine's asynchronous path: exhaustive mode sends all of its continuation
        requests at once (:meth:`_estimate_all`); binary mode runs one coroutine per row (its search and v_0
        beside it, :meth:`_search_all`), so no row's next probe waits for another row's slowest continuation.
        Either way the runner overlaps chunks, vLLM batches what is in flight and shared prefixes hit its
        cache. Returns the rows with ``mc_*`` columns and the chunk's counters (continuations, truncated,
        empty, successes, prefixes_estimated, no_signal, ungraded, and
        :class:`~stepkit.per_row.ContinuationTally`'s).

        The empty refusal is :meth:`refusal`, as each chunk commits.
        """
        out, todo, counters = self._screen(rows)
        todo, est = self._with_golds(todo, await check_golds(self.checker, [r["reference_answer"] for r in todo]))
        if self.mode == "binary":
            await self._search_all(todo, est, counters)
        else:
            await self._estimate_all([(r, i) for r in todo for i in range(len(r["steps"]))], est, counters)
        return self._labelled(out, todo, est, counters)

    def _screen(self, rows: list[dict]):
        """``(out, todo, counters)``: every row with empty ``mc_*`` columns (rows that cannot be labelled
        keep an error or the ``ungraded`` status), the rows to label (gold answers not yet checked), the
        chunk's counters."""
        counters = {"continuations": 0, "truncated": 0, "empty": 0, "successes": 0, "prefixes_estimated": 0,
                    "no_signal": 0, "ungraded": 0, **dict.fromkeys(ContinuationTally.NAMES, 0),
                    "_sampled": 0}  # (continuations that are not error completions: the empty refusal's total)
        todo = []
        out = []
        for row in rows:
            row = {**row, **_EMPTY}
            if row.get("error"):
                pass  # failed upstream: passed through unlabelled
            elif row.get("outcome_correct") is None and row.get("reference_answer"):
                row["mc_status"] = "ungraded"  # e.g. a rollout cut off by max_tokens: no outcome to anchor v_M
                counters["ungraded"] += 1
            elif err := _row_problem(row):
                row["error"] = RowError(self.name, err)
            else:
                todo.append(row)
            out.append(row)
        return out, todo, counters

    def _with_golds(self, todo: list[dict], bad: dict[str, str | None]):
        """``(todo, est)``: the rows whose gold answer is usable (``bad``: ``gold_problems`` of every row's),
        and their empty estimates; the others keep an error. A reference answer math-verify cannot use
        would fail the whole chunk at grading time, so every gold is checked before generating."""
        for r in todo:
            if bad[r["reference_answer"]]:
                r["error"] = RowError(self.name, f"unusable reference_answer: {bad[r['reference_answer']]}")
        todo = [r for r in todo if not r.get("error")]
        est: dict[int, dict[int, PrefixEstimate]] = {id(r): {} for r in todo}
        return todo, est

    def _labelled(self, out, todo, est, counters):
        """The chunk's result once its continuations are in: each row's labels."""
        for r in todo:
            if r.get("error"):
                continue
            r.update(label_row(len(r["steps"]), r["outcome_correct"], est[id(r)], self.mode))
            counters["no_signal"] += r["mc_status"] == "no_signal"
        return out, counters

    async def _search_all(self, rows: list[dict], est, counters) -> None:
        """Binary mode: every row's search (v_0 beside it) runs in its own coroutine on the engine's
        asynchronous path, so the engine batches all rows' probes as they come.

        A probe is decided by its first correct continuation (:func:`~stepkit.per_row.first_success`: the
        prefix's value is > 0 whatever the other K - 1 say), so the next probe is sent at once while the
        probe's other continuations finish; a probe with no correct one waits for all K (its value may be
        0). Every probe's K continuations are still counted, and probes are tallied in the order the search
        sent them: a probe is tallied only when the row has no error once the probe before it is tallied,
        which is when it would have been sent had each probe waited for all K (so the rows and counts are
        those of a search that waits; only when the requests go out changes)."""
        import asyncio  # (imported where used: a command's --help loads no asyncio)

        def draws(r: dict, i: int) -> list:
            """The K continuations of prefix ``i`` of row ``r``, each graded as it arrives: tasks of
            ``(completion, correct)``, correct None when it cannot be graded (error, empty, truncated)."""
            req = Request(self._prompt(r, i), self.k)

            async def graded(fut):
                c = await fut
                if c.finish_reason == "error" or c.empty or c.truncated:
                    return c, None
                ok = await check_answers(self.checker, [(r["reference_answer"], extract_final_answer(c.text))])
                return c, bool(ok[0])

            return [asyncio.ensure_future(graded(f)) for f in self.engine.agenerate_each(req, self.sampling)]

        async def tally(r: dict, i: int, got: list, before) -> None:
            if before is not None:
                await before
                if r.get("error"):  # an earlier probe failed: a search that waits would not have sent this one
                    await asyncio.gather(*got, return_exceptions=True)
                    return
            done = [await d for d in got]
            where, _ = self._tally([(r, i)], [[c for c, _ in done]], est, counters)
            self._credit(where, [ok for _, ok in done if ok is not None], counters)

        def verdict(d) -> bool | None:
            c, ok = d
            return None if c.finish_reason == "error" else bool(ok)

        async def search(r: dict) -> None:
            s = FirstErrorSearch(len(r["steps"]), r["outcome_correct"])
            last = None  # the tally of the probe sent last
            while (p := s.next_probe()) is not None and not r.get("error"):
                got = draws(r, p)
                last = asyncio.ensure_future(tally(r, p, got, last))
                if await first_success(got, verdict):
                    s.observe(p, 1.0)  # a value > 0, whatever the other continuations say
                    continue
                if any(c.finish_reason == "error" for c, _ in (d.result() for d in got)):
                    await last  # the row's error is set there, in order (the search stops)
                    continue
                graded = [ok for _, ok in (d.result() for d in got) if ok is not None]
                s.observe(p, sum(graded) / len(graded) if graded else None)  # = the tallied estimate's value
            if last is not None:
                await last

        async def start(r: dict) -> None:
            await tally(r, 0, draws(r, 0), None)

        await asyncio.gather(*(coro for r in rows for coro in (start(r), search(r))))

    def refusal(self, counters: dict[str, int]):
        """The empty refusal (:func:`~stepkit.per_row.empty_refusal`) over this run's continuations up to the
        chunk about to commit: more than half of them empty stops the run before that chunk commits."""
        return empty_refusal(self.name, counters.get("empty", 0), counters.get("_sampled", 0))

    def run_warnings(self, counters: dict[str, int]) -> list[str]:
        """The distinct-share warning of a run (:func:`~stepkit.per_row.distinct_warning`), if any."""
        w = distinct_warning(self.name, counters, self.sampling.temperature)
        return [w] if w else []

    def _prompt(self, r: dict, i: int) -> str:
        """The rendered prompt that continues row ``r`` after its first ``i`` steps."""
        return render_continuation(self.engine, r["prompt"], r["steps"], r.get("step_separator") or "\n", i,
                                   self.template)

    async def _estimate_all(self, wanted: list[tuple[dict, int]], est, counters) -> None:
        """Exhaustive mode: K continuations of each (row, prefix length), every request submitted at once
        (one request of K per prefix, :func:`~stepkit.per_row.sample_parsed` with no retry and every
        completion kept), then graded together and recorded in ``est``. Request ``k`` of the chunk has
        ``seed_index`` k (an engine with per-request seeds sends ``seed + k``, as for request k of one engine
        call), so its samples do not depend on the chunks in flight nor on a resume."""
        import asyncio  # (imported where used: a command's --help loads no asyncio)

        got = await asyncio.gather(*(sample_parsed(self.engine, self._prompt(r, i), self.sampling,
                                                    lambda c: c, self.name, want=self.k, stop_on_error=False,
                                                    seed_index=k)
                                      for k, (r, i) in enumerate(wanted)))
        where, pairs = self._tally(wanted, [g.completions for g in got], est, counters)
        self._credit(where, await check_answers(self.checker, pairs), counters)

    def _tally(self, wanted: list[tuple[dict, int]], results, est, counters):
        """Count the continuations of each (row, prefix length) into ``est`` and ``counters``; return
        ``(where, pairs)``: the estimate each gradable continuation credits and its (gold, answer) pair."""
        pairs, where = [], []
        for (r, i), comps in zip(wanted, results):
            e = est[id(r)].setdefault(i, PrefixEstimate())
            texts = []
            for c in comps:
                e.rollouts += 1
                if c.finish_reason == "error":
                    r["error"] = engine_error(self.name, c)
                    continue
                counters["_sampled"] += 1
                if c.empty:  # as rollout's "empty completion": no answer to grade, never a wrong one
                    e.empty += 1
                    counters["empty"] += 1
                    continue
                texts.append(c.text)
                if c.truncated:
                    e.truncated += 1
                    counters["truncated"] += 1
                else:
                    pairs.append((r["reference_answer"], extract_final_answer(c.text)))
                    where.append(e)
            e.distinct = ContinuationTally.add(counters, texts)
            counters["continuations"] += len(comps)
            counters["prefixes_estimated"] += 1
        return where, pairs

    @staticmethod
    def _credit(where, oks, counters) -> None:
        """Add each correct continuation (``oks``, the checks of :meth:`_tally`'s pairs) to its estimate."""
        for e, ok in zip(where, oks):
            if ok:
                e.successes += 1
                counters["successes"] += 1


def _row_problem(row: dict) -> str | None:
    """Why a row cannot be labelled (it is kept with an ``error``), or None."""
    if not row.get("reference_answer"):
        return "no reference_answer (mc-label grades continuations against it)"
    if row.get("outcome_correct") is None:
        return "outcome_correct is null (the value after the last step is the graded outcome)"
    return None
