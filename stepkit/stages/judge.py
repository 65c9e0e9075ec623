"""``judge``: an LLM grades the steps of each trajectory (LLM-as-judge step labels).

Method (Zheng et al. 2024, *ProcessBench*, critic prompt; Zhang et al. 2025, *The Lessons of Developing
Process Reward Models in Mathematical Reasoning*, which finds judge labels generalise better than MC
labels alone; majority voting over sampled judgements as in self-consistency / SPARK):

* the judge model sees the problem and the steps tagged as numbered paragraphs
  (:func:`stepkit.prompts.tag_steps`) through a versioned template from ``stepkit/prompts/``;
* mode ``first-error`` asks for the index of the earliest wrong step (-1 if none) in ``\\boxed{}``;
  mode ``per-step`` asks for a ``Paragraph k: correct|incorrect`` line per step;
  mode ``per-step-score`` asks for a ``Turn k: score S`` line per step, 0-10
  (:func:`~stepkit.grading.verdicts.parse_step_scores`): the ``judge-agent-step`` template for agent turns
  (WebSTAR / StepRM-style: above 5 only for an action that fully makes sense and has no strictly better
  alternative). A step is correct when its score is above :data:`SCORE_THRESHOLD`. Rows with
  ``step_observations`` (``ingest messages``) show each turn's observation after it;
* ``votes`` replies are sampled per row and majority-voted (:func:`stepkit.grading.verdicts.vote_first_error`,
  :func:`~stepkit.grading.verdicts.vote_steps`); ties resolve towards the earlier error and are recorded;
* a reply that states no verdict, a verdict count that differs from the step count, an index out of
  range, or a reply cut off by ``max_tokens`` is a **parse failure**: counted per row, sampled again up
  to ``retries`` times, and never read as a verdict. A row with no valid vote gets status
  ``parse_failure`` and null labels.

Columns (one entry per step for the list columns):

* ``judge_label`` (list<bool>): the voted verdicts; in first-error mode True before the first error and
  False from it on;
* ``judge_first_error`` (int32): ProcessBench convention, 0-based, -1 when no step is wrong;
* ``judge_votes`` (list<int32>): the first-error index of each valid vote;
* ``judge_correct_votes`` (list<int32>): per step, how many valid votes call it correct;
* ``judge_score`` (list<float32>): mode ``per-step-score``, per step, the mean score of the valid votes;
* ``judge_tie`` (bool), ``judge_valid_votes`` (int32), ``judge_parse_failures`` (int32, replies that
  failed to parse, retries included), ``judge_parse_error`` (the last failure's reason);
* ``judge_replies`` (list<string>): every reply in the order received (valid or not), for inspection;
* ``judge_status``: ``ok`` or ``parse_failure``; null on rows that failed upstream or in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepkit.columns import Column
from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.errors import ConfigError
from stepkit.grading.answers import find_boxes
from stepkit.grading.verdicts import (
    VerdictParseError,
    first_error_of,
    labels_from_first_error,
    parse_first_error,
    parse_step_scores,
    parse_step_verdicts,
    vote_first_error,
    vote_steps,
)
from stepkit.options import Config, opt
from stepkit.per_row import Counters, sample_parsed
from stepkit.prompts import JUDGE_MODES, PromptTemplate, judge_template, load_template, render_judge
from stepkit.schema import CONVERSATION_STEP_COLUMNS
from stepkit.stage import LabelerStage

SCORE_THRESHOLD = 5.0
"""Mode ``per-step-score``: a step is correct when its score is above this (0-10 scale)."""

COLUMNS = (
    Column("judge_label", pa.list_(pa.bool_()), "the voted verdicts (first-error mode: True before the first "
           "error, False from it on)", per_step=True, role="label", status="judge_status"),
    Column("judge_first_error", pa.int32(), "the voted first error: 0-based, -1 when no step is wrong",
           role="first_error", status="judge_status"),
    Column("judge_votes", pa.list_(pa.int32()), "the first-error index of each valid vote"),
    Column("judge_correct_votes", pa.list_(pa.int32()), "valid votes that call the step correct", per_step=True),
    Column("judge_tie", pa.bool_(), "the vote was tied (resolved towards the earlier error)"),
    Column("judge_valid_votes", pa.int32(), "replies that parsed"),
    Column("judge_parse_failures", pa.int32(), "replies that failed to parse, retries included"),
    Column("judge_parse_error", pa.string(), "the last parse failure's reason"),
    Column("judge_replies", pa.list_(pa.string()), "every reply in the order received, for inspection"),
    Column("judge_status", pa.string(), "ok, or parse_failure (no valid vote: no labels)", role="status",
           values=("ok", "parse_failure"), no_labels=("parse_failure",)),
    Column("judge_score", pa.list_(pa.float32()), "mode per-step-score: the mean 0-10 score of the valid votes "
           f"(correct above {SCORE_THRESHOLD:g})", per_step=True, role="value", scale="score", range=(0.0, 10.0),
           status="judge_status"),
)
_EMPTY = {c.name: None for c in COLUMNS}


def parse_reply(text: str, finish_reason: str, mode: str, n_steps: int,
                quotes: tuple[str, ...] = (), tags: tuple[str, ...] = ("turn",)) -> list[bool] | list[float]:
    """One judge reply -> M per-step verdicts (True = correct), or M scores in mode ``per-step-score``.

    ``quotes`` are the judged solution's own answers (:func:`solution_answers`), so a box that quotes
    them is not read as a first-error index. ``tags``: mode ``per-step-score``, the words that start a
    score line (:func:`score_tags`).

    Raises:
        VerdictParseError: the reply was cut off by ``max_tokens`` or states no usable verdict.
    """
    if finish_reason == "length":
        raise VerdictParseError("reply cut off by max_tokens before its verdict")
    if mode == "first-error":
        return labels_from_first_error(parse_first_error(text, n_steps, quotes), n_steps)
    if mode == "per-step-score":
        return parse_step_scores(text, n_steps, tags=tags)
    return parse_step_verdicts(text, n_steps)


def score_tags(template: PromptTemplate) -> tuple[str, ...]:
    """The head words of a ``per-step-score`` reply's lines: the template's step tag (``paragraph`` when it
    sets none, as the steps are then tagged), then ``turn``; a reply's lines of the first word it uses count
    (a template of its own whose steps are ``<paragraph_k>`` is answered ``Paragraph k: S``)."""
    return tuple(dict.fromkeys([template.step_tag or "paragraph", "turn"]))


def solution_answers(row: dict) -> tuple[str, ...]:
    """The answers a solution states: the contents of the boxes in its steps and its ``final_answer``."""
    text = "\n".join(row["steps"])
    boxed = [text[b[1]:b[2]] for b in find_boxes(text) if not b[3]]
    return tuple(boxed + ([row["final_answer"]] if row.get("final_answer") else []))


def vote_row(mode: str, n_steps: int, votes: list[list[bool]] | list[list[float]]) -> dict[str, Any]:
    """The voted ``judge_*`` columns of a row from its valid votes (each M booleans, or M scores in mode
    ``per-step-score``: a score above :data:`SCORE_THRESHOLD` votes correct; V >= 1)."""
    scores = None
    if mode == "per-step-score":
        scores = [sum(v[s] for v in votes) / len(votes) for s in range(n_steps)]
        votes = [[x > SCORE_THRESHOLD for x in v] for v in votes]
    firsts = [first_error_of(v) for v in votes]
    if mode == "first-error":
        first, tie = vote_first_error(firsts)
        labels = labels_from_first_error(first, n_steps)
        correct = vote_steps(votes)[1]
    else:
        labels, correct, ties = vote_steps(votes)
        first, tie = first_error_of(labels), any(ties)
    return {"judge_label": labels, "judge_first_error": first, "judge_votes": firsts,
            "judge_correct_votes": correct, "judge_tie": tie, "judge_valid_votes": len(votes),
            "judge_status": "ok", "judge_score": scores}


@dataclass(frozen=True)
class JudgeConfig(Config):
    """Options of ``judge``.

    Raises:
        ConfigError: an unknown mode, votes < 1 or retries < 0.
    """

    mode: str | None = opt(None, "first-error: index of the earliest wrong step (ProcessBench critic); "
                           "per-step: a verdict per step; per-step-score: a 0-10 score per step "
                           "[default: the --template's mode, else first-error].", choices=JUDGE_MODES)
    votes: int = opt(1, "Replies sampled per row and majority-voted (needs --temperature > 0 when > 1).",
                     short="-v", min=1, max=1024)
    retries: int = opt(2, "Extra sampling rounds for replies that fail to parse (none at temperature 0).", min=0,
                       max=100)
    template: str | None = opt(None, "Judge prompt template: a YAML file (version, mode, user, system) or a "
                               "built-in one by name (judge-agent-step: 0-10 per agent turn) "
                               "[default: stepkit/prompts/judge-<mode>.yaml].", identity=False)  # hashed below
    stop: tuple[str, ...] = opt((), "Stop string(s) for judge replies.", identity=False)  # in sampling


class JudgeStage(LabelerStage):
    """The ``judge`` stage (see the module docstring for the method).

    Args:
        cfg: the stage's options (:class:`JudgeConfig`).
        engine: the judge engine (built once, only if there is work); configured independently of the
            policy that wrote the steps.
        sampling: explicit sampling parameters (``max_tokens`` must leave room for the reasoning).
            Retries are skipped at temperature 0, where the same prompt gives the same reply.
        template: judge template; default: ``cfg.template``'s file, else the built-in one of the mode.

    Raises:
        ConfigError: a template of another mode, or an unreadable template file.
    """

    name = "judge"
    required_columns = ("id", "prompt", "steps")
    optional_columns = CONVERSATION_STEP_COLUMNS  # checked against the steps (a prompt shows the observations)
    default_chunk_size = 32
    columns = COLUMNS
    grades_answers = False

    def __init__(self, cfg: JudgeConfig, engine: EngineSpec, sampling: SamplingConfig,
                 template: PromptTemplate | None = None):
        super().__init__(cfg, engine, sampling)
        if template is None and cfg.template:
            template = load_template(cfg.template)
        mode = cfg.mode or (template.mode if template is not None else None) or "first-error"
        template = template or judge_template(mode)
        if template.mode != mode:
            raise ConfigError(f"template {template.version!r} is for mode {template.mode!r}, not {mode!r}")
        self.mode, self.votes, self.retries, self.template = mode, cfg.votes, cfg.retries, template

    # -- runner interface -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {**super().config(), "mode": self.mode,
                "prompt_template": {"version": self.template.version, "hash": self.template.hash()}}

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(),
                "prompt_template": {"version": self.template.version, "hash": self.template.hash(),
                                    "system": self.template.system, "user": self.template.user}}

    # -- the method ---------------------------------------------------------------------------------
    asynchronous = True  # one coroutine per row: the runner overlaps chunks

    async def aprocess(self, rows: list[dict]) -> tuple[list[dict], dict[str, int]]:
        """Judge one chunk: one coroutine per row on the engine's asynchronous path
        (:func:`stepkit.per_row.sample_parsed`: the row's V replies in one request, then one request per
        retry round for the replies that failed to parse; no row waits for another's retries, no chunk for
        another's). Returns the rows with ``judge_*`` columns and the chunk's counters (replies,
        parse_failures, retry_replies, parse_failure_rows, ties)."""
        counters = Counters("replies", "parse_failures", "retry_replies", "parse_failure_rows", "ties")
        out = [{**row, **_EMPTY} for row in rows]
        todo = [r for r in out if not r.get("error")]
        import asyncio  # (imported where used: a command's --help loads no asyncio)
        await asyncio.gather(*(self._judge_row(r, counters) for r in todo))
        return out, counters

    async def _judge_row(self, r: dict, counters: Counters) -> None:
        prompt = render_judge(self.engine, self.template, r["prompt"], r["steps"], r.get("step_observations"))
        quotes, tags, n_steps = solution_answers(r), score_tags(self.template), len(r["steps"])
        got = await sample_parsed(
            self.engine, prompt, self.sampling, stage=self.name, want=self.votes, retries=self.retries,
            parse=lambda c: parse_reply(c.text, c.finish_reason, self.mode, n_steps, quotes, tags),
            parse_errors=(VerdictParseError,))
        counters.add("replies", got.received)
        counters.add("retry_replies", got.retry_replies)
        counters.add("parse_failures", got.failures)
        if got.error is not None:
            r["error"] = got.error  # the runner nulls this stage's columns on the row
            return
        r.update(judge_replies=got.replies, judge_parse_failures=got.failures, judge_parse_error=got.last_failure)
        if got.parsed:
            r.update(vote_row(self.mode, n_steps, got.parsed))
            counters.add("ties", bool(r["judge_tie"]))
        else:
            r.update(judge_status="parse_failure", judge_valid_votes=0)
            counters.add("parse_failure_rows")
