r"""``clue recover`` and ``clue score``: answer-backtracked clues and clue-anchored step scores.

Method (ABSeeker, "Training Long-Horizon Search Agents via Answer-Backtracked Credit Assignment"): a sparse
outcome becomes dense step rewards without sampling any continuation. From a question and its verified
answer, a recovery model works *backward* to the intermediate clues any sufficient solution must establish;
each step is then scored by the clues it newly establishes (+) and the clues it contradicts or the false
claims it makes (-). A useful step earns credit inside a failed trajectory too. A step is any text, so the
same stage scores math solutions now and agent turns later.

``clue recover`` (:class:`ClueRecoverStage`), one output row per ``problem_id`` of a problems or
trajectories shard (the first row of each problem without an upstream error, in file order):

* with a model: the template ``stepkit/prompts/clue-recover.yaml`` (hash in the manifest) shows the problem,
  ``reference_answer`` and the reference solution when the row has one (``reference_solution`` without its
  annotations, else ``reference_steps``); the reply's last block of ``CLUE k: text || value: v || uses: i, j``
  lines is the clue list (:func:`parse_clues`). A reply that does not parse, or parses to no clue, or is cut
  off by ``max_tokens``, is a parse failure: recorded, sampled again up to ``retries`` times on the engine's
  async path, and never read as an empty list;
* ``from_reference``: no model; one clue per GSM8K calculator annotation ``<<a=b>>`` of the
  ``reference_solution`` column (:func:`stepkit.grading.clues.reference_clues`), which ``ingest`` keeps;
* ``from_actions``: no model; agent conversations (``ingest messages``): a *value* clue per identifier
  argument of each state-changing gold call (``reference_actions``) and a *call* clue per such call
  (:func:`stepkit.grading.actions.action_clues`; ``clue_kinds`` says which). A task with no
  state-changing gold call has no clues (status ``ok``): any state-changing call then contradicts.

The last clue of a math problem is always the reference answer (appended when the list does not end with
it).
Columns: ``clue_texts`` (list<string>), ``clue_values`` (list<string>: the value as written, null when not
numeric), ``clue_depends`` (list<list<int32>>: earlier clue indices), ``clue_status`` (``ok``,
``parse_failure``, ``no_reference``: with ``from_reference``, no reference solution or no computation in it),
``clue_parse_failures`` (int32), ``clue_parse_error`` (the last failure), ``clue_replies`` (list<string>),
``clue_kinds`` (list<string>, ``call``/``value``; null for math clues).

``clue score`` (:class:`ClueScoreStage`), per trajectory row, with the clue shard as a side input joined by
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
row's own status ``parse_failure`` / ``no_reference``, or ``clue_error`` when the clue row has an error).
The clue shard is checked as it is read (:func:`check_clue_rows`): a shard that is not a ``clue recover``
output, or whose clue lists disagree in length, is bad input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.columns import Column, fields
from stepkit.engines.base import EngineSpec, Request, SamplingConfig
from stepkit.errors import ConfigError, InputError, RowError
from stepkit.grading.actions import KINDS, READ_ONLY_TOOLS, action_clues, match_turns
from stepkit.grading.answers import strip_calculator_annotations
from stepkit.grading.clues import Clue, claim_holds, number_value, problem_numbers, read_step, reference_clues
from stepkit.grading.verdicts import VerdictParseError, parse_first_error
from stepkit.options import Config, opt
from stepkit.prompts import PromptTemplate, clue_template, render_clue_recover, render_clue_verify
from stepkit.schema import check_steps, check_values, extend_schema
from stepkit.stage import EngineStage, SideInput

# The problem columns a clue row keeps (whichever the input has).
PROBLEM_COLUMNS = ("problem_id", "source", "prompt", "reference_answer", "reference_steps", "reference_solution",
                   "reference_actions")
MATCH_MODES = ("numeric", "llm", "both")
_RETRY_SEED_STRIDE = 1_000_003
_CLUE_LINE = re.compile(r"^[ \t*#>-]*CLUE[ \t]+(\d+)[ \t]*[:.)][ \t]*(.+?)[ \t]*$", re.IGNORECASE | re.MULTILINE)
_NONE = re.compile(r"^(?:none|n/?a|-|null|nothing|not numeric)?\.?$", re.IGNORECASE)


RECOVER_COLUMNS = (  # clue recover: one row per problem
    Column("clue_texts", pa.list_(pa.string()), "each clue as the source states it"),
    Column("clue_values", pa.list_(pa.string()), "each clue's value (a number, an expression, a call)"),
    Column("clue_depends", pa.list_(pa.list_(pa.int32())), "per clue: the clues it is computed from"),
    Column("clue_kinds", pa.list_(pa.string()), "per clue: call / value (agent clues, --from-actions); null: math"),
    Column("clue_status", pa.string(), "ok; no_reference, parse_failure: no clues", role="status",
           values=("ok", "no_reference", "parse_failure"), no_labels=("no_reference", "parse_failure")),
    Column("clue_parse_failures", pa.int32(), "replies that failed to parse"),
    Column("clue_parse_error", pa.string(), "the last parse failure's reason"),
    Column("clue_replies", pa.list_(pa.string()), "every reply, for inspection"),
)
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
           values=("ok", "no_reference", "parse_failure", "clue_error", "no_clues"),
           no_labels=("no_reference", "parse_failure", "clue_error", "no_clues")),
)
_RECOVER_EMPTY = {c.name: None for c in RECOVER_COLUMNS}
_SCORE_EMPTY = {c.name: None for c in SCORE_COLUMNS}


class ClueParseError(ValueError):
    """A recovery reply with no usable clue list; ``str(e)`` is the short reason recorded on the row."""


def parse_clues(text: str, finish_reason: str = "stop") -> list[Clue]:
    """The clue list of a recovery reply: its last run of ``CLUE k: text || value: v || uses: i, j`` lines
    numbered 1, 2, ... (``uses`` are 1-based clue numbers in the reply, 0-based indices in the result).

    A ``value`` that is no number (``none``, a word) is None; a numeric value keeps its text without a
    ``$`` and thousands commas (``$1,200`` -> ``1200``); ``uses`` may only name earlier clues.

    Raises:
        ClueParseError: the reply was cut off by ``max_tokens``, has no clue line, its last run does not
            start at 1 or skips a number, a clue has no text, or ``uses`` names a later or unknown clue.
    """
    if finish_reason == "length":
        raise ClueParseError("reply cut off by max_tokens before its clue list")
    lines = list(_CLUE_LINE.finditer(text))
    if not lines:
        raise ClueParseError("no 'CLUE k:' line")
    run: list[re.Match] = []
    for m in lines:  # the last run numbered from 1
        if int(m.group(1)) == 1:
            run = [m]
        elif run and int(m.group(1)) == int(run[-1].group(1)) + 1:
            run.append(m)
        elif run:
            raise ClueParseError(f"clue {m.group(1)} follows clue {run[-1].group(1)}")
    if not run:
        raise ClueParseError("no clue numbered 1")
    clues = []
    for k, m in enumerate(run):
        parts = [p.strip() for p in m.group(2).split("||")]
        body, value, deps = parts[0], None, ()
        for p in parts[1:]:
            key, _, v = p.partition(":")
            key, v = key.strip().lower(), v.strip()
            if key == "value" and not _NONE.match(v):
                num = v.replace("$", "").replace(",", "").rstrip(".").strip()
                value = num if number_value(num) is not None else None
            elif key in ("uses", "depends", "depends on") and not _NONE.match(v):
                try:
                    deps = tuple(sorted({int(x) - 1 for x in re.split(r"[,\s]+(?:and\s+)?", v) if x.strip()}))
                except ValueError:
                    raise ClueParseError(f"clue {k + 1}: uses {v[:40]!r} is not a list of clue numbers") from None
                if any(not 0 <= d < k for d in deps):
                    raise ClueParseError(f"clue {k + 1}: uses a clue that is not an earlier one ({v[:40]})")
        if not body:
            raise ClueParseError(f"clue {k + 1} has no text")
        clues.append(Clue(body, value, deps))
    return clues


def with_answer_last(clues: list[Clue], answer: str) -> list[Clue]:
    """``clues`` ending with the reference answer: unchanged when the last clue's value is the answer,
    else with ``Clue("The answer is <answer>", answer)`` appended (depending on the last clue)."""
    last = clues[-1].value if clues else None
    if last is not None and number_value(last) is not None and number_value(last) == number_value(answer):
        return clues
    if last is None and clues and clues[-1].text.strip() == str(answer).strip():
        return clues
    value = answer if number_value(answer) is not None else None
    return clues + [Clue(f"The answer is {answer}", value, (len(clues) - 1,) if clues else ())]


def clue_columns(clues: list[Clue]) -> dict[str, Any]:
    """The ``clue_texts``/``clue_values``/``clue_depends`` columns of a clue list."""
    return {"clue_texts": [c.text for c in clues], "clue_values": [c.value for c in clues],
            "clue_depends": [list(c.depends_on) for c in clues]}


@dataclass(frozen=True)
class ClueRecoverConfig(Config):
    """Options of ``clue recover``.

    Raises:
        ConfigError: retries < 0.
    """

    from_reference: bool = opt(False, "No model: clues from the reference solution's GSM8K <<a=b>> annotations "
                               "(the reference_solution column).")
    from_actions: bool = opt(False, "No model: agent clues from the gold tool calls (reference_actions, from "
                             "`ingest messages`): each state-changing call and the identifiers it needs.")
    read_only_tools: str = opt(READ_ONLY_TOOLS, "--from-actions: regex of tool names that change no state.")
    retries: int = opt(2, "Extra samples for a reply that fails to parse (none at temperature 0).", min=0, max=100)
    template: str | None = opt(None, "Recovery prompt template (YAML) [default: stepkit/prompts/clue-recover.yaml].",
                               identity=False)  # hashed below


class ClueRecoverStage(EngineStage):
    """``clue recover`` (see the module docstring).

    Args:
        cfg: :class:`ClueRecoverConfig`.
        engine: the recovery model, or None with ``cfg.from_reference``.
        sampling: its sampling parameters (unused with ``from_reference``).
        template: recovery template (default: ``cfg.template``'s file, else the built-in one).

    Raises:
        ConfigError: no engine without ``from_reference``.
    """

    name = "clue-recover"
    required_columns = ("problem_id", "prompt", "reference_answer")
    optional_columns = ("id",)
    default_chunk_size = 32
    columns = RECOVER_COLUMNS
    one_to_one = False
    grades_answers = False

    def __init__(self, cfg: ClueRecoverConfig, engine: EngineSpec | None, sampling: SamplingConfig | None,
                 template: PromptTemplate | None = None):
        if cfg.from_reference and cfg.from_actions:
            raise ConfigError("--from-reference and --from-actions exclude each other (math or agent clues)")
        if engine is None and not (cfg.from_reference or cfg.from_actions):
            raise ConfigError("clue recover needs --model, or --from-reference for clues from the reference solution "
                              "(or --from-actions for agent conversations)")
        _check_pattern(cfg.read_only_tools)
        super().__init__(cfg, engine, sampling or SamplingConfig())
        from stepkit.prompts import load_template

        self.template = template or (load_template(cfg.template) if cfg.template else clue_template("recover"))
        self._chosen: dict[Any, Any] = {}

    def open(self):
        if not (self.cfg.from_reference or self.cfg.from_actions):
            super().open()

    def tokens_generated(self) -> int:
        return super().tokens_generated() if self.engine else 0

    def config(self) -> dict[str, Any]:
        if self.cfg.from_actions:
            return {"from_actions": True, "read_only_tools": self.cfg.read_only_tools,
                    "rule": "stepkit.grading.actions.action_clues: value clues (identifier arguments) before each "
                            "state-changing gold call's call clue"}
        if self.cfg.from_reference:
            return {"from_reference": True, "rule": "one clue per GSM8K <<a=b>> annotation; reference answer last"}
        return {**super().config(), "prompt_template": {"version": self.template.version, "hash": self.template.hash()}}

    def provenance(self) -> dict[str, Any]:
        if self.cfg.from_reference or self.cfg.from_actions:
            return {}
        return {**super().provenance(), "prompt_template": {"version": self.template.version,
                                                            "hash": self.template.hash(), "user": self.template.user}}

    def output_schema(self, input_schema):
        keep = [input_schema.field(c) for c in PROBLEM_COLUMNS if c in input_schema.names]
        return extend_schema(pa.schema(keep, metadata=input_schema.metadata), fields(RECOVER_COLUMNS))

    def check_schema(self, schema, path):
        if self.cfg.from_actions and "reference_actions" not in schema.names:
            raise InputError(path, "missing column: --from-actions reads the gold tool calls kept by `stepkit "
                                   "ingest messages`", column="reference_actions")
        if self.cfg.from_reference and "reference_solution" not in schema.names:
            raise InputError(path, "missing column: --from-reference reads the GSM8K annotations kept by "
                                   "`stepkit ingest gsm8k` (or gsm8k-solutions, processbench)", column="reference_solution")

    def validate(self, rows, path, first_row):
        """Choose each problem's row: the first without an upstream error (else its first row), in file
        order. Rows with neither an ``id`` column nor a unique ``problem_id`` are bad input."""
        if first_row == 0:
            self._seen, self._errored = set(), {}
        check_values(rows, path, first_row, ("problem_id", "prompt"))
        for i, r in enumerate(rows):
            key = r.get("id", first_row + i) if "id" in r else None
            pid = r["problem_id"]
            if key is None and pid in self._seen | set(self._errored):
                raise InputError(path, f"duplicate problem_id {pid!r} in a shard with no id column", row=first_row + i,
                                 column="problem_id")
            if pid in self._seen:
                continue
            if r.get("error"):
                self._errored.setdefault(pid, (path, key, first_row + i))
                continue
            self._seen.add(pid)
            self._errored.pop(pid, None)
            self._chosen[(str(path), pid)] = key if key is not None else first_row + i
        for pid, (p, key, idx) in self._errored.items():
            self._chosen.setdefault((str(p), pid), key if key is not None else idx)

    def process(self, rows):
        """One chunk -> the clue rows of the problems whose chosen row is in it, and counters
        (problems, replies, parse_failures, parse_failure_rows, clues, no_reference)."""
        counters = {"problems": 0, "replies": 0, "parse_failures": 0, "parse_failure_rows": 0, "clues": 0,
                    "no_reference": 0}
        chosen = set(self._chosen.values())
        out = []
        for r in rows:
            if r.get("id", None) not in chosen if "id" in r else False:
                continue
            row = {c: r.get(c) for c in PROBLEM_COLUMNS} | _RECOVER_EMPTY
            row["error"] = r.get("error")
            out.append(row)
        counters["problems"] = len(out)
        todo = [r for r in out if not r["error"]]
        if self.cfg.from_actions:
            for r in todo:
                self._from_actions(r, counters)
            return out, counters
        for r in todo:
            if not r.get("reference_answer"):
                r["error"] = RowError(self.name, "no reference_answer (clues are recovered backward from it)")
        todo = [r for r in todo if not r["error"]]
        if self.cfg.from_reference:
            for r in todo:
                # no computation to take clues from: the reference answer is still the one clue to reach
                clues = reference_clues(r.get("reference_solution") or "", r["reference_answer"])
                if not clues:
                    r.update(clue_status="no_reference", clue_parse_failures=0, clue_replies=[])
                    counters["no_reference"] += 1
                    continue
                if len(clues) == 1:
                    counters["answer_only"] = counters.get("answer_only", 0) + 1
                r.update(clue_columns(clues), clue_status="ok", clue_parse_failures=0, clue_replies=[])
                counters["clues"] += len(clues)
        else:
            asyncio.run(self._recover_all(todo, counters))
        for r in out:
            if r["error"]:
                r.update(_RECOVER_EMPTY)
        return out, counters

    def _from_actions(self, r, counters) -> None:
        actions = r.get("reference_actions")
        if actions is None:
            r["error"] = RowError(self.name, "no reference_actions (agent clues are backtracked from them)")
            r.update(_RECOVER_EMPTY)
            return
        try:
            clues = action_clues(actions, self.cfg.read_only_tools)
        except ValueError as e:
            r["error"] = RowError(self.name, f"reference_actions: {e}")
            r.update(_RECOVER_EMPTY)
            return
        r.update(clue_texts=[c.text for c in clues], clue_values=[c.value for c in clues],
                 clue_depends=[list(c.depends_on) for c in clues], clue_kinds=[c.kind for c in clues],
                 clue_status="ok", clue_parse_failures=0, clue_replies=[])
        counters["clues"] += len(clues)
        counters["no_actions"] = counters.get("no_actions", 0) + (not clues)

    async def _recover_all(self, rows, counters):
        async def recover(r):
            solution = r.get("reference_solution")
            solution = strip_calculator_annotations(solution) if solution else "\n".join(r.get("reference_steps") or [])
            prompt = render_clue_recover(self.engine, self.template, r["prompt"], r["reference_answer"], solution or None)
            r.update(clue_replies=[], clue_parse_failures=0)
            rounds = 1 + (self.cfg.retries if self.sampling.temperature > 0 else 0)
            for attempt in range(rounds):
                sampling = self.sampling if attempt == 0 else dataclasses.replace(
                    self.sampling, seed=self.sampling.seed + attempt * _RETRY_SEED_STRIDE)
                (c,) = await self.engine.agenerate(Request(prompt, 1), sampling)
                counters["replies"] += 1
                if c.finish_reason == "error":
                    r["error"] = RowError(self.name, f"engine: {c.error}")
                    return
                r["clue_replies"].append(c.text)
                try:
                    clues = with_answer_last(parse_clues(c.text, c.finish_reason), r["reference_answer"])
                except ClueParseError as e:
                    r["clue_parse_failures"] += 1
                    r["clue_parse_error"] = str(e)
                    counters["parse_failures"] += 1
                    continue
                r.update(clue_columns(clues), clue_status="ok")
                counters["clues"] += len(clues)
                return
            r["clue_status"] = "parse_failure"
            counters["parse_failure_rows"] += 1

        await asyncio.gather(*(recover(r) for r in rows))


# --- scoring --------------------------------------------------------------------------------------------

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


def _check_pattern(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"--read-only-tools {pattern!r} is not a regular expression ({e})") from None


CLUE_STATUSES = ("ok", "parse_failure", "no_reference")


def check_clue_rows(rows: list[dict], path: Path, first_row: int) -> None:
    """A ``clue recover`` shard's rows, as ``clue score`` joins them: a known ``clue_status``; on an
    ``ok`` row, non-empty ``clue_texts`` (strings), ``clue_values`` (a number as text, or null) and
    ``clue_depends`` (indices of earlier clues) of one length. Agent clues (``clue_kinds`` a list of
    ``call``/``value``, as long) have a non-empty string value each and may be an empty list.

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
            if v is not None and (not isinstance(v, str) or not re.search(r"\d", v)):
                raise InputError(path, f"clue {k}: {v!r:.40} is not a number written as text (or null)", row=i,
                                 column="clue_values")
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

    def process(self, rows):
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
        found = self._numeric_matches(todo, reads)
        verdicts = self._llm_verdicts(todo, counters)
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

    def _numeric_matches(self, rows, reads) -> dict[int, dict]:
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
        golds = self.checker.gold_problems(list({g for g, _ in pairs}))
        ok_pairs = [(p, w) for p, w in zip(pairs, where) if golds[p[0]] is None]
        for ((_, text), (rid, s, k)), ok in zip(ok_pairs, self.checker.check_many([p for p, _ in ok_pairs])):
            if ok and s < 0:
                found[rid]["final"] = True
            elif ok:
                found[rid]["steps"][s].setdefault(text, set()).add(k)
        return found

    def _llm_verdicts(self, rows, counters) -> dict[int, dict[int, int | None]]:
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
            rounds = 1 + (self.cfg.retries if self.sampling.temperature > 0 else 0)
            for attempt in range(rounds):
                sampling = self.sampling if attempt == 0 else dataclasses.replace(
                    self.sampling, seed=self.sampling.seed + attempt * _RETRY_SEED_STRIDE)
                (c,) = await self.engine.agenerate(Request(prompt, 1), sampling)
                if c.finish_reason == "error":
                    r["error"] = RowError(self.name, f"engine: {c.error}")
                    return
                try:
                    if c.finish_reason == "length":
                        raise VerdictParseError("reply cut off by max_tokens before its verdict")
                    result[id(r)][k] = parse_first_error(c.text, len(r["steps"]))
                    counters["verdicts"] += 1
                    return
                except VerdictParseError:
                    counters["verdict_failures"] += 1
                    r["clue_verdict_failures"] = (r.get("clue_verdict_failures") or 0) + 1

        async def run_all():
            await asyncio.gather(*(verdict(*w) for w in wanted))

        asyncio.run(run_all())
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
