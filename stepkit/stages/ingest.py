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

Reading: FILE (and each answers file) is read once, as a stream of lines (JSON Lines) or whole
(ProcessBench JSON, Parquet), and the sha256 in the manifest is of exactly the bytes read, so a pipe
(``<(zcat x.gz)``, a named FIFO) works. Gold answers written on a marker line (``#### N``, ``A: N``) are
read whole, never with the length bound meant for model output.

Bad input is one :class:`~stepkit.errors.InputError` naming the file, the row (0-based: the line of a JSON
Lines file, the element of a JSON list, the row of a Parquet file) and the column: invalid UTF-8 (with its
byte offset), JSON that ``json`` refuses (bad syntax, an integer of more than 4,300 digits, nesting deeper
than the recursion limit), a lone UTF-16 surrogate, a column that a ``--*-col`` option names and the file
lacks, an empty or repeated id, a blank prompt. So a shard that ingest writes is one every later stage
reads. An option that does not apply to the format is refused (:func:`option_conflicts`), and ingest
never writes over its input, an answers file, or a file it did not write itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from stepkit import __version__
from stepkit.errors import ConfigError, InputError, parse_failure
from stepkit.grading.answers import _MAX_PHRASE as ANSWER_PHRASE_CHARS
from stepkit.grading.answers import extract_final_answer, extract_gsm8k_reference, strip_calculator_annotations
from stepkit.grading.steps import check_split, split_steps
from stepkit.grading.values import answer_text, json_integer
from stepkit.options import Config, flag_of, opt
from stepkit.schema import PROBLEM_SCHEMA, REFERENCE_FIELDS, REFERENCE_SOLUTION_FIELD, TRAJECTORY_SCHEMA, extend_schema
from stepkit.shards import manifest_path, resolve_path, write_shard

FORMATS = ("gsm8k", "gsm8k-solutions", "processbench", "jsonl", "parquet", "messages")
GENERIC = ("jsonl", "parquet")
GSM8K_GENERATORS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
TRAJ_SCHEMA_WITH_REFS = extend_schema(TRAJECTORY_SCHEMA, REFERENCE_FIELDS)
COLUMN_OPTIONS = ("prompt_col", "steps_col", "answer_col", "reference_col", "id_col", "problem_id_col",
                  "labels_col", "first_error_col")
"""The options that name a column of a jsonl/parquet file: each must name one the file has."""
OPTION_FORMATS: dict[str, tuple[str, ...]] = {
    "generators": ("gsm8k-solutions",), "answers": ("processbench",),
    **{name: GENERIC for name in ("split", "neutral_as", *COLUMN_OPTIONS)},
    "id_col": (*GENERIC, "messages"), "problem_id_col": (*GENERIC, "messages"),
    **{name: ("messages",) for name in ("messages_col", "outcome_col", "gold_col", "success_threshold")}}
"""The formats an option applies to (an option not listed applies to every format)."""
OPTION_NEEDS = {"seed": "sample", "neutral_as": "labels_col"}
"""Options that act only together with another one."""
HEAD_BYTES = 1 << 16  # how much of FILE is kept to tell which format it looks like
PROBLEM_SCHEMA_WITH_SOLUTION = extend_schema(PROBLEM_SCHEMA, [REFERENCE_SOLUTION_FIELD])


@dataclass(frozen=True)
class IngestOptions(Config):
    """Options of ``stepkit ingest`` (column names refer to the source file for jsonl/parquet).

    Raises:
        ConfigError: a value out of range, an unknown split mode, a missing ``--answers`` file or a
            generator given twice.
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
    steps_col: str = opt("steps", "jsonl/parquet: a list of steps, or a string to split.")
    answer_col: str | None = opt(None, "jsonl/parquet: the solution's final answer (default: extracted from the "
                                 "steps).")
    reference_col: str | None = opt(None, "jsonl/parquet: gold answer column (needed to grade outcomes).")
    problem_id_col: str | None = opt(None, "jsonl/parquet: problem id column (default: the row id).")
    labels_col: str | None = opt(None, "jsonl/parquet: per-step human labels or ratings (-1/0/1, bool, +/-).")
    neutral_as: str = opt("positive", "With --labels-col: how a neutral 0 rating maps (PRM800K paper: positive; "
                          "TRL's converter: negative).", choices=("positive", "negative"))
    first_error_col: str | None = opt(None, "jsonl/parquet: human first-error index column (-1 = no error).")
    answers: tuple[str, ...] = opt((), "processbench: GSM8K/MATH-500 jsonl files to recover gold answers from.",
                                   file=True)
    messages_col: str | None = opt(None, "messages: the conversation key (default: messages, else traj).")
    outcome_col: str = opt("reward", "messages: the outcome key (a number or bool; dots reach into objects).")
    gold_col: str = opt("info.task.actions", "messages: the gold tool calls key (a list of {name, kwargs|arguments}; "
                        "absent: none).")
    success_threshold: float = opt(1.0, "messages: outcome_correct is reward >= this.")

    def __post_init__(self):
        super().__post_init__()
        check_split(self.split)
        twice = sorted({g for g in self.generators if self.generators.count(g) > 1})
        if twice:  # the rows of a generator would come out twice, with the same ids
            raise ConfigError(f"--generator {twice[0]} is given twice")


def option_conflicts(fmt: str, opts: IngestOptions, names) -> list[str]:
    """Why the options ``names`` (field names of :class:`IngestOptions`) cannot be given for format ``fmt``:
    one message per option that does not apply to the format or acts only with another option that is not
    set (``--seed`` without ``--sample``). Empty when every one applies."""
    flags = {f.name: flag_of(f) for f in dataclasses.fields(IngestOptions)}
    out = []
    for name in names:
        formats = OPTION_FORMATS.get(name)
        if formats is not None and fmt not in formats:
            out.append(f"{flags[name]} applies only to format{'s' if len(formats) > 1 else ''} "
                       f"{', '.join(formats)}, not {fmt}")
        elif name in OPTION_NEEDS and getattr(opts, OPTION_NEEDS[name]) in (None, ()):
            out.append(f"{flags[name]} has no effect without {flags[OPTION_NEEDS[name]]}")
    return out


class _FormatError(InputError):
    """An error about the file's layout (a missing key, not a list, not Parquet): :func:`ingest` adds the
    format the file looks like when it is another one."""


# A \u escape of a UTF-16 surrogate: only these can give a string that is not encodable as UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_JSON = json.JSONDecoder(parse_int=json_integer)  # the one decoder of JSON Lines rows and ProcessBench list elements


def _names(obj: dict, limit: int = 30) -> str:
    names = [str(k) for k in list(obj)[:limit]]
    return ", ".join(names) + (", ..." if len(obj) > limit else "")


def _check_encodable(obj: Any, path: Path, row: int) -> None:
    """Raise InputError for the first string of ``obj`` with a lone surrogate (``"\\ud800"`` in JSON), which
    no UTF-8 file can hold, naming its top-level key as the column."""
    stack: list[tuple[Any, Any]] = [(obj, None)]
    while stack:
        value, column = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InputError(path, f"a lone surrogate \\u{ord(value[e.start]):04x} in a string (not encodable "
                                       "as UTF-8)", row=row, column=column) from None
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, column))
                stack.append((v, k if column is None else column))
        elif isinstance(value, list):
            stack.extend((v, column) for v in value)


def _loads(text: str, path: Path, row: int) -> Any:
    """``json.loads(text)``, every refusal an InputError naming ``path`` and ``row``."""
    try:
        obj = _JSON.decode(text)
    except json.JSONDecodeError as e:  # on the first line, perhaps not JSON Lines at all
        raise (_FormatError if row == 0 else InputError)(path, f"not valid JSON ({e.msg} at character {e.pos})",
                                                         row=row) from None
    except (ValueError, RecursionError) as e:  # an integer over the digit limit, nesting too deep
        raise InputError(path, f"not valid JSON ({parse_failure(e)})", row=row) from None
    if _SURROGATE_ESCAPE.search(text):
        _check_encodable(obj, path, row)
    return obj


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


def read_jsonl(path: Path, digest=None, head: bytearray | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_index, object)`` for each non-blank line of a JSON Lines file, reading it once.

    ``digest`` (a :mod:`hashlib` object) is updated with every byte read, so once the iterator is exhausted
    it is the file's hash (a pipe can be read only once); ``head`` receives the first ``HEAD_BYTES``.

    Raises:
        InputError: the file cannot be read; a line is not UTF-8 (naming its byte in the line and in the
            file), not valid JSON, not an object, or holds a lone surrogate; always naming file and row.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from None
    with f:
        yield from jsonl_records(f, path, digest, head)


def jsonl_records(f: BinaryIO, path: Path, digest=None, head: bytearray | None = None) -> Iterator[tuple[int, dict]]:
    """:func:`read_jsonl` on an open binary stream ``f`` (bytes already read once, e.g. ``io.BytesIO``);
    ``path`` names the file in errors."""
    i, offset = -1, 0
    while True:
        try:
            raw = f.readline()
        except OSError as e:
            raise InputError(path, f"cannot read after row {i} ({e.strerror or e})") from None
        if not raw:
            break
        i += 1
        if digest is not None:
            digest.update(raw)
        if head is not None and len(head) < HEAD_BYTES:
            head += raw[:HEAD_BYTES - len(head)]
        start, offset = offset, offset + len(raw)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # on the first line, perhaps a binary file
            where = f"at byte {e.start} of the row, byte {start + e.start} of the file"
            raise (_FormatError if i == 0 else InputError)(
                path, f"not UTF-8 text ({e.reason} 0x{raw[e.start]:02x} {where})", row=i) from None
        if i == 0:
            line = line.removeprefix("\ufeff")  # a byte order mark
        if not line.strip():
            continue
        obj = _loads(line, path, i)
        if not isinstance(obj, dict):
            raise _FormatError(path, f"expected a JSON object, found {_json_type(obj)}", row=i)
        yield i, obj


def _read_whole(path: Path) -> bytes:
    """All bytes of ``path``, read once (a pipe works)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror or e})") from None


