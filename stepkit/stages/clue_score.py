r"""``clue score``: clue-anchored step scores per trajectory row (:class:`ClueScoreStage`).

Each step is scored by the clues (from ``clue recover``, :mod:`stepkit.stages.clue_recover`) it newly
establishes (+) and the clues it contradicts or the false claims it makes (-). A useful step earns credit
inside a failed trajectory too. A step is any text, so the same stage scores math solutions and agent turns.

``clue score``, per trajectory row, with the clue shard as a side input joined by
``problem_id``. A numeric clue is *established* by a step that states or computes its value, compared
with the answer checker (math-verify: ``$1,200`` = ``1200.00``, ``3/4`` = ``0.75``); values more than 1%
apart are never sent to it. With ``--match llm`` every clue, with ``both`` the non-numeric ones, is
checked by an LLM verdict (template ``clue-verify.yaml``; the last ``\boxed{k}``, read with the judge's
rules, :func:`stepkit.grading.verdicts.parse_first_error`: the index of the first step that establishes
it, -1 none; a reply with no usable verdict is a failure, retried, never a verdict).

The first-error rule (``clue_first_error``, 0-based, -1 none), exactly:

1. a step makes a *false claim* when one of its arithmetic claims ``a op b = c`` is false
   (:func:`stepkit.grading.clues.claim_holds`);
2. a step *deviates* when it states or computes a number that is no clue value (established by the
   checker), no number of the problem (:func:`~stepkit.grading.clues.problem_numbers`) and no number a
   step before it stated;
3. the trajectory *reaches the answer* when its ``final_answer`` is equivalent to the last clue (the
   answer), or its last step establishes that clue;
4. ``clue_first_error`` is the first step with a false claim; or, when the trajectory does not reach the
   answer, the first deviating step if it comes earlier (none deviating: the last step, which
   contradicts the answer clue); else -1. A deviation in a trajectory that reaches the answer is an
   alternative route, not an error. This rule was fixed on one seeded half of ProcessBench gsm8k
   (``bench/clue_processbench.py``).

Agent turns (clue rows with ``clue_kinds``; the trajectory rows need ``step_messages`` from ``ingest
messages``, and a conversation row joined to math clues is a row error, never scored by numbers) follow :func:`stepkit.grading.actions.match_turns` instead: a turn earns the value clues its
observation first holds and the gold calls it makes; a state-changing call that is no gold call
contradicts; a conversation that misses a gold call contradicts at its last turn. ``clue_coverage`` counts
the clues not already given by the prompt.

A step *contradicts* a clue when it is the first deviating step of a trajectory that does not reach the
answer (its number stands where the next clue not yet established should be) or it is the last step of
such a trajectory (its answer contradicts the answer clue).

Columns: ``clue_hits`` (list<list<int32>>, per step: the clues it newly establishes), ``clue_false_claims``
(list<int32>, per step), ``clue_score`` (list<float32>, per step: ``1 + hit_weight * new clues -
contradiction_weight * contradicted clues - false_claim_weight * false claims``, clipped to [0, 2]),
``clue_label`` (list<bool>, per step: no contradiction and no false claim), ``clue_coverage`` (float32:
share of the checked clues the row establishes), ``clue_first_error`` (int32), ``clue_verdicts``
(list<int32>, per clue: the step that establishes it, -1 none, null when unchecked or its verdict failed),
``clue_verdict_failures`` (int32), ``clue_status`` (``ok``; else why the problem has no clues: the clue
row's own status ``parse_failure`` / ``no_reference`` / ``no_answer``, or ``clue_error`` when the clue row has an error).
The clue shard is checked as it is read (:func:`check_clue_rows`): a shard that is not a ``clue recover``
output, or whose clue lists disagree in length, is bad input.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.columns import Column, fields
from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.errors import ConfigError, InputError, RowError
from stepkit.grading.actions import KINDS, READ_ONLY_TOOLS, match_turns
from stepkit.grading.clues import claim_holds, number_value, problem_numbers, read_step
from stepkit.grading.verdicts import VerdictParseError, parse_first_error
from stepkit.options import Config, opt
from stepkit.per_row import check_answers, check_golds, sample_parsed
from stepkit.prompts import PromptTemplate, clue_template, render_clue_verify
from stepkit.schema import check_steps, check_values, extend_schema
from stepkit.stage import EngineStage, SideInput
from stepkit.stages.clue_recover import CLUE_STATUSES, _check_pattern

MATCH_MODES = ("numeric", "llm", "both")

SCORE_COLUMNS = (  # clue score: per trajectory row
    Column("clue_hits", pa.list_(pa.list_(pa.int32())), "per step: the clues it newly establishes", per_step=True),
    Column("clue_false_claims", pa.list_(pa.int32()), "per step: claims it makes that do not hold", per_step=True),
    Column("clue_score", pa.list_(pa.float32()), "per step: 1 + weighted new clues - contradictions - false "
           "claims, clipped to 0-2 (1.0 neutral)", per_step=True, role="value", scale="score", range=(0.0, 2.0), status="clue_status"),
    Column("clue_label", pa.list_(pa.bool_()), "per step: no contradiction and no false claim", per_step=True,
           role="label", status="clue_status"),
    Column("clue_coverage", pa.float32(), "share of the checked clues the row establishes"),
    Column("clue_first_error", pa.int32(), "the first step that contradicts or makes a false claim, -1 if none", role="first_error", status="clue_status"),
    Column("clue_verdicts", pa.list_(pa.int32()), "per clue: the step that establishes it, -1 none, null "
           "unchecked"),
    Column("clue_verdict_failures", pa.int32(), "verifier replies that failed to parse"),
    Column("clue_status", pa.string(), "ok; otherwise why the row has no clue labels", role="status",
           values=("ok", "no_reference", "parse_failure", "no_answer", "clue_error", "no_clues"),
           no_labels=("no_reference", "parse_failure", "no_answer", "clue_error", "no_clues")),
)
_SCORE_EMPTY = {c.name: None for c in SCORE_COLUMNS}


@dataclass(frozen=True)
class ClueScoreConfig(Config):
    """Options of ``clue score``. The score weights are stepkit's defaults on ABSeeker's shape (neutral 1.0,
    clipped to [0, 2]): one new clue lifts a step by half the range to the top, one contradicted clue or
    false claim drops a neutral step to 0.

    Raises:
        ConfigError: an unknown match mode, a negative weight, retries < 0.
    """

    clues: str = opt(None, "The clue shard (from `clue recover`), joined by problem_id.", identity=False)  # hashed
    match: str = opt("numeric", "numeric: numeric clues by value (answer checker); llm: every clue by an LLM "
                     "verdict; both: numeric clues by value, the others by the LLM.", choices=MATCH_MODES)
    hit_weight: float = opt(0.5, "Added per clue a step newly establishes.", min=0)
    contradiction_weight: float = opt(1.0, "Subtracted per clue a step contradicts.", min=0)
    false_claim_weight: float = opt(1.0, "Subtracted per false arithmetic claim (a op b = c) of a step.", min=0)
    retries: int = opt(2, "LLM verdicts: extra samples for a reply that fails to parse.", min=0, max=100)
    template: str | None = opt(None, "LLM verdict template (YAML) [default: stepkit/prompts/clue-verify.yaml].",
                               identity=False)
    read_only_tools: str = opt(READ_ONLY_TOOLS, "Agent clues: regex of tool names that change no state (their "
                               "calls never contradict).")

    def __post_init__(self):
        super().__post_init__()
        _check_pattern(self.read_only_tools)


def check_clue_rows(rows: list[dict], path: Path, first_row: int) -> None:
    r"""A ``clue recover`` shard's rows, as ``clue score`` joins them: a known ``clue_status``; on an
    ``ok`` row, non-empty ``clue_texts`` (strings), ``clue_values`` (a number as text, or null) and
    ``clue_depends`` (indices of earlier clues) of one length; the last clue of a math list is the
    reference answer, whose value is the answer as written, digits or not (``\pi``, ``\text{(E)}``, ``A``:
    the answer checker compares it, as ``clue recover --from-reference`` writes it). Agent clues
    (``clue_kinds`` a list of ``call``/``value``, as long) have a non-empty string value each and may be an empty list.

    Raises:
        InputError: the first bad cell, naming file, row and column.
    """
    for i, r in enumerate(rows, start=first_row):
        if r.get("error"):
            continue
        status = r.get("clue_status")
        if status not in CLUE_STATUSES:
            raise InputError(path, f"{status!r} is not a clue status ({', '.join(CLUE_STATUSES)}): is this a "
                                   "clue recover shard?", row=i, column="clue_status")
        if status != "ok":
            continue
        texts, values, deps = r.get("clue_texts"), r.get("clue_values"), r.get("clue_depends")
        kinds = r.get("clue_kinds")
        if not isinstance(texts, list) or (not texts and kinds is None) or any(
                not isinstance(t, str) or not t.strip() for t in texts):
            raise InputError(path, "an ok row needs a non-empty list of clue texts", row=i, column="clue_texts")
        for col, v in (("clue_values", values), ("clue_depends", deps)) + ((("clue_kinds", kinds),) if kinds
                                                                          is not None else ()):
            if not isinstance(v, list) or len(v) != len(texts):
                raise InputError(path, f"{'no list' if not isinstance(v, list) else f'{len(v)} entries'} for "
                                       f"{len(texts)} clue texts", row=i, column=col)
        for k, kind in enumerate(kinds or []):
            if kind not in KINDS:
                raise InputError(path, f"clue {k}: kind {kind!r} is not one of {', '.join(KINDS)}", row=i,
                                 column="clue_kinds")
            if not isinstance(values[k], str) or not values[k]:
                raise InputError(path, f"clue {k}: an agent clue needs its value (the call or identifier)", row=i,
                                 column="clue_values")
        for k, v in enumerate(values):
            if kinds is not None:
                break
            answer = k == len(values) - 1  # the reference answer as written: the answer checker reads it
            if v is not None and (not isinstance(v, str) or not (v.strip() if answer else re.search(r"\d", v))):
                what = "the answer as text" if answer else "a number written as text"
                raise InputError(path, f"clue {k}: {v!r:.40} is not {what} (or null)", row=i, column="clue_values")
        for k, d in enumerate(deps):
            if any(not isinstance(j, int) or not 0 <= j < k for j in d or []):
                raise InputError(path, f"clue {k} depends on {d}: only earlier clues (0..{k - 1})", row=i,
                                 column="clue_depends")


def score_row(n_steps: int, hits: list[list[int]], false_claims: list[int], contradicted: list[int],
              n_checked: int, cfg: ClueScoreConfig) -> dict[str, Any]:
    """The per-row ``clue_*`` score columns from per-step hits (newly established clue indices), false
    claim counts and contradicted clue counts (each M entries) and the number of clues checked."""
    scores = [min(2.0, max(0.0, 1.0 + cfg.hit_weight * len(h) - cfg.contradiction_weight * c
                            - cfg.false_claim_weight * f)) for h, c, f in zip(hits, contradicted, false_claims)]
    labels = [not (c or f) for c, f in zip(contradicted, false_claims)]
    first = next((s for s in range(n_steps) if not labels[s]), -1)
    established = sum(len(h) for h in hits)
    return {"clue_hits": hits, "clue_false_claims": false_claims, "clue_score": scores, "clue_label": labels,
            "clue_first_error": first, "clue_coverage": established / n_checked if n_checked else None}


class ClueScoreStage(EngineStage):
    """``clue score`` (see the module docstring for the rule).

    Args:
        cfg: :class:`ClueScoreConfig` (``cfg.clues`` is the side input).
        engine: the verdict model for ``match`` llm/both, else None.
        sampling: its sampling parameters.
        checker_factory: builds the answer checker (tests pass one already running).
        template: verdict template (default: ``cfg.template``'s file, else the built-in one).

    Raises:
        ConfigError: no clue shard; ``match`` llm/both without an engine.
    """

    name = "clue-score"
    required_columns = ("id", "problem_id", "prompt", "steps")
    optional_columns = ("final_answer", "step_messages", "step_observations")
    default_chunk_size = 64
    columns = SCORE_COLUMNS
    grades_answers = True

    def __init__(self, cfg: ClueScoreConfig, engine: EngineSpec | None, sampling: SamplingConfig | None,
                 checker_factory=None, template: PromptTemplate | None = None):
        if not cfg.clues:
            raise ConfigError("clue score needs --clues CLUES (the output of `stepkit clue recover`)")
        if engine is None and cfg.match != "numeric":
            raise ConfigError(f"--match {cfg.match} needs --model (the verdict model)")
        super().__init__(cfg, engine, sampling or SamplingConfig(), checker_factory)
        from stepkit.prompts import load_template

        self.template = template or (load_template(cfg.template) if cfg.template else clue_template("verify"))

    def config(self) -> dict[str, Any]:
        from stepkit.grading.verify import checker_settings

        doc = {**(super().config() if self.engine_spec else {"grader": checker_settings(),
                                                             **dataclasses.asdict(self.cfg)})}
        doc.pop("clues", None)
        doc.pop("template", None)
        if self.cfg.match != "numeric":
            doc["prompt_template"] = {"version": self.template.version, "hash": self.template.hash()}
        return doc

    def open(self):
        if self.engine_spec is not None:
            super().open()
        else:
            from stepkit.grading.verify import AnswerChecker

            self.checker = (self.checker_factory or AnswerChecker)()

    def provenance(self):
        return super().provenance() if self.engine_spec else {}

    def side_inputs(self):
        return {"clues": SideInput(Path(self.cfg.clues), key="problem_id",
                                   columns=("clue_texts", "clue_values", "clue_depends", "clue_status", "error"),
                                   optional=("clue_kinds",), check=check_clue_rows)}

    def output_schema(self, input_schema):
        return extend_schema(input_schema, fields(SCORE_COLUMNS))

    def validate(self, rows, path, first_row):
        if first_row == 0:
            self._seen_ids = set()
        check_values(rows, path, first_row, ("id", "prompt"), unique="id", seen=self._seen_ids)
        check_steps(rows, path, first_row)

    @property
    def asynchronous(self) -> bool:
        """With LLM verdicts, one coroutine per (row, clue) on the engine's asynchronous path (the runner
        overlaps chunks); ``--match numeric`` awaits nothing."""
        return self.cfg.match != "numeric"

    async def aprocess(self, rows):
        """Score one chunk: the numeric matches of every row go to the answer checker in one call, the LLM
        verdicts run one coroutine per (row, clue). Counters: rows_scored, no_clues, clue_hits,
        false_claims, verdicts, verdict_failures, first_errors."""
        counters = {"rows_scored": 0, "no_clues": 0, "clue_hits": 0, "false_claims": 0, "verdicts": 0,
                    "verdict_failures": 0, "first_errors": 0}
        out = [{**r, **_SCORE_EMPTY} for r in rows]
        todo = []
        for r in out:
            if r.get("error"):
                continue
            side = r.get("_clues") or {}
            if side.get("error") or side.get("clue_status") != "ok":  # the clue row says why there are none
                r["clue_status"] = "clue_error" if side.get("error") else side.get("clue_status") or "no_clues"
                counters["no_clues"] += 1
                continue
            todo.append(r)
        agents = [r for r in todo if r["_clues"].get("clue_kinds") is not None]
        for r in agents:
            self._score_turns(r, counters)
        todo = [r for r in todo if r["_clues"].get("clue_kinds") is None]
        for r in todo:
            if r.get("step_messages") is not None:  # numbers in tool results would "establish" math clues
                r["error"] = RowError(self.name, "math clues (no clue_kinds) cannot score a conversation's turns "
                                                 "(step_messages): recover its clues with `clue recover --from-actions`")
        todo = [r for r in todo if not r.get("error")]
        reads = {id(r): [read_step(s) for s in r["steps"]] for r in todo}
        import asyncio  # (imported where used: a command's --help loads no asyncio)

        # the checker's numeric matches (from a worker thread) beside the LLM verdicts' requests
        found, verdicts = await asyncio.gather(self._numeric_matches(todo, reads), self._llm_verdicts(todo, counters))
        for r in todo:
            if r.get("error"):
                r.update(_SCORE_EMPTY)
                continue
            r.update(self._score(r, reads[id(r)], found[id(r)], verdicts.get(id(r), {})))
            counters["rows_scored"] += 1
            counters["clue_hits"] += sum(len(h) for h in r["clue_hits"])
            counters["false_claims"] += sum(r["clue_false_claims"])
            counters["first_errors"] += r["clue_first_error"] >= 0
        return out, counters

    def _score_turns(self, r, counters) -> None:
        """Agent clues on a conversation's turns (:func:`stepkit.grading.actions.match_turns`)."""
        side = r["_clues"]
        if not isinstance(r.get("step_messages"), list) or len(r["step_messages"]) != len(r["steps"]):
            r["error"] = RowError(self.name, "agent clues (clue_kinds) need the row's step_messages, one per step: "
                                             "score conversations from `stepkit ingest messages`")
            return
        try:
            m = match_turns(side["clue_kinds"], side["clue_values"], r["prompt"], r["step_messages"],
                            r.get("step_observations") or [""] * len(r["steps"]), self.cfg.read_only_tools)
        except ValueError as e:
            r["error"] = RowError(self.name, f"step_messages: {e}")
            return
        n = len(r["steps"])
        checked = [c for c, f in enumerate(m.first) if f is not None]
        r.update(score_row(n, m.hits, [0] * n, m.contradicted, len(checked), self.cfg))
        r.update(clue_verdicts=m.first, clue_status="ok", clue_verdict_failures=0)
        counters["rows_scored"] += 1
        counters["clue_hits"] += sum(len(h) for h in m.hits)
        counters["first_errors"] += r["clue_first_error"] >= 0

    def _numeric(self, r) -> list[int]:
        values = r["_clues"]["clue_values"]
        if self.cfg.match == "llm":
            return []
        return [k for k, v in enumerate(values) if v is not None]

    async def _numeric_matches(self, rows, reads) -> dict[int, dict]:
        """Per row: ``{"steps": [{number text: clue indices it equals} per step], "final": bool}`` (the
        row's final_answer is the answer clue), from one batched answer-checker call. A pair whose values
        are more than 1% apart is never sent to the checker."""
        pairs, where = [], []
        for r in rows:
            values = r["_clues"]["clue_values"]
            numeric = self._numeric(r)
            for s, sn in enumerate(reads[id(r)]):
                for text in dict.fromkeys(sn.stated + sn.computed + sn.fractions):
                    for k in numeric:
                        if _close(values[k], text):
                            pairs.append((values[k], text))
                            where.append((id(r), s, k))
            last = len(values) - 1
            if r.get("final_answer") and values[last] is not None and last in numeric:
                pairs.append((values[last], r["final_answer"]))
                where.append((id(r), -1, last))
        found = {id(r): {"steps": [{} for _ in r["steps"]], "final": False} for r in rows}
        golds = await check_golds(self.checker, list({g for g, _ in pairs}))
        ok_pairs = [(p, w) for p, w in zip(pairs, where) if golds[p[0]] is None]
        oks = await check_answers(self.checker, [p for p, _ in ok_pairs])
        for ((_, text), (rid, s, k)), ok in zip(ok_pairs, oks):
            if ok and s < 0:
                found[rid]["final"] = True
            elif ok:
                found[rid]["steps"][s].setdefault(text, set()).add(k)
        return found

    async def _llm_verdicts(self, rows, counters) -> dict[int, dict[int, int | None]]:
        """Per row, per LLM-checked clue: the first step that establishes it (-1 none, None: no verdict)."""
        if self.cfg.match == "numeric" or not rows:
            return {}
        wanted = []
        for r in rows:
            values = r["_clues"]["clue_values"]
            for k, text in enumerate(r["_clues"]["clue_texts"]):
                if self.cfg.match == "llm" or values[k] is None:
                    wanted.append((r, k, text))
        result: dict[int, dict[int, int | None]] = {id(r): {} for r in rows}

        async def verdict(r, k, text):
            prompt = render_clue_verify(self.engine, self.template, r["prompt"], r["steps"], text)
            result[id(r)][k] = None

            def parse(c):
                if c.finish_reason == "length":
                    raise VerdictParseError("reply cut off by max_tokens before its verdict")
                return parse_first_error(c.text, len(r["steps"]))

            got = await sample_parsed(self.engine, prompt, self.sampling, parse, stage=self.name,
                                      retries=self.cfg.retries, parse_errors=(VerdictParseError,))
            counters["verdict_failures"] += got.failures
            if got.failures:
                r["clue_verdict_failures"] = (r.get("clue_verdict_failures") or 0) + got.failures
            if got.error is not None:
                r["error"] = got.error
            elif got.parsed:
                result[id(r)][k] = got.parsed[0]
                counters["verdicts"] += 1

        import asyncio  # (imported where used: a command's --help loads no asyncio)
        await asyncio.gather(*(verdict(*w) for w in wanted))
        return result

    def _score(self, r, reads, found, llm: dict[int, int | None]) -> dict[str, Any]:
        values = r["_clues"]["clue_values"]
        n_clues, n = len(values), len(r["steps"])
        answer = n_clues - 1
        step_hits = [set().union(*found["steps"][s].values()) for s in range(n)]
        first_at: dict[int, int] = {}
        for s in range(n):
            for k in sorted(step_hits[s]):
                first_at.setdefault(k, s)
        for k, v in llm.items():  # an LLM verdict: the first step that establishes clue k
            if v is not None and v >= 0:
                first_at[k] = min(first_at.get(k, v), v)
        numeric = set(self._numeric(r))
        checked = numeric | {k for k, v in llm.items() if v is not None}
        hits = [sorted(k for k, s0 in first_at.items() if s0 == s) for s in range(n)]
        false_claims = [sum(not claim_holds(c) for c in sn.claims) for sn in reads]
        reached = found["final"] or answer in step_hits[n - 1] or (
            answer not in numeric and llm.get(answer) is not None and llm[answer] >= 0)
        contradicted = [0] * n
        if not reached:
            known = problem_numbers(r["prompt"])
            deviating = None
            for s, sn in enumerate(reads):
                texts = sn.stated + sn.computed
                novel = [number_value(x) for x in texts if not found["steps"][s].get(x)]
                if deviating is None and any(v is not None and v not in known for v in novel):
                    deviating = s
                known |= {number_value(x) for x in texts} - {None}
            if deviating is not None and deviating < n - 1:
                contradicted[deviating] += 1
            contradicted[n - 1] += 1
        row = score_row(n, hits, false_claims, contradicted, len(checked), self.cfg)
        verdicts = [None] * n_clues
        for k in checked:
            verdicts[k] = first_at.get(k, -1)
        row.update(clue_verdicts=verdicts, clue_status="ok",
                   clue_verdict_failures=r.get("clue_verdict_failures") or 0)
        return row


def _close(gold: str | None, text: str) -> bool:
    """Whether a step number may be the clue value: both parse as numbers within 1% (then the answer
    checker decides), or either does not parse as a plain number (the checker decides)."""
    if gold is None:
        return False
    a, b = number_value(gold), number_value(text)
    if a is None or b is None:
        return True
    return abs(a - b) <= abs(a) / 100 + Fraction(1, 10 ** 9)
