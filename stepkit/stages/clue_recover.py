r"""``clue recover``: answer-backtracked clues, one row per problem (:class:`ClueRecoverStage`).

Method (ABSeeker, "Training Long-Horizon Search Agents via Answer-Backtracked Credit Assignment"): a sparse
outcome becomes dense step rewards without sampling any continuation. From a question and its verified
answer, a recovery model works *backward* to the intermediate clues any sufficient solution must establish;
``clue score`` (:mod:`stepkit.stages.clue_score`) then scores each step by them.

``clue recover``, one output row per ``problem_id`` of a problems or
trajectories shard (the first row of each problem without an upstream error, in file order):

* with a model: the template ``stepkit/prompts/clue-recover.yaml`` (hash in the manifest) shows the problem,
  ``reference_answer`` and the reference solution when the row has one (``reference_solution`` without its
  annotations, else ``reference_steps``); the reply's last block of ``CLUE k: text || value: v || uses: i, j``
  lines is the clue list (:func:`parse_clues`). A reply that does not parse, or parses to no clue, or is cut
  off by ``max_tokens``, is a parse failure: recorded, sampled again up to ``retries`` times on the engine's
  async path, and never read as an empty list;
* ``from_reference``: no model; one clue per GSM8K calculator annotation ``<<a=b>>`` of the
  ``reference_solution`` column (:func:`stepkit.grading.clues.reference_clues`), which ``ingest`` keeps; a
  LaTeX reference solution (MATH-500's ``solution``, which ``ingest processbench`` attaches to the math rows
  whose problem is in MATH-500) gives one clue per numeric result it establishes in math mode
  (:func:`stepkit.grading.solution_clues.solution_clues`: the result of each chain, boxed values);
* ``from_actions``: no model; agent conversations (``ingest messages``): a *value* clue per identifier
  argument of each state-changing gold call (``reference_actions``) and a *call* clue per such call
  (:func:`stepkit.grading.actions.action_clues`; ``clue_kinds`` says which). A task with no
  state-changing gold call has no clues (status ``ok``): any state-changing call then contradicts.

The last clue of a math problem is always the reference answer (appended when the list does not end with
it).
Columns: ``clue_texts`` (list<string>), ``clue_values`` (list<string>: the value as written, null when not
numeric), ``clue_depends`` (list<list<int32>>: earlier clue indices), ``clue_status`` (``ok``,
``parse_failure``, ``no_reference``: with ``from_reference``, no reference solution or no computation in it,
``no_answer``: the problem has no ``reference_answer``, so no clue can be worked back from it; a status,
not a row error, so it never counts against ``--max-error-rate``: ProcessBench math has 412 such rows),
``clue_parse_failures`` (int32), ``clue_parse_error`` (the last failure), ``clue_replies`` (list<string>),
``clue_kinds`` (list<string>, ``call``/``value``; null for math clues).

"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepkit.columns import Column, fields
from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.errors import ConfigError, InputError, RowError
from stepkit.grading.actions import READ_ONLY_TOOLS, action_clues
from stepkit.grading.answers import strip_calculator_annotations
from stepkit.grading.clues import Clue, number_value, reference_clues
from stepkit.grading.solution_clues import solution_clues
from stepkit.options import Config, opt
from stepkit.per_row import sample_parsed
from stepkit.prompts import PromptTemplate, clue_template, render_clue_recover
from stepkit.schema import check_values, extend_schema
from stepkit.stage import EngineStage

# The problem columns a clue row keeps (whichever the input has).
PROBLEM_COLUMNS = ("problem_id", "source", "prompt", "reference_answer", "reference_steps", "reference_solution",
                   "reference_actions")
_CLUE_LINE = re.compile(r"^[ \t*#>-]*CLUE[ \t]+(\d+)[ \t]*[:.)][ \t]*(.+?)[ \t]*$", re.IGNORECASE | re.MULTILINE)
_NONE = re.compile(r"^(?:none|n/?a|-|null|nothing|not numeric)?\.?$", re.IGNORECASE)


RECOVER_COLUMNS = (  # clue recover: one row per problem
    Column("clue_texts", pa.list_(pa.string()), "each clue as the source states it"),
    Column("clue_values", pa.list_(pa.string()), "each clue's value (a number, an expression, a call)"),
    Column("clue_depends", pa.list_(pa.list_(pa.int32())), "per clue: the clues it is computed from"),
    Column("clue_kinds", pa.list_(pa.string()), "per clue: call / value (agent clues, --from-actions); null: math"),
    Column("clue_status", pa.string(), "ok; no_reference, parse_failure, no_answer: no clues", role="status",
           values=("ok", "no_reference", "parse_failure", "no_answer"),
           no_labels=("no_reference", "parse_failure", "no_answer")),
    Column("clue_parse_failures", pa.int32(), "replies that failed to parse"),
    Column("clue_parse_error", pa.string(), "the last parse failure's reason"),
    Column("clue_replies", pa.list_(pa.string()), "every reply, for inspection"),
)
_RECOVER_EMPTY = {c.name: None for c in RECOVER_COLUMNS}


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


def from_reference(solution: str, answer: str) -> list[Clue]:
    r"""The clues of a reference solution: a GSM8K solution (``<<a=b>>`` annotations, or plain arithmetic) by
    :func:`stepkit.grading.clues.reference_clues`; a LaTeX one (MATH-500's, math mode ``$``/``\(``/``\[``
    and no annotation) by :func:`stepkit.grading.solution_clues.solution_clues`: its intermediate numeric results
    (displayed and inline chains' results, boxed values), the reference answer last."""
    if "<<" not in solution and re.search(r"\$|\\\(|\\\[|\\boxed", solution):
        return solution_clues(solution, answer)
    return reference_clues(solution, answer)


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
            return {"from_reference": True, "rule": "one clue per GSM8K <<a=b>> annotation; a LaTeX solution (MATH-500): "
                    "one per numeric result of a chain in math mode (stepkit.grading.solution_clues.solution_clues); "
                    "reference answer last"}
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

    @property
    def asynchronous(self) -> bool:
        """With a model, one coroutine per problem on the engine's asynchronous path (the runner overlaps
        chunks); the model-free modes await nothing."""
        return not (self.cfg.from_reference or self.cfg.from_actions)

    async def aprocess(self, rows):
        """One chunk -> the clue rows of the problems whose chosen row is in it, and counters
        (problems, replies, parse_failures, parse_failure_rows, clues, no_reference, no_answer)."""
        counters = {"problems": 0, "replies": 0, "parse_failures": 0, "parse_failure_rows": 0, "clues": 0,
                    "no_reference": 0, "no_answer": 0}
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
        for r in todo:  # nothing to work backward from: a status (the problem has no labels), not an error
            if not str(r.get("reference_answer") or "").strip():
                r.update(clue_status="no_answer", clue_parse_failures=0, clue_replies=[])
                counters["no_answer"] += 1
        todo = [r for r in todo if r["clue_status"] is None]
        if self.cfg.from_reference:
            for r in todo:
                # no computation to take clues from: the reference answer is still the one clue to reach
                clues = from_reference(r.get("reference_solution") or "", r["reference_answer"])
                if not clues:
                    r.update(clue_status="no_reference", clue_parse_failures=0, clue_replies=[])
                    counters["no_reference"] += 1
                    continue
                if len(clues) == 1:
                    counters["answer_only"] = counters.get("answer_only", 0) + 1
                r.update(clue_columns(clues), clue_status="ok", clue_parse_failures=0, clue_replies=[])
                counters["clues"] += len(clues)
        else:
            await self._recover_all(todo, counters)
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
            got = await sample_parsed(
                self.engine, prompt, self.sampling, stage=self.name, retries=self.cfg.retries,
                parse=lambda c: with_answer_last(parse_clues(c.text, c.finish_reason), r["reference_answer"]),
                parse_errors=(ClueParseError,))
            counters["replies"] += got.received
            counters["parse_failures"] += got.failures
            if got.error is not None:
                r["error"] = got.error
                return
            r.update(clue_replies=got.replies, clue_parse_failures=got.failures, clue_parse_error=got.last_failure)
            if got.parsed:
                r.update(clue_columns(got.parsed[0]), clue_status="ok")
                counters["clues"] += len(got.parsed[0])
            else:
                r["clue_status"] = "parse_failure"
                counters["parse_failure_rows"] += 1

        import asyncio  # (imported where used: a command's --help loads no asyncio)
        await asyncio.gather(*(recover(r) for r in rows))


def _check_pattern(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"--read-only-tools {pattern!r} is not a regular expression ({e})") from None


CLUE_STATUSES = ("ok", "parse_failure", "no_reference", "no_answer")