def _json_list(text: str, path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, element)`` of the JSON list ``text``, parsing one element at a time so that any
    refusal (bad syntax, an integer over the digit limit, deep nesting, a lone surrogate) names its row."""
    i = _JSON_SPACE.match(text).end()
    if not text.startswith("[", i):
        raise _FormatError(path, "expected a JSON list of ProcessBench rows")

    def where(pos: int) -> str:
        line = text.count("\n", 0, pos) + 1
        return f"line {line}, character {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"

    i = _JSON_SPACE.match(text, i + 1).end()
    row = 0
    if text.startswith("]", i):
        end = i
    else:
        while True:
            try:
                obj, end = _JSON.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise InputError(path, f"not valid JSON ({e.msg} at {where(e.pos)})", row=row) from None
            except (ValueError, RecursionError) as e:
                raise InputError(path, f"not valid JSON ({parse_failure(e)})", row=row) from None
            if _SURROGATE_ESCAPE.search(text, i, end):
                _check_encodable(obj, path, row)
            yield row, obj
            i = _JSON_SPACE.match(text, end).end()
            if text.startswith(",", i):
                i, row = _JSON_SPACE.match(text, i + 1).end(), row + 1
                continue
            if text.startswith("]", i):
                end = i
                break
            raise InputError(path, f"not valid JSON (expected ',' or ']' after the row, at {where(i)})", row=row)
    rest = _JSON_SPACE.match(text, end + 1).end()
    if rest < len(text):
        raise InputError(path, f"not valid JSON (extra data after the list, at {where(rest)})")


def _need(obj: dict, key: str, path: Path, row: int, types: type | tuple = object, flag: str | None = None,
          column: str | None = None) -> Any:
    """``obj[key]``, raising InputError (file, row, column) when missing, null or not of ``types``; a missing
    key's message lists the keys the row has (and the option that named it)."""
    column = key if column is None else column
    if key not in obj:
        raise _FormatError(path, f"missing ({f'named by {flag}; ' if flag else ''}the row has: {_names(obj)})",
                           row=row, column=column)
    value = obj[key]
    if value is None:
        raise InputError(path, "null", row=row, column=column)
    allowed = types if isinstance(types, tuple) else (types,)
    bad_bool = isinstance(value, bool) and bool not in allowed and (int in allowed or float in allowed)
    if not isinstance(value, allowed) or bad_bool:
        want = " or ".join(t.__name__ for t in allowed)
        raise InputError(path, f"expected {want}, found {type(value).__name__} {value!r:.40}", row=row, column=column)
    return value


