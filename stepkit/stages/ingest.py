"""``ingest``: turn source files into problem or trajectory shards with the explicit schemas.

Formats:

* ``gsm8k``: GSM8K problems (``question``, ``answer`` with ``<<a=b>>`` annotations and ``#### N``) ->
  problem shard; ``reference_answer`` from ``#### N``, ``reference_steps`` the gold solution lines,
  ``reference_solution`` the ``answer`` field as written (its ``<<a=b>>`` annotations kept, for ``clue``).
* ``gsm8k-solutions``: OpenAI's GSM8K example model solutions (one object per problem, one key per
  generator, each ``{solution, is_correct}``) -> trajectory shard with one row per chosen generator;
  steps are the solution lines, the outcome is recomputed with stepkit's checker and compared with the
  file's ``is_correct`` (kept as ``source_outcome_correct``); ``reference_solution`` is the annotated
  ``ground_truth``.
* ``processbench``: ProcessBench (Zheng et al. 2024) ``gsm8k.json``/``math.json`` -> trajectories with the
  human first-error label as ``reference_first_error``. ProcessBench has no gold answers: they are
  recovered by problem text from GSM8K test / MATH-500 (files found beside the ProcessBench folder or
  given with ``--answers``), else from another row of the same problem whose final answer is marked
  correct. A row matched to a GSM8K test problem gets that problem's annotated solution as
  ``reference_solution``.
* ``jsonl`` / ``parquet``: any rows, with column-mapping options.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepkit import __version__
from stepkit.errors import InputError
from stepkit.grading.answers import extract_final_answer, extract_gsm8k_reference, strip_calculator_annotations
from stepkit.grading.steps import check_split, split_steps
from stepkit.grading.values import answer_text, json_integer
from stepkit.options import Config, opt
from stepkit.schema import PROBLEM_SCHEMA, REFERENCE_FIELDS, REFERENCE_SOLUTION_FIELD, TRAJECTORY_SCHEMA, extend_schema
from stepkit.shards import file_sha256, write_shard

FORMATS = ("gsm8k", "gsm8k-solutions", "processbench", "jsonl", "parquet")
GSM8K_GENERATORS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
TRAJ_SCHEMA_WITH_REFS = extend_schema(TRAJECTORY_SCHEMA, REFERENCE_FIELDS)
PROBLEM_SCHEMA_WITH_SOLUTION = extend_schema(PROBLEM_SCHEMA, [REFERENCE_SOLUTION_FIELD])


@dataclass(frozen=True)
class IngestOptions(Config):
    """Options of ``stepkit ingest`` (column names refer to the source file for jsonl/parquet).

    Raises:
        ConfigError: a value out of range, an unknown split mode or a missing ``--answers`` file.
    """

    limit: int | None = opt(None, "Take at most N records.", min=1)
    skip: int = opt(0, "Skip the first N records (to cut a file into shards).", min=0)
    sample: int | None = opt(None, "Take a random sample of N records (seeded by --seed, file order kept), "
                             "after --skip/--limit.", min=1)
    seed: int = opt(0, "Seed of --sample.")
    generators: tuple[str, ...] = opt((), "gsm8k-solutions: generator(s) to take (default: all four).",
                                      flag="--generator")
    split: str = opt("auto", "jsonl/parquet string steps: newline, blank, step (Step k:), auto, or a separator regex.")
    id_col: str | None = opt(None, "jsonl/parquet: row id column (default: <file>-<index>).")
    prompt_col: str = opt("prompt", "jsonl/parquet: the problem column.")
    steps_col: str = opt("steps", "A list of steps, or a string to split.")
    answer_col: str | None = opt(None, "The solution's final answer (default: extracted from the steps).")
    reference_col: str | None = opt(None, "Gold answer column (needed to grade outcomes).")
    problem_id_col: str | None = opt(None, "jsonl/parquet: problem id column (default: the row id).")
    labels_col: str | None = opt(None, "Per-step human labels or ratings (-1/0/1, bool, +/-).")
    neutral_as: str = opt("positive", "How a neutral 0 rating maps (PRM800K paper: positive; TRL's converter: "
                          "negative).", choices=("positive", "negative"))
    first_error_col: str | None = opt(None, "Human first-error index column (-1 = no error).")
    answers: tuple[str, ...] = opt((), "processbench: GSM8K/MATH-500 jsonl files to recover gold answers from.",
                                   file=True)

    def __post_init__(self):
        super().__post_init__()
        check_split(self.split)


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_index, object)``; a bad line raises InputError naming the file and row."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from None
    with f:
        lines = iter(f)
        i = -1
        while True:
            try:
                line = next(lines)
            except StopIteration:
                break
            except UnicodeDecodeError as e:
                raise InputError(path, f"not UTF-8 text ({e.reason} at byte {e.start} of row {i + 1})") from None
            i += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line, parse_int=json_integer)
            except json.JSONDecodeError as e:
                raise InputError(path, f"not valid JSON ({e.msg})", row=i) from None
            if not isinstance(obj, dict):
                raise InputError(path, "expected a JSON object", row=i)
            yield i, obj


def _need(obj: dict, key: str, path: Path, row: int, types: type | tuple = object) -> Any:
    """``obj[key]``, raising InputError (file, row, column) when missing, null or not of ``types``."""
    if key not in obj or obj[key] is None:
        raise InputError(path, "missing or null", row=row, column=key)
    value = obj[key]
    if not isinstance(value, types) or (isinstance(value, bool) and types in (int, (int, float))):
        want = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise InputError(path, f"expected {want}, found {type(value).__name__} {value!r:.40}", row=row, column=key)
    return value


def _steps_list(value: Any, path: Path, row: int, column: str) -> list[str]:
    """A non-empty list of non-empty strings (stripped), else InputError naming file, row and column."""
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InputError(path, "expected a list of strings", row=row, column=column)
    steps = [x.strip() for x in value]
    if not steps or not all(steps):
        raise InputError(path, "empty steps" if not steps else f"step {steps.index('')} is empty", row=row, column=column)
    return steps


def _scalar_text(value: Any, path: Path, row: int, column: str, gold: bool = False) -> str | None:
    """An answer value as text (:func:`stepkit.grading.values.answer_text`: strings as they are, numbers
    without exponent notation; with ``gold``, NaN/Infinity refused), else InputError."""
    try:
        return answer_text(value, gold=gold)
    except ValueError as e:
        raise InputError(path, str(e), row=row, column=column) from None


def ratings_to_labels(ratings: list, neutral_as: str = "positive") -> list[bool]:
    """Map per-step ratings to hard labels.

    PRM800K rates steps -1/0/1. The PRM800K paper and Qwen's baselines count a neutral 0 as positive;
    TRL's converter keeps only 1 as true (case ``prm800k-neutral-rating-mapping``), so the choice is
    explicit. Booleans pass through; ``"+"``/``"-"`` map to True/False.

    Raises:
        ValueError: unknown ``neutral_as`` or a rating outside {-1, 0, 1, True, False, "+", "-"}.
    """
    if neutral_as not in ("positive", "negative"):
        raise ValueError(f"neutral_as must be 'positive' or 'negative', got {neutral_as!r}")
    out = []
    for r in ratings:
        if isinstance(r, bool):
            out.append(r)
        elif r in ("+", "-"):
            out.append(r == "+")
        elif r in (1, -1, 0):
            out.append(r == 1 or (r == 0 and neutral_as == "positive"))
        else:
            raise ValueError(f"unknown step rating {r!r}")
    return out


def first_error_status(outcome_correct: bool | None, first_error: int | None, n_steps: int) -> str:
    """Check a first-error label against its outcome (case ``first-error-step-missing-for-incorrect``).

    An incorrect outcome must have ``0 <= first_error < n_steps``; a correct one may have -1 or a step
    (ProcessBench: correct answers can hide process errors). Returns ``"ok"`` or
    ``"inconsistent: <why>"`` — such rows are flagged, never silently relabelled.
    """
    if first_error is None or not isinstance(first_error, int) or isinstance(first_error, bool):
        return f"inconsistent: first error {first_error!r} is not an integer"
    if not -1 <= first_error < n_steps:
        return f"inconsistent: first error {first_error} outside -1..{n_steps - 1}"
    if outcome_correct is False and first_error == -1:
        return "inconsistent: incorrect outcome with no erroneous step"
    return "ok"


class Ingester:
    """Builds rows for one format; grades outcomes with an :class:`AnswerChecker` (process pool)."""

    def __init__(self, fmt: str, path: Path, opts: IngestOptions, checker):
        self.fmt, self.path, self.opts, self.checker = fmt, Path(path), opts, checker
        self.counts: dict[str, int] = {}

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def rows(self) -> tuple[list[dict], Any]:
        fn = {"gsm8k": self._gsm8k, "gsm8k-solutions": self._gsm8k_solutions,
              "processbench": self._processbench, "jsonl": self._generic, "parquet": self._generic}[self.fmt]
        return fn()

    def _take(self, items):
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

    # ---- gsm8k problems -----------------------------------------------------------------------
    def _gsm8k(self):
        rows = []
        for i, obj in self._take(list(read_jsonl(self.path))):
            q, a = _need(obj, "question", self.path, i, str), _need(obj, "answer", self.path, i, str)
            try:
                ref = extract_gsm8k_reference(a)
            except ValueError:
                raise InputError(self.path, "no '#### N' final answer line", row=i, column="answer") from None
            lines = [strip_calculator_annotations(x).strip() for x in a.splitlines()]
            split = self.path.stem  # test.jsonl -> gsm8k-test-17, train.jsonl -> gsm8k-train-17
            rows.append({"problem_id": f"gsm8k-{split}-{i}", "source": f"gsm8k/{split}/{i}",
                         "prompt": strip_calculator_annotations(q).strip(), "reference_answer": ref,
                         "reference_steps": [x for x in lines if x and not x.startswith("####")],
                         "reference_solution": a})
        return rows, PROBLEM_SCHEMA_WITH_SOLUTION

    # ---- gsm8k example model solutions -------------------------------------------------------
    def _gsm8k_solutions(self):
        gens = self.opts.generators or GSM8K_GENERATORS
        rows, pairs = [], []
        for i, obj in self._take(list(read_jsonl(self.path))):
            q = _need(obj, "question", self.path, i, str)
            gt = _need(obj, "ground_truth", self.path, i, str)
            ref = extract_final_answer(strip_calculator_annotations(gt))
            if ref is None:
                raise InputError(self.path, "no final answer in the ground truth", row=i, column="ground_truth")
            for g in gens:
                if g not in obj:
                    raise InputError(self.path, f"no generator {g!r} (has: {', '.join(k for k in obj if isinstance(obj[k], dict))})",
                                     row=i, column=g)
                if not isinstance(obj[g], dict):
                    raise InputError(self.path, "expected an object with 'solution' and 'is_correct'", row=i, column=g)
                sol = _need(obj[g], "solution", self.path, i, str)
                if not isinstance(obj[g].get("is_correct"), (bool, type(None))):
                    raise InputError(self.path, "is_correct must be true or false", row=i, column=f"{g}.is_correct")
                text = strip_calculator_annotations(sol)
                steps, sep = split_steps(text, "newline")
                final = extract_final_answer(text)
                if final is None:
                    self.count("no_final_answer")
                row = {"id": f"gsm8k-test-{i}:{g}", "problem_id": f"gsm8k-test-{i}", "source": f"gsm8k/test/{i}",
                       "prompt": strip_calculator_annotations(q).strip(), "reference_answer": ref,
                       "steps": steps, "step_separator": sep, "final_answer": final, "generator": g,
                       "source_outcome_correct": obj[g].get("is_correct"), "reference_solution": gt, "error": None}
                if not steps:
                    row["error"] = "ingest: solution has no steps"
                    row["steps"] = []
                rows.append(row)
                pairs.append((ref, final))
        self._grade(rows, pairs)
        return rows, TRAJ_SCHEMA_WITH_REFS

    def _grade(self, rows, pairs):
        """Grade ``rows`` (final answer vs reference). A reference math-verify cannot use is bad input
        for jsonl/parquet (the user's column); for the bundled formats the row keeps no reference."""
        bad = self.checker.gold_problems([g for g, _ in pairs])
        keep = []
        for row, (gold, pred) in zip(rows, pairs):
            if bad.get(gold) is None:
                keep.append((row, (gold, pred)))
            elif self.fmt in ("jsonl", "parquet"):
                raise InputError(self.path, f"unusable reference answer: {bad[gold]}",
                                 row=int(row["source"].rsplit("/", 1)[1]), column=self.opts.reference_col)
            else:
                row.update(reference_answer=None, outcome_correct=None)
                self.count("reference: unusable")
        rows, pairs = [r for r, _ in keep], [p for _, p in keep]
        for row, ok in zip(rows, self.checker.check_many(pairs)):
            row["outcome_correct"] = bool(ok) if row.get("final_answer") is not None else False
            src = row.get("source_outcome_correct")
            if src is not None:
                self.count("agree_with_source" if src == row["outcome_correct"] else "disagree_with_source")
            self.count("outcome_correct" if row["outcome_correct"] else "outcome_incorrect")

    # ---- ProcessBench --------------------------------------------------------------------------
    def _processbench(self):
        try:
            data = json.loads(self.path.read_text(), parse_int=json_integer)
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(self.path, f"not a readable ProcessBench JSON file ({e})") from None
        if not isinstance(data, list):
            raise InputError(self.path, "expected a JSON list of ProcessBench rows")
        answers = self._reference_answers()
        by_problem: dict[str, str] = {}
        for i, obj in enumerate(data):
            if not isinstance(obj, dict):
                raise InputError(self.path, "expected an object", row=i)
            _need(obj, "id", self.path, i, (str, int))
            _need(obj, "problem", self.path, i, str)
            _steps_list(_need(obj, "steps", self.path, i), self.path, i, "steps")
            _need(obj, "final_answer_correct", self.path, i, bool)
        for obj in data:  # a row of the same problem whose final answer is marked correct
            if obj.get("final_answer_correct") and obj.get("steps"):
                fa = extract_final_answer("\n\n".join(obj["steps"]))
                if fa is not None:
                    by_problem.setdefault(_norm(obj["problem"]), fa)
        split = self.path.stem
        rows, pairs = [], []
        for i, obj in self._take(list(enumerate(data))):
            steps = _steps_list(obj["steps"], self.path, i, "steps")
            label = obj.get("label")
            valid_label = isinstance(label, int) and not isinstance(label, bool) and -1 <= label < len(steps)
            final = extract_final_answer("\n\n".join(steps))
            ref, how = answers.get(_norm(obj["problem"])), "matched problem text"
            if ref is None:
                ref, how = by_problem.get(_norm(obj["problem"])), "from a correct row of the same problem"
            self.count(f"reference: {how}" if ref is not None else "reference: none")
            rows.append({"id": str(obj["id"]), "problem_id": f"processbench-{split}-{_problem_key(obj['problem'])}",
                         "source": f"processbench/{split}/{obj['id']}", "prompt": obj["problem"],
                         "reference_answer": ref, "steps": steps, "step_separator": "\n\n",
                         "final_answer": final, "generator": obj.get("generator"),
                         "source_outcome_correct": obj["final_answer_correct"],
                         "reference_first_error": label if valid_label else None, "error": None,
                         "reference_solution": self._solutions.get(_norm(obj["problem"])),
                         "reference_status": first_error_status(obj["final_answer_correct"], label, len(steps))})
            pairs.append((ref, final))
        graded = [(r, p) for r, p in zip(rows, pairs) if r["reference_answer"] is not None]
        self._grade([r for r, _ in graded], [p for _, p in graded])
        for r in rows:
            r.setdefault("outcome_correct", None)  # no reference: ungraded (the human flag stays in source_outcome_correct)
            if r["reference_status"] != "ok":
                self.count("reference_inconsistent")
        return rows, TRAJ_SCHEMA_WITH_REFS

    def _reference_answers(self) -> dict[str, str]:
        """Problem text -> gold answer from GSM8K test and MATH-500 files (``--answers`` or siblings); the
        GSM8K rows' annotated solutions go into ``self._solutions`` (problem text -> ``reference_solution``)."""
        files = [Path(p) for p in self.opts.answers] or [
            self.path.parent.parent / "gsm8k" / "test.jsonl", self.path.parent.parent / "math500" / "test.jsonl"]
        out: dict[str, str] = {}
        self._solutions: dict[str, str] = {}
        for f in files:
            if not f.exists():
                continue
            for i, obj in read_jsonl(f):
                if "question" in obj and "answer" in obj:
                    try:
                        out[_norm(obj["question"])] = extract_gsm8k_reference(obj["answer"])
                        self._solutions[_norm(obj["question"])] = obj["answer"]
                    except ValueError:
                        pass
                elif "problem" in obj and "answer" in obj:
                    out[_norm(obj["problem"])] = _scalar_text(obj["answer"], f, i, "answer", gold=True)
        return out

    # ---- generic jsonl / parquet ---------------------------------------------------------------
    def _generic(self):
        o = self.opts
        if self.fmt == "parquet":
            from stepkit.shards import read_rows

            items = list(enumerate(read_rows(self.path)))
        else:
            items = list(read_jsonl(self.path))
        rows, pairs = [], []
        seen_ids: set[str] = set()
        for i, obj in self._take(items):
            prompt = _need(obj, o.prompt_col, self.path, i, str)
            raw = _need(obj, o.steps_col, self.path, i)
            if isinstance(raw, str):
                steps, sep = split_steps(raw, o.split)
                if not steps:
                    raise InputError(self.path, "empty steps", row=i, column=o.steps_col)
            else:
                steps = _steps_list(raw, self.path, i, o.steps_col)
                sep = "\n\n" if any("\n" in s for s in steps) else "\n"
            ref = (_scalar_text(obj.get(o.reference_col), self.path, i, o.reference_col, gold=True)
                   if o.reference_col else None)
            final = (_scalar_text(obj.get(o.answer_col), self.path, i, o.answer_col) if o.answer_col
                     else extract_final_answer(sep.join(steps)))
            pid = (str(_need(obj, o.problem_id_col, self.path, i, (str, int))) if o.problem_id_col
                   else f"{self.path.stem}-{_problem_key(prompt)}")
            rid = str(_need(obj, o.id_col, self.path, i, (str, int))) if o.id_col else f"{self.path.stem}-{i}"
            if rid in seen_ids:
                raise InputError(self.path, f"duplicate id {rid!r}", row=i, column=o.id_col)
            seen_ids.add(rid)
            row = {"id": rid, "problem_id": pid,
                   "source": f"{self.path.name}/{i}", "prompt": prompt,
                   "reference_answer": None if ref is None else str(ref), "steps": steps, "step_separator": sep,
                   "final_answer": None if final is None else str(final),
                   "generator": str(obj.get("generator") or "unknown"), "error": None}
            if o.labels_col:
                try:
                    row["reference_labels"] = ratings_to_labels(_need(obj, o.labels_col, self.path, i), o.neutral_as)
                except ValueError as e:
                    raise InputError(self.path, str(e), row=i, column=o.labels_col) from None
                if len(row["reference_labels"]) != len(steps):
                    raise InputError(self.path, f"{len(row['reference_labels'])} labels for {len(steps)} steps",
                                     row=i, column=o.labels_col)
            rows.append(row)
            pairs.append((row["reference_answer"], row["final_answer"]))
        graded = [(r, p) for r, p in zip(rows, pairs) if r["reference_answer"] is not None]
        self._grade([r for r, _ in graded], [p for _, p in graded])
        for (i, obj), r in zip(self._take(items), rows):
            r.setdefault("outcome_correct", None)
            if o.first_error_col:
                fe = _need(obj, o.first_error_col, self.path, i)
                ok = isinstance(fe, int) and not isinstance(fe, bool) and -1 <= fe < len(r["steps"])
                r["reference_first_error"] = fe if ok else None
                r["reference_status"] = first_error_status(r["outcome_correct"], fe, len(r["steps"]))
                if r["reference_status"] != "ok":
                    self.count("reference_inconsistent")
        return rows, TRAJ_SCHEMA_WITH_REFS


def _norm(text: str) -> str:
    return " ".join(str(text).split()).lower()


def _problem_key(text: str) -> str:
    import hashlib

    return hashlib.sha256(_norm(text).encode()).hexdigest()[:12]


def ingest(fmt: str, path: str | Path, out: str | Path, opts: IngestOptions, checker, checker_settings: dict) -> dict:
    """Read ``path`` in format ``fmt`` and write the shard ``out`` with its manifest.

    Returns the manifest. Raises :class:`InputError` on bad input (naming file, row and column);
    nothing is written then.
    """
    path, out = Path(path), Path(out)
    if fmt not in FORMATS:
        raise InputError(path, f"unknown format {fmt!r} (choose {', '.join(FORMATS)})")
    if not path.exists():
        raise InputError(path, "no such file")
    if out.resolve() == path.resolve():
        raise InputError(path, "OUT is the same file as the input; write the shard somewhere else")
    if out.suffix != ".parquet":
        raise InputError(out, "OUT must be a .parquet file path")
    ing = Ingester(fmt, path, opts, checker)
    rows, schema = ing.rows()
    if not rows:
        raise InputError(path, "no records to ingest" + (" after --skip" if opts.skip else ""))
    opt_doc = {k: v for k, v in vars(opts).items() if v not in (None, (), {}, "")}
    manifest = {"stage": "ingest", "stepkit_version": __version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "config": {"format": fmt, "options": opt_doc, "grader": checker_settings},
                "input": {"path": str(path), "sha256": file_sha256(path)},
                "counts": {"rows": len(rows), **ing.counts}}
    try:
        write_shard(out, rows, schema, manifest, source=path)
    except OSError as e:
        raise InputError(out, f"cannot write ({e.strerror or e})") from None
    return manifest
