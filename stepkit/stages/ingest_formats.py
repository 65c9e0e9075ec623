"""The formats of ``stepkit ingest``: one :class:`IngestFormat` subclass per format.

A format declares its ``name`` (the FORMAT argument), the :class:`~stepkit.stages.ingest.IngestOptions`
fields it accepts besides :data:`COMMON_OPTIONS` (``options``: any other one given is refused, by
:func:`stepkit.stages.ingest.option_conflicts`), the ``schema`` it writes and its row reading (``rows``).
``ingest`` finds it in :data:`stepkit.stages.ingest.FORMATS`: a new format is one subclass and one entry
there. The formats here:

* :class:`Gsm8k` (``gsm8k``): GSM8K problems (``question``, ``answer`` with ``<<a=b>>`` annotations and
  ``#### N``) -> problem shard; ``reference_answer`` from ``#### N``, ``reference_steps`` the gold solution
  lines, ``reference_solution`` the ``answer`` field as written (its annotations kept, for ``clue``).
* :class:`Gsm8kSolutions` (``gsm8k-solutions``): OpenAI's GSM8K example model solutions (one object per
  problem, one key per generator, each ``{solution, is_correct}``) -> trajectory shard with one row per
  chosen generator; steps are the solution lines, the outcome is recomputed with stepkit's checker and
  compared with the file's ``is_correct`` (kept as ``source_outcome_correct``); ``reference_solution`` is
  the annotated ``ground_truth``.
* :class:`ProcessBench` (``processbench``): ProcessBench (Zheng et al. 2024) ``gsm8k.json``/``math.json``
  -> trajectories with the human first-error label as ``reference_first_error``. ProcessBench has no gold
  answers: they are recovered by problem text from GSM8K test / MATH-500 (files found beside the
  ProcessBench folder or given with ``--answers``), else from another row of the same problem whose final
  answer is marked correct. A row matched to a GSM8K test problem gets that problem's annotated solution
  as ``reference_solution``; one matched to a MATH-500 problem its LaTeX ``solution`` (whose intermediate
  results ``clue recover --from-reference`` takes as clues).
* :class:`Jsonl` / :class:`Parquet` (``jsonl`` / ``parquet``): any rows, with column-mapping options
  (:class:`ColumnMapped`).

The ``messages`` format (tool-calling conversations) is :class:`stepkit.stages.ingest_messages.Messages`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import ClassVar

import pyarrow as pa

from stepkit.errors import InputError
from stepkit.grading.answers import extract_final_answer, strip_calculator_annotations
from stepkit.grading.steps import split_steps
from stepkit.options import flag_of
from stepkit.schema import PROBLEM_SCHEMA, REFERENCE_FIELDS, REFERENCE_SOLUTION_FIELD, TRAJECTORY_SCHEMA, extend_schema
from stepkit.stages.ingest_gold import first_error_status, gsm8k_reference, ratings_to_labels, solutions_reference
from stepkit.stages.ingest_read import (
    FormatError,
    Source,
    json_type,
    names,
    need,
    need_id,
    need_text,
    optional,
    read_jsonl,
    scalar_text,
    steps_list,
    unique,
)

TRAJ_SCHEMA_WITH_REFS = extend_schema(TRAJECTORY_SCHEMA, REFERENCE_FIELDS)
PROBLEM_SCHEMA_WITH_SOLUTION = extend_schema(PROBLEM_SCHEMA, [REFERENCE_SOLUTION_FIELD])
COMMON_OPTIONS = ("limit", "skip", "sample", "seed")
"""The options every format accepts (which records to take)."""


def _norm(text: str) -> str:
    return " ".join(str(text).split()).lower()


def _problem_key(text: str) -> str:
    """12 hex digits of the sha256 of a problem text, space and case normalised (a problem id)."""
    return hashlib.sha256(_norm(text).encode()).hexdigest()[:12]


class IngestFormat:
    """One format of ``stepkit ingest``: the options it accepts, the schema it writes, how it reads rows.

    A subclass sets ``name``, ``options`` (field names of ``IngestOptions`` it accepts besides
    :data:`COMMON_OPTIONS`), ``schema`` (a :class:`pyarrow.Schema`), optionally ``hint`` (what to add to
    ``stepkit ingest NAME FILE OUT`` when another format's file looks like this one), and implements
    :meth:`rows`, reading ``self.source`` (a :class:`~stepkit.stages.ingest_read.Source`) once.

    An instance reads one file: ``counts`` are its manifest counters and ``answer_files`` the other files
    it read (``{"path", "sha256"}``, the manifest's ``input.answers``). ``checker`` is an
    :class:`~stepkit.grading.verify.AnswerChecker` (a process pool) that :meth:`grade` uses.
    """

    name: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    schema: ClassVar[pa.Schema]
    hint: ClassVar[str] = ""

    def __init__(self, source: Source, opts, checker):
        self.source, self.path, self.opts, self.checker = source, source.path, opts, checker
        self.counts: dict[str, int] = {}
        self.answer_files: list[dict[str, str]] = []

    @classmethod
    def accepts(cls, option: str) -> bool:
        """Whether the ``IngestOptions`` field ``option`` applies to this format."""
        return option in COMMON_OPTIONS or option in cls.options

    def rows(self) -> list[dict]:
        """The rows of the file, each with ``"_row"``: the index of the source row it came from (for error
        messages; dropped before writing).

        Raises:
            InputError: bad input, naming file, row and column (a :class:`FormatError` for the layout).
        """
        raise NotImplementedError

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the manifest counter ``key``."""
        self.counts[key] = self.counts.get(key, 0) + n

    def take(self, items: list) -> list:
        """Records ``skip .. skip + limit`` of the enumerated ``items``, then, with ``sample``, a random
        sample of that many of them (seeded with ``seed``, kept in file order): ProcessBench files list
        every erroneous sample before the correct ones, so a first-N slice would hold one class only."""
        end = None if self.opts.limit is None else self.opts.skip + self.opts.limit
        items = items[self.opts.skip:end]
        if self.opts.sample is not None and self.opts.sample < len(items):
            import random

            keep = sorted(random.Random(self.opts.seed).sample(range(len(items)), self.opts.sample))
            items = [items[i] for i in keep]
        return items

    def grade(self, rows: list[dict], pairs: list[tuple[str, str | None]]) -> None:
        """Set ``outcome_correct`` of ``rows`` from their ``(reference, final answer)`` ``pairs`` (no final
        answer: incorrect) and count outcomes and agreement with ``source_outcome_correct``. A reference
        math-verify cannot use goes to :meth:`unusable_reference`."""
        bad = self.checker.gold_problems([g for g, _ in pairs])
        keep = []
        for row, (gold, pred) in zip(rows, pairs):
            if bad.get(gold) is None:
                keep.append((row, (gold, pred)))
            else:
                self.unusable_reference(row, bad[gold])
        rows, pairs = [r for r, _ in keep], [p for _, p in keep]
        for row, ok in zip(rows, self.checker.check_many(pairs)):
            row["outcome_correct"] = bool(ok) if row.get("final_answer") is not None else False
            src = row.get("source_outcome_correct")
            if src is not None:
                self.count("agree_with_source" if src == row["outcome_correct"] else "disagree_with_source")
            self.count("outcome_correct" if row["outcome_correct"] else "outcome_incorrect")

    def unusable_reference(self, row: dict, why: str) -> None:
        """A reference answer math-verify cannot use (``why``): a bundled format's row keeps no reference
        and stays ungraded."""
        row.update(reference_answer=None, outcome_correct=None)
        self.count("reference: unusable")


def _gsm8k_prompt(question: str, path: Path, row: int) -> str:
    """A GSM8K question without its ``<<a=b>>`` annotations; InputError when nothing is left."""
    prompt = strip_calculator_annotations(question).strip()
    if not prompt:
        raise InputError(path, "empty once its <<a=b>> annotations are removed", row=row, column="question")
    return prompt


class Gsm8k(IngestFormat):
    """``gsm8k``: GSM8K problems (JSON Lines ``{question, answer}``) -> a problems shard."""

    name = "gsm8k"
    schema = PROBLEM_SCHEMA_WITH_SOLUTION

    def rows(self):
        rows = []
        split = self.path.stem  # test.jsonl -> gsm8k-test-17, train.jsonl -> gsm8k-train-17
        for i, obj in self.take(self.source.jsonl()):
            q, a = need_text(obj, "question", self.path, i), need(obj, "answer", self.path, i, str)
            ref = gsm8k_reference(a, self.path, i)
            prompt = _gsm8k_prompt(q, self.path, i)
            lines = [strip_calculator_annotations(x).strip() for x in a.splitlines()]
            rows.append({"problem_id": f"gsm8k-{split}-{i}", "source": f"gsm8k/{split}/{i}", "prompt": prompt,
                         "reference_answer": ref, "_row": i,
                         "reference_steps": [x for x in lines if x and not x.startswith("####")],
                         "reference_solution": a})
        return rows


class Gsm8kSolutions(IngestFormat):
    """``gsm8k-solutions``: GSM8K example model solutions -> one trajectory per problem and generator."""

    name = "gsm8k-solutions"
    options = ("generators",)
    schema = TRAJ_SCHEMA_WITH_REFS
    generators = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")

    def rows(self):
        gens = self.opts.generators or self.generators
        rows, pairs = [], []
        for i, obj in self.take(self.source.jsonl()):
            q = need_text(obj, "question", self.path, i)
            gt = need(obj, "ground_truth", self.path, i, str)
            ref = solutions_reference(gt, self.path, i)
            prompt = _gsm8k_prompt(q, self.path, i)
            for g in gens:
                row = self._solution(obj, i, g)
                row.update(prompt=prompt, reference_answer=ref, reference_solution=gt)
                rows.append(row)
                pairs.append((ref, row["final_answer"]))
        self.grade(rows, pairs)
        return rows

    def _solution(self, obj: dict, i: int, g: str) -> dict:
        """The row of generator ``g``'s solution in record ``i`` (without its problem's columns)."""
        if g not in obj:
            have = ", ".join(k for k in obj if isinstance(obj[k], dict))
            raise InputError(self.path, f"--generator {g}: no such generator (the row has: {have})"
                             if self.opts.generators else
                             f"no solutions of generator {g} (the default takes all four; choose with "
                             f"--generator; the row has: {have})", row=i)
        if not isinstance(obj[g], dict):
            raise InputError(self.path, "expected an object with 'solution' and 'is_correct'", row=i, column=g)
        sol = need(obj[g], "solution", self.path, i, str, column=f"{g}.solution")
        if not isinstance(obj[g].get("is_correct"), (bool, type(None))):
            raise InputError(self.path, "is_correct must be true or false", row=i, column=f"{g}.is_correct")
        text = strip_calculator_annotations(sol)
        steps, sep = split_steps(text, "newline")
        final = extract_final_answer(text)
        if final is None:
            self.count("no_final_answer")
        return {"id": f"gsm8k-test-{i}:{g}", "problem_id": f"gsm8k-test-{i}", "source": f"gsm8k/test/{i}",
                "_row": i, "steps": steps, "step_separator": sep, "final_answer": final, "generator": g,
                "source_outcome_correct": obj[g].get("is_correct"),
                "error": None if steps else "ingest: solution has no steps"}


class ProcessBench(IngestFormat):
    """``processbench``: a ProcessBench JSON list -> trajectories with human first-error labels."""

    name = "processbench"
    options = ("answers",)
    schema = TRAJ_SCHEMA_WITH_REFS

    def rows(self):
        records = self.source.json_list()
        answers, solutions = self._reference_answers()
        ids: dict[str, int] = {}
        for i, obj in records:  # every record is checked, taken or not: the by-problem answers read them all
            if not isinstance(obj, dict):
                raise FormatError(self.path, f"expected an object, found {json_type(obj)}", row=i)
            unique(ids, need_id(obj, "id", self.path, i), self.path, i, "id")
            need_text(obj, "problem", self.path, i)
            steps_list(need(obj, "steps", self.path, i), self.path, i, "steps")
            need(obj, "final_answer_correct", self.path, i, bool)
            if obj.get("generator") is not None:
                need(obj, "generator", self.path, i, str)
        by_problem: dict[str, str] = {}
        for _, obj in records:  # a row of the same problem whose final answer is marked correct
            if obj["final_answer_correct"]:
                fa = extract_final_answer("\n\n".join(obj["steps"]))
                if fa is not None:
                    by_problem.setdefault(_norm(obj["problem"]), fa)
        split = self.path.stem
        rows, pairs = [], []
        for i, obj in self.take(records):
            steps = steps_list(obj["steps"], self.path, i, "steps")
            label = obj.get("label")
            valid_label = isinstance(label, int) and not isinstance(label, bool) and -1 <= label < len(steps)
            final = extract_final_answer("\n\n".join(steps))
            ref, how = answers.get(_norm(obj["problem"])), "matched problem text"
            if ref is None:
                ref, how = by_problem.get(_norm(obj["problem"])), "from a correct row of the same problem"
            self.count(f"reference: {how}" if ref is not None else "reference: none")
            rows.append({"id": str(obj["id"]), "problem_id": f"processbench-{split}-{_problem_key(obj['problem'])}",
                         "source": f"processbench/{split}/{obj['id']}", "prompt": obj["problem"], "_row": i,
                         "reference_answer": ref, "steps": steps, "step_separator": "\n\n",
                         "final_answer": final, "generator": obj.get("generator"),
                         "source_outcome_correct": obj["final_answer_correct"],
                         "reference_first_error": label if valid_label else None, "error": None,
                         "reference_solution": solutions.get(_norm(obj["problem"])),
                         "reference_status": first_error_status(obj["final_answer_correct"], label, len(steps))})
            pairs.append((ref, final))
        graded = [(r, p) for r, p in zip(rows, pairs) if r["reference_answer"] is not None]
        self.grade([r for r, _ in graded], [p for _, p in graded])
        for r in rows:
            r.setdefault("outcome_correct", None)  # no reference: ungraded (the human flag stays in source_outcome_correct)
            if r["reference_status"] != "ok":
                self.count("reference_inconsistent")
        return rows

    def _reference_answers(self) -> tuple[dict[str, str], dict[str, str]]:
        """Problem text -> gold answer, and problem text -> reference solution (``reference_solution``: a
        GSM8K row's annotated answer, a MATH-500 row's ``solution``), from GSM8K test and MATH-500 files (``--answers``, else ``../gsm8k/test.jsonl`` and
        ``../math500/test.jsonl`` beside the ProcessBench folder, when there).

        A GSM8K row (``question``, ``answer``) gives the answer after ``####`` (or a number given as the
        answer), a MATH-500 row (``problem``, ``answer``) its answer as it is.

        Raises:
            InputError: a row of an answers file with neither layout, a blank problem, or an answer that is
                not a string or number (null, a list: never the text "None" or "[1, 2]").
        """
        given = [Path(p) for p in self.opts.answers]
        files = given or [self.path.parent.parent / "gsm8k" / "test.jsonl",
                          self.path.parent.parent / "math500" / "test.jsonl"]
        out: dict[str, str] = {}
        solutions: dict[str, str] = {}
        for f in files:
            if not given and not f.is_file():
                continue
            digest = hashlib.sha256()
            for i, obj in read_jsonl(f, digest):
                key = "question" if "question" in obj else "problem"
                if key not in obj or "answer" not in obj:
                    raise InputError(f, "expected 'question' and 'answer' (GSM8K) or 'problem' and 'answer' "
                                        f"(MATH-500); the row has: {names(obj)}", row=i)
                problem = need_text(obj, key, f, i)
                value = obj["answer"]
                if isinstance(value, str) and key == "question":
                    gold = gsm8k_reference(value, f, i)
                    solutions[_norm(problem)] = value
                else:
                    if isinstance(obj.get("solution"), str) and obj["solution"].strip():  # MATH-500's solution
                        solutions[_norm(problem)] = obj["solution"]
                    gold = scalar_text(value, f, i, "answer", gold=True)
                    if gold is None:
                        raise InputError(f, "expected a string or number, found null", row=i, column="answer")
                    if not gold.strip():
                        raise InputError(f, "empty", row=i, column="answer")
                out[_norm(problem)] = gold.strip()
            self.answer_files.append({"path": str(f), "sha256": digest.hexdigest()})
        return out, solutions


class ColumnMapped(IngestFormat):
    """Any rows whose columns the ``--*-col`` options name -> trajectories (``jsonl`` and ``parquet`` read
    their records with :meth:`records`).

    Steps are a list of strings or a string split with ``--split``; the final answer is ``--answer-col``'s
    or extracted from the steps; ``--labels-col`` ratings become ``reference_labels``
    (:func:`~stepkit.stages.ingest_gold.ratings_to_labels`), ``--first-error-col`` the
    ``reference_first_error``, checked against the outcome. A column option naming a column the file lacks,
    and a reference answer math-verify cannot use, are bad input (the user's column, not a bundled file's).
    """

    columns: ClassVar[tuple[str, ...]] = ("prompt_col", "steps_col", "answer_col", "reference_col", "id_col",
                                          "problem_id_col", "labels_col", "first_error_col")
    """The options that name a column of the file: each must name one the file has."""
    options = ("split", "neutral_as", *columns)
    schema = TRAJ_SCHEMA_WITH_REFS
    hint = " with --prompt-col/--steps-col naming its columns"

    def records(self) -> tuple[list[tuple[int, dict]], list[str]]:
        """The file's ``(row index, record)`` pairs and its column names."""
        raise NotImplementedError

    def rows(self):
        o = self.opts
        items, columns = self.records()
        if not items:
            return []
        flags = {f.name: flag_of(f) for f in dataclasses.fields(o)}
        for name in self.columns:  # a misspelt column would otherwise read as "no value" in every row
            col = getattr(o, name)
            if col is not None and col not in columns:
                raise FormatError(self.path, f"{flags[name]} names no column of the file (its columns: "
                                             f"{names(dict.fromkeys(columns))})", column=col)
        rows, pairs = [], []
        ids: dict[str, int] = {}
        for i, obj in self.take(items):
            row = self._row(obj, i, ids)
            rows.append(row)
            pairs.append((row["reference_answer"], row["final_answer"]))
        graded = [(r, p) for r, p in zip(rows, pairs) if r["reference_answer"] is not None]
        self.grade([r for r, _ in graded], [p for _, p in graded])
        for (i, obj), r in zip(self.take(items), rows):
            r.setdefault("outcome_correct", None)
            if o.first_error_col:
                fe = need(obj, o.first_error_col, self.path, i, flag="--first-error-col")
                ok = isinstance(fe, int) and not isinstance(fe, bool) and -1 <= fe < len(r["steps"])
                r["reference_first_error"] = fe if ok else None
                r["reference_status"] = first_error_status(r["outcome_correct"], fe, len(r["steps"]))
                if r["reference_status"] != "ok":
                    self.count("reference_inconsistent")
        return rows

    def _row(self, obj: dict, i: int, ids: dict[str, int]) -> dict:
        """Record ``i``'s row, ungraded; its id is added to ``ids`` (id -> row), where it must not be yet."""
        o, path = self.opts, self.path
        prompt = need_text(obj, o.prompt_col, path, i, "--prompt-col")
        raw = need(obj, o.steps_col, path, i, flag="--steps-col")
        if isinstance(raw, str):
            steps, sep = split_steps(raw, o.split)
            if not steps:
                raise InputError(path, "empty steps", row=i, column=o.steps_col)
        else:
            steps = steps_list(raw, path, i, o.steps_col)
            sep = "\n\n" if any("\n" in s for s in steps) else "\n"
        ref = None
        if o.reference_col:
            ref = scalar_text(optional(obj, o.reference_col, path, i, "--reference-col"), path, i, o.reference_col,
                              gold=True)
            if ref is not None and not ref.strip():
                raise InputError(path, "empty (null means no reference)", row=i, column=o.reference_col)
        if o.answer_col:
            final = scalar_text(optional(obj, o.answer_col, path, i, "--answer-col"), path, i, o.answer_col)
            final = final if final is None or final.strip() else None  # a blank answer is no answer
        else:
            final = extract_final_answer(sep.join(steps))
        pid = (need_id(obj, o.problem_id_col, path, i, "--problem-id-col") if o.problem_id_col
               else f"{path.stem}-{_problem_key(prompt)}")
        rid = need_id(obj, o.id_col, path, i, "--id-col") if o.id_col else f"{path.stem}-{i}"
        unique(ids, rid, path, i, o.id_col)
        row = {"id": rid, "problem_id": pid, "_row": i, "source": f"{path.name}/{i}", "prompt": prompt,
               "reference_answer": ref, "steps": steps, "step_separator": sep,
               "final_answer": final, "generator": self._generator(obj, i), "error": None}
        if o.labels_col:
            ratings = need(obj, o.labels_col, path, i, list, "--labels-col")
            try:
                row["reference_labels"] = ratings_to_labels(ratings, o.neutral_as)
            except ValueError as e:
                raise InputError(path, str(e), row=i, column=o.labels_col) from None
            if len(row["reference_labels"]) != len(steps):
                raise InputError(path, f"{len(row['reference_labels'])} labels for {len(steps)} steps",
                                 row=i, column=o.labels_col)
        return row

    def _generator(self, obj: dict, row: int) -> str:
        """The row's ``generator`` text ("unknown" when absent, null or blank), never the repr of an object."""
        value = obj.get("generator")
        if value is None or (isinstance(value, str) and not value.strip()):
            return "unknown"
        return need(obj, "generator", self.path, row, str)

    def unusable_reference(self, row: dict, why: str) -> None:
        raise InputError(self.path, f"unusable reference answer: {why}", row=row["_row"], column=self.opts.reference_col)


class Jsonl(ColumnMapped):
    """``jsonl``: JSON Lines records; the columns are the keys of any record."""

    name = "jsonl"

    def records(self):
        items = self.source.jsonl()
        return items, list(dict.fromkeys(str(k) for _, obj in items for k in obj))


class Parquet(ColumnMapped):
    """``parquet``: the rows of a Parquet file; the columns are its schema's."""

    name = "parquet"

    def records(self):
        return self.source.parquet()