def _need_text(obj: dict, key: str, path: Path, row: int, flag: str | None = None) -> str:
    """``obj[key]`` as a string that is not blank (a prompt: later stages refuse an empty one)."""
    value = _need(obj, key, path, row, str, flag)
    if not value.strip():
        raise InputError(path, "empty", row=row, column=key)
    return value


def _need_id(obj: dict, key: str, path: Path, row: int, flag: str | None = None) -> str:
    """``obj[key]`` (a string or an integer) as a non-empty string id."""
    value = str(_need(obj, key, path, row, (str, int), flag))
    if not value.strip():
        raise InputError(path, "empty", row=row, column=key)
    return value


def _optional(obj: dict, key: str, path: Path, row: int, flag: str) -> Any:
    """``obj[key]`` where null means "none"; a row without the key at all is bad input."""
    if key not in obj:
        raise _FormatError(path, f"missing (named by {flag}; the row has: {_names(obj)})", row=row, column=key)
    return obj[key]


def _unique(ids: dict[str, int], value: str, path: Path, row: int, column: str | None) -> None:
    """Record ``value`` as the id of ``row``; raise InputError when an earlier row has it."""
    if value in ids:
        raise InputError(path, f"duplicate id {value!r} (also row {ids[value]})", row=row, column=column)
    ids[value] = row


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
    if isinstance(value, (bool, list, dict)):
        raise InputError(path, f"expected a string or number, found {_json_type(value)}", row=row, column=column)
    try:
        return answer_text(value, gold=gold)
    except ValueError as e:
        raise InputError(path, str(e), row=row, column=column) from None


# A plain number as GSM8K's own grader reads it after "####" (digits, thousands commas, a decimal part).
_PLAIN_GOLD = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_A_LINE = re.compile(r"^[ \t]*A:", re.MULTILINE)


def _marker_gold(line: str, read: Callable[[], str | None], marker: str, path: Path, row: int, column: str) -> str:
    """The gold answer written after ``marker`` on ``line``, read whole.

    A plain number (the GSM8K format) is taken as it is, thousands commas and leading zeros dropped, at any
    length. Other text goes through the answer reader ``read`` (which ends an answer at its clause and
    reads at most ``ANSWER_PHRASE_CHARS`` characters, a bound for model output): a longer line is refused
    rather than cut."""
    line = line.strip()
    if _PLAIN_GOLD.fullmatch(line):
        ans = line.replace(",", "")
        sign, digits = ("-", ans[1:]) if ans.startswith("-") else ("", ans)
        return sign + (digits.lstrip("0") or "0") if digits.isdigit() else ans
    if len(line) > ANSWER_PHRASE_CHARS:
        raise InputError(path, f"the answer after {marker!r} is {len(line)} characters of text that is not a number; "
                               f"answers are read for at most {ANSWER_PHRASE_CHARS} characters, so it would be cut",
                         row=row, column=column)
    ans = read()
    if not ans:
        raise InputError(path, f"no answer after {marker!r}", row=row, column=column)
    return ans


def gsm8k_reference(answer: str, path: Path, row: int, column: str = "answer") -> str:
    """The gold answer of a GSM8K ``answer`` field: the text after its last ``####``, read whole.

    Raises:
        InputError: no ``####``, nothing after it, or a non-numeric answer too long to read whole.
    """
    k = answer.rfind("####")
    if k < 0:
        raise InputError(path, "no '#### N' final answer line", row=row, column=column)

    def read():
        try:
            return extract_gsm8k_reference(answer)
        except ValueError:
            return None

    return _marker_gold(answer[k + 4:].split("\n", 1)[0], read, "####", path, row, column)


def _solutions_reference(ground_truth: str, path: Path, row: int) -> str:
    """The gold answer of a GSM8K example-solutions ``ground_truth``: its last ``A: N`` line, read whole."""
    text = strip_calculator_annotations(ground_truth)
    lines = list(_A_LINE.finditer(text))
    if not lines:
        ref = extract_final_answer(text)
        if ref is None:
            raise InputError(path, "no final answer in the ground truth", row=row, column="ground_truth")
        return ref
    line = text[lines[-1].end():].split("\n", 1)[0]
    return _marker_gold(line, lambda: extract_final_answer("A: " + line.strip()), "A:", path, row, "ground_truth")


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
    """Builds rows for one format; grades outcomes with an :class:`AnswerChecker` (process pool).

    Each row keeps the index of the source row it came from as ``row["_row"]`` (for error messages;
    dropped before writing). After :meth:`rows`, ``sha256`` is the hash of the bytes read from the file,
    ``head`` its first bytes and ``answer_files`` the answers files read (path and sha256).
    """

    def __init__(self, fmt: str, path: Path, opts: IngestOptions, checker):
        self.fmt, self.path, self.opts, self.checker = fmt, Path(path), opts, checker
        self.counts: dict[str, int] = {}
        self.sha256: str | None = None
        self.head = bytearray()
        self.answer_files: list[dict[str, str]] = []

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the manifest counter ``key``."""
        self.counts[key] = self.counts.get(key, 0) + n

    def rows(self) -> tuple[list[dict], Any]:
        """The rows of the file and the schema to write them with."""
        fn = {"gsm8k": self._gsm8k, "gsm8k-solutions": self._gsm8k_solutions,
              "processbench": self._processbench, "jsonl": self._generic, "parquet": self._generic,
              "messages": self._messages}[self.fmt]
        return fn()

    def _jsonl(self) -> list[tuple[int, dict]]:
        """Every record of FILE as JSON Lines, read once (hash and head recorded)."""
        digest = hashlib.sha256()
        items = list(read_jsonl(self.path, digest, self.head))
        self.sha256 = digest.hexdigest()
        return items

    def _whole(self) -> bytes:
        """FILE's bytes, read once (hash and head recorded)."""
        data = _read_whole(self.path)
        self.sha256, self.head = hashlib.sha256(data).hexdigest(), bytearray(data[:HEAD_BYTES])
        return data

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
        for i, obj in self._take(self._jsonl()):
            q, a = _need_text(obj, "question", self.path, i), _need(obj, "answer", self.path, i, str)
            ref = gsm8k_reference(a, self.path, i)
            prompt = strip_calculator_annotations(q).strip()
            if not prompt:
                raise InputError(self.path, "empty once its <<a=b>> annotations are removed", row=i, column="question")
            lines = [strip_calculator_annotations(x).strip() for x in a.splitlines()]
            split = self.path.stem  # test.jsonl -> gsm8k-test-17, train.jsonl -> gsm8k-train-17
            rows.append({"problem_id": f"gsm8k-{split}-{i}", "source": f"gsm8k/{split}/{i}", "prompt": prompt,
                         "reference_answer": ref, "_row": i,
                         "reference_steps": [x for x in lines if x and not x.startswith("####")],
                         "reference_solution": a})
        return rows, PROBLEM_SCHEMA_WITH_SOLUTION

    # ---- gsm8k example model solutions -------------------------------------------------------
    def _gsm8k_solutions(self):
        gens = self.opts.generators or GSM8K_GENERATORS
        rows, pairs = [], []
        for i, obj in self._take(self._jsonl()):
            q = _need_text(obj, "question", self.path, i)
            gt = _need(obj, "ground_truth", self.path, i, str)
            ref = _solutions_reference(gt, self.path, i)
            prompt = strip_calculator_annotations(q).strip()
            if not prompt:
                raise InputError(self.path, "empty once its <<a=b>> annotations are removed", row=i, column="question")
            for g in gens:
                if g not in obj:
                    have = ", ".join(k for k in obj if isinstance(obj[k], dict))
                    raise InputError(self.path, f"--generator {g}: no such generator (the row has: {have})"
                                     if self.opts.generators else
                                     f"no solutions of generator {g} (the default takes all four; choose with "
                                     f"--generator; the row has: {have})", row=i)
                if not isinstance(obj[g], dict):
                    raise InputError(self.path, "expected an object with 'solution' and 'is_correct'", row=i, column=g)
                sol = _need(obj[g], "solution", self.path, i, str, column=f"{g}.solution")
                if not isinstance(obj[g].get("is_correct"), (bool, type(None))):
                    raise InputError(self.path, "is_correct must be true or false", row=i, column=f"{g}.is_correct")
                text = strip_calculator_annotations(sol)
                steps, sep = split_steps(text, "newline")
                final = extract_final_answer(text)
                if final is None:
                    self.count("no_final_answer")
                row = {"id": f"gsm8k-test-{i}:{g}", "problem_id": f"gsm8k-test-{i}", "source": f"gsm8k/test/{i}",
                       "prompt": prompt, "reference_answer": ref, "_row": i,
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
            elif self.fmt in GENERIC:
                raise InputError(self.path, f"unusable reference answer: {bad[gold]}", row=row["_row"],
                                 column=self.opts.reference_col)
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
    def _whole_text(self) -> str:
        """FILE as UTF-8 text (read once; a byte-order mark dropped)."""
        return self._decode(self._whole())

    def _decode(self, data: bytes) -> str:
        """``data`` (FILE's bytes) as UTF-8 text, a byte-order mark dropped."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(self.path, f"not UTF-8 text ({e.reason} 0x{data[e.start]:02x} at byte {e.start} of the "
                                        "file)", row=_row_at(data[:e.start].decode("utf-8"), self.path)) from None
        return text.removeprefix("\ufeff")

    def _processbench(self):
        records = list(_json_list(self._whole_text(), self.path))
        answers = self._reference_answers()
        by_problem: dict[str, str] = {}
        ids: dict[str, int] = {}
        for i, obj in records:
            if not isinstance(obj, dict):
                raise _FormatError(self.path, f"expected an object, found {_json_type(obj)}", row=i)
            _unique(ids, _need_id(obj, "id", self.path, i), self.path, i, "id")
            _need_text(obj, "problem", self.path, i)
            _steps_list(_need(obj, "steps", self.path, i), self.path, i, "steps")
            _need(obj, "final_answer_correct", self.path, i, bool)
            if obj.get("generator") is not None:
                _need(obj, "generator", self.path, i, str)
        for _, obj in records:  # a row of the same problem whose final answer is marked correct
            if obj["final_answer_correct"]:
                fa = extract_final_answer("\n\n".join(obj["steps"]))
                if fa is not None:
                    by_problem.setdefault(_norm(obj["problem"]), fa)
        split = self.path.stem
        rows, pairs = [], []
        for i, obj in self._take(records):
            steps = _steps_list(obj["steps"], self.path, i, "steps")
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
        GSM8K rows' annotated solutions go into ``self._solutions`` (problem text -> ``reference_solution``).

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
        self._solutions: dict[str, str] = {}
        for f in files:
            if not given and not f.is_file():
                continue
            digest = hashlib.sha256()
            for i, obj in read_jsonl(f, digest):
                key = "question" if "question" in obj else "problem"
                if key not in obj or "answer" not in obj:
                    raise InputError(f, "expected 'question' and 'answer' (GSM8K) or 'problem' and 'answer' "
                                        f"(MATH-500); the row has: {_names(obj)}", row=i)
                problem = _need_text(obj, key, f, i)
                value = obj["answer"]
                if isinstance(value, str) and key == "question":
                    gold = gsm8k_reference(value, f, i)
                    self._solutions[_norm(problem)] = value
                else:
                    gold = _scalar_text(value, f, i, "answer", gold=True)
                    if gold is None:
                        raise InputError(f, "expected a string or number, found null", row=i, column="answer")
                    if not gold.strip():
                        raise InputError(f, "empty", row=i, column="answer")
                out[_norm(problem)] = gold.strip()
            self.answer_files.append({"path": str(f), "sha256": digest.hexdigest()})
        return out

    # ---- generic jsonl / parquet ---------------------------------------------------------------
    def _parquet(self) -> tuple[list[tuple[int, dict]], list[str]]:
        """Every row of FILE as Parquet (read once) and its column names."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = self._whole()
        try:
            pf = pq.ParquetFile(pa.BufferReader(data))
        except (pa.ArrowException, OSError, ValueError) as e:  # (a damaged footer: column names not UTF-8, ...)
            raise _FormatError(self.path, f"not a readable Parquet file ({parse_failure(e)})") from None
        rows: list[dict] = []
        try:
            for batch in pf.iter_batches(batch_size=1024):
                rows.extend(batch.to_pylist())
        except (pa.ArrowException, OSError, ValueError) as e:  # (damaged pages, text that is not UTF-8)
            raise InputError(self.path, f"cannot read rows after row {len(rows)} ({parse_failure(e)})") from None
        return list(enumerate(rows)), list(pf.schema_arrow.names)

    def _messages(self):
        from stepkit.stages.ingest_messages import MESSAGES_SCHEMA, conversation_rows

        data = self._whole()  # read once: FILE may be a pipe
        if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):  # a JSON list (τ-bench's files)
            items = list(_json_list(self._decode(data), self.path))
        else:  # JSON Lines
            items = list(jsonl_records(io.BytesIO(data), self.path))
        rows = conversation_rows(self._take(items), self.path, self.opts, self.count)
        return rows, MESSAGES_SCHEMA

    def _generator(self, obj: dict, row: int) -> str:
        """The row's ``generator`` text ("unknown" when absent, null or blank), never the repr of an object."""
        value = obj.get("generator")
        if value is None or (isinstance(value, str) and not value.strip()):
            return "unknown"
        return _need(obj, "generator", self.path, row, str)

    def _generic(self):
        o = self.opts
        flags = {f.name: flag_of(f) for f in dataclasses.fields(IngestOptions)}
        if self.fmt == "parquet":
            items, columns = self._parquet()
        else:
            items = self._jsonl()
            columns = list(dict.fromkeys(str(k) for _, obj in items for k in obj))
        if not items:
            return [], TRAJ_SCHEMA_WITH_REFS
        for name in COLUMN_OPTIONS:  # a misspelt column would otherwise read as "no value" in every row
            col = getattr(o, name)
            if col is not None and col not in columns:
                raise _FormatError(self.path, f"{flags[name]} names no column of the file (its columns: "
                                              f"{_names(dict.fromkeys(columns))})", column=col)
        rows, pairs = [], []
        ids: dict[str, int] = {}
        for i, obj in self._take(items):
            prompt = _need_text(obj, o.prompt_col, self.path, i, "--prompt-col")
            raw = _need(obj, o.steps_col, self.path, i, flag="--steps-col")
            if isinstance(raw, str):
                steps, sep = split_steps(raw, o.split)
                if not steps:
                    raise InputError(self.path, "empty steps", row=i, column=o.steps_col)
            else:
                steps = _steps_list(raw, self.path, i, o.steps_col)
                sep = "\n\n" if any("\n" in s for s in steps) else "\n"
            ref = None
            if o.reference_col:
                ref = _scalar_text(_optional(obj, o.reference_col, self.path, i, "--reference-col"), self.path, i,
                                   o.reference_col, gold=True)
                if ref is not None and not ref.strip():
                    raise InputError(self.path, "empty (null means no reference)", row=i, column=o.reference_col)
            if o.answer_col:
                final = _scalar_text(_optional(obj, o.answer_col, self.path, i, "--answer-col"), self.path, i,
                                     o.answer_col)
                final = final if final is None or final.strip() else None  # a blank answer is no answer
            else:
                final = extract_final_answer(sep.join(steps))
            pid = (_need_id(obj, o.problem_id_col, self.path, i, "--problem-id-col") if o.problem_id_col
                   else f"{self.path.stem}-{_problem_key(prompt)}")
            rid = _need_id(obj, o.id_col, self.path, i, "--id-col") if o.id_col else f"{self.path.stem}-{i}"
            _unique(ids, rid, self.path, i, o.id_col)
            row = {"id": rid, "problem_id": pid, "_row": i,
                   "source": f"{self.path.name}/{i}", "prompt": prompt,
                   "reference_answer": ref, "steps": steps, "step_separator": sep,
                   "final_answer": final, "generator": self._generator(obj, i), "error": None}
            if o.labels_col:
                ratings = _need(obj, o.labels_col, self.path, i, list, "--labels-col")
                try:
                    row["reference_labels"] = ratings_to_labels(ratings, o.neutral_as)
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
                fe = _need(obj, o.first_error_col, self.path, i, flag="--first-error-col")
                ok = isinstance(fe, int) and not isinstance(fe, bool) and -1 <= fe < len(r["steps"])
                r["reference_first_error"] = fe if ok else None
                r["reference_status"] = first_error_status(r["outcome_correct"], fe, len(r["steps"]))
                if r["reference_status"] != "ok":
                    self.count("reference_inconsistent")
        return rows, TRAJ_SCHEMA_WITH_REFS


def _row_at(prefix: str, path: Path) -> int | None:
    """The row of a JSON list that ``prefix`` (the text before some position) ends in."""
    try:
        for _ in _json_list(prefix, path):
            pass
    except InputError as e:
        return e.row
    return None


def _norm(text: str) -> str:
    return " ".join(str(text).split()).lower()


def _problem_key(text: str) -> str:
    return hashlib.sha256(_norm(text).encode()).hexdigest()[:12]


def sniff_format(head: bytes) -> str | None:
    """The format the first bytes of a file look like: ``parquet`` (its magic number), ``processbench`` (a
    JSON list), ``gsm8k`` / ``gsm8k-solutions`` (JSON Lines with their keys), ``jsonl`` (other JSON
    Lines), or None."""
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if text.startswith("["):
        return "processbench"
    if not text.startswith("{"):
        return None
    try:
        keys = set(json.loads(text.split("\n", 1)[0]))
    except (ValueError, RecursionError, TypeError):
        return "jsonl"
    if {"question", "ground_truth"} <= keys:
        return "gsm8k-solutions"
    if {"question", "answer"} <= keys:
        return "gsm8k"
    return "jsonl"


def _with_hint(e: InputError, fmt: str, head: bytes) -> InputError:
    """``e`` with the format the file looks like, when that is another one than ``fmt``."""
    guess = sniff_format(head)
    if guess is None or guess == fmt:
        return e
    how = " with --prompt-col/--steps-col naming its columns" if guess in GENERIC else ""
    return InputError(e.path, f"{e.detail}; the file looks like {guess} input (stepkit ingest {guess} FILE OUT{how})",
                      row=e.row, column=e.column)


def _same_file(a: Path, b: Path) -> bool:
    if resolve_path(a) == resolve_path(b):  # (a symlink loop is one InputError)
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _written_by(out: Path) -> str | None:
    """The stage named in the stepkit manifest of the Parquet file ``out`` (its own metadata), else None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(out).metadata or {}
        doc = json.loads(meta[b"stepkit"]) if b"stepkit" in meta else None
    except (OSError, ValueError, pa.ArrowException):
        return None
    return doc.get("stage") if isinstance(doc, dict) else None


def check_output(path: Path, out: Path, answers: tuple[str, ...] = ()) -> None:
    """Refuse an OUT that would write over the input, an answers file or a file ingest did not write.

    OUT and its manifest (``<stem>.manifest.json``) must not be the input or an answers file (by path or
    hard link); an existing OUT must be a shard ``ingest`` wrote (ingest rewrites its own output, never
    another stage's shard or a foreign file), an existing manifest path a stepkit manifest, and OUT must not
    lie in a stage's ``.parts`` folder.

    Raises:
        InputError: naming the file that would be overwritten.
    """
    mp = manifest_path(out)
    for what, p in [("the input", path), *(("an --answers file", Path(a)) for a in answers)]:
        if _same_file(p, out):
            raise InputError(out, f"OUT is the same file as {what}; write the shard somewhere else")
        if _same_file(p, mp):
            aka = "" if resolve_path(p) == resolve_path(mp) else f" ({p})"
            raise InputError(mp, f"is {what}{aka}, and it is where OUT {out} writes its manifest; give OUT another name")
    if out.parent.name.endswith(".parts") and len(out.parent.name) > len(".parts"):
        raise InputError(out, f"is inside the parts folder of {out.parent.with_name(out.parent.name[:-6])}; "
                              "write the shard somewhere else")
    if out.is_dir():
        raise InputError(out, "is a folder; OUT must be a .parquet file path")
    if mp.is_dir():  # OUT would be replaced and its manifest left stale
        raise InputError(mp, f"is a folder, and it is where OUT {out} writes its manifest; give OUT another name")
    if out.exists():
        stage = _written_by(out)
        if stage != "ingest":
            who = "it has no stepkit manifest" if stage is None else f"it is a {stage} shard"
            raise InputError(out, f"exists and was not written by ingest ({who}); ingest replaces only its own "
                                  "output: remove it or choose another OUT")
    elif mp.exists():
        try:
            doc = json.loads(mp.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict) or "stage" not in doc:
            raise InputError(mp, f"exists and is not a stepkit manifest, and it is where OUT {out} writes its "
                                 "manifest; give OUT another name")


def _check_rows(rows: list[dict], schema, path: Path) -> None:
    """The shard's own checks, whatever the format: ids (or problem ids of a problems shard) present and
    unique, prompts and problem ids not blank; an error names the source row."""
    key = "id" if "id" in schema.names else "problem_id"
    seen: dict[str, int] = {}
    for r in rows:
        for col in ("id", "problem_id", "prompt"):
            if col in schema.names and (not isinstance(r.get(col), str) or not r[col].strip()):
                raise InputError(path, f"would give the row an empty {col}", row=r["_row"])
        if r[key] in seen:
            raise InputError(path, f"would give the {key} {r[key]!r} of row {seen[r[key]]} again", row=r["_row"])
        seen[r[key]] = r["_row"]


def ingest(fmt: str, path: str | Path, out: str | Path, opts: IngestOptions, checker, checker_settings: dict) -> dict:
    """Read ``path`` in format ``fmt`` and write the shard ``out`` with its manifest.

    Returns the manifest. Raises :class:`InputError` on bad input (naming file, row and column) or an OUT
    that would write over an input or a file ingest did not write, and :class:`ConfigError` for an option
    that does not apply to ``fmt`` (:func:`option_conflicts`); nothing is written then.
    """
    path, out = Path(path), Path(out)
    if fmt not in FORMATS:
        raise InputError(path, f"unknown format {fmt!r} (choose {', '.join(FORMATS)})")
    changed = [f.name for f in dataclasses.fields(opts) if getattr(opts, f.name) != f.default]
    conflicts = option_conflicts(fmt, opts, changed)
    if conflicts:
        raise ConfigError(conflicts[0])
    if not path.exists():
        raise InputError(path, "no such file")
    check_output(path, out, opts.answers)
    if out.suffix != ".parquet":
        raise InputError(out, "OUT must be a .parquet file path")
    ing = Ingester(fmt, path, opts, checker)
    try:
        rows, schema = ing.rows()
    except _FormatError as e:
        raise (_with_hint(e, fmt, bytes(ing.head)) if e.path == path else e) from None
    if not rows:
        raise InputError(path, "no records to ingest" + (" after --skip" if opts.skip else ""))
    _check_rows(rows, schema, path)
    source_rows = [r.pop("_row") for r in rows]
    opt_doc = {k: v for k, v in vars(opts).items() if v not in (None, (), {}, "")}
    source = {"path": str(path), "sha256": ing.sha256}
    if ing.answer_files:
        source["answers"] = ing.answer_files
    manifest = {"stage": "ingest", "stepkit_version": __version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "config": {"format": fmt, "options": opt_doc, "grader": checker_settings},
                "input": source, "counts": {"rows": len(rows), **ing.counts}}
    try:
        write_shard(out, rows, schema, manifest, source=path)
    except InputError as e:  # a value that does not fit its column: name the source row, not the output row
        if e.path != path or e.row is None:
            raise
        raise InputError(path, e.detail, row=source_rows[e.row], column=e.column) from None
    except OSError as e:
        raise InputError(out, f"cannot write ({e.strerror or e})") from None
    return manifest
