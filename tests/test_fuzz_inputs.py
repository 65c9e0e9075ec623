"""Property-based fuzzing of every reader of user data (issue 15, item 6), with hypothesis.

Inputs: ``ingest jsonl`` / ``ingest parquet`` files (odd Unicode, NUL, RTL marks, emoji, very long strings,
nulls inside nested lists, numbers/bools/objects where text or lists belong, duplicate ids, missing keys,
empty files, extra columns), and trajectory-like Parquet shards (the right column names with random or
wrong types and values, nulls in lists, duplicate ids, empty step lists) read by mc-label, judge,
likelihood-label, filter, clue score, export and eval processbench / agreement, all with the scripted
engine.

The property, everywhere: the call succeeds and its output is valid (the explicit schema, every input row
accounted for), or it raises a :class:`~stepkit.errors.StepkitError` whose message is one line naming the
file (and the row and column when the fault is in a row); never another exception, and never a file left
behind where none was. Runs are reproducible (``derandomize``) and the whole file takes well under 90 s.
Defects the fuzzing found are kept as plain regression tests beside the properties.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from stepkit.columns_legacy import LEGACY_COLUMNS
from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine, flat_scorer, judge_policy
from stepkit.errors import ConfigError, InputError, StepkitError
from stepkit.grading.steps import split_steps
from stepkit.grading.verify import checker_settings
from stepkit.runner import run_stage
from stepkit.schema import CORE_FIELDS, with_error_column
from stepkit.shards import manifest_path
from stepkit.stages.ingest import TRAJ_SCHEMA_WITH_REFS, IngestOptions, ingest

EXAMPLES = int(os.environ.get("STEPKIT_FUZZ_EXAMPLES", "40"))  # more for a deeper run by hand
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],  # (no slow explain phase)
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])


# ---- strategies: text, JSON values, records with faults put in ------------------------------------------
ODD = ["\x00", "\u202e", "\u200f", "\u2066", "\u200b", "\ufeff", "\u2028", "\u2029", "\r", "\r\n", "\t", "\n",
       "\n\n", "\x0b", "\x0c", "\x85", "\u0301", "\U0001f600", "\U0001f468\u200d\U0001f469", "\ufffd", "\uffff",
       "\U0010ffff", "\u3000", "日本", "عربي", "ки", "####", "Step 1:", "Step 2:", "$$", "```", "\\[", "\\boxed{",
       "}", "{", "<<2*3=6>>", "The answer is 7.", " 12", "-1", "1e309", "NaN", "\\ud800"]
CHARS = st.characters(blacklist_categories=("Cs",))  # lone surrogates cannot be in a UTF-8 file
text = st.lists(st.one_of(st.sampled_from(ODD), st.text(CHARS, max_size=6)), max_size=6).map("".join)
long_text = st.builds(lambda piece, n: (piece or "x") * n, st.text(CHARS, max_size=4), st.integers(3_000, 40_000))
some_text = st.one_of(text, text, text, long_text)
nonblank = st.builds(lambda a, b: f"{a}x{b}", some_text, text)  # odd, perhaps very long, never blank
numbers = st.one_of(st.integers(-3, 20), st.integers(), st.floats(), st.sampled_from([2**63, -2**63 - 1, 10**30]))
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(text, inner, max_size=3)), max_leaves=8)
ids = st.one_of(st.sampled_from(["a", "b", "a ", "", " ", "0"]), st.integers(-1, 3), text)
SPLITS = ["newline", "blank", "step", "auto", r"\s*;\s*", r"(\n)"]
RATINGS = [[-1, 0, 1], [True, False], ["+", "-"], [-1, 0, 1, True, False, "+", "-"]]  # one alphabet per file
GOOD_GOLDS = ["18", "7", "1/2", "\\frac{1}{2}", "-3", "1,000", 5, 2.5, None]
COLUMNS = {"prompt_col": "prompt", "steps_col": "steps", "answer_col": "answer", "reference_col": "ref",
           "id_col": "id", "problem_id_col": "pid", "labels_col": "labels", "first_error_col": "fe"}
EXTRA_KEYS = ["x", "ünï", "", "a\nb", "\u202e"]


@st.composite
def clean_record(draw, i: int, split: str, ratings: list) -> dict:
    """A record ingest must accept: odd Unicode (NUL, RTL, emoji, very long strings) in every text, steps
    as a list or a string, ratings one per step, ids unique; extra keys with any JSON values."""
    steps = draw(st.one_of(st.lists(nonblank, min_size=1, max_size=4), nonblank))
    n = len(steps) if isinstance(steps, list) else len(split_steps(steps, split)[0])
    r = {"prompt": draw(nonblank), "steps": steps, "answer": draw(st.one_of(st.sampled_from(GOOD_GOLDS), text)),
         "ref": draw(st.sampled_from(GOOD_GOLDS)), "id": f"id{i}", "pid": f"p{i % 2}",
         "labels": (draw(st.lists(st.sampled_from(ratings), min_size=min(n, 8), max_size=min(n, 8))) * n)[:n],
         "fe": draw(st.integers(-3, 6)), "generator": draw(st.one_of(st.none(), text))}
    for k in draw(st.lists(st.sampled_from(EXTRA_KEYS), max_size=2, unique=True)):
        r[k] = draw(json_values)
    return r


FAULTS = ["missing", "null", "any JSON value", "blank", "empty list", "null in a list", "blank in a list",
          "duplicate id", "bad gold", "bad rating", "long text"]


@st.composite
def ingest_cases(draw):
    """``(records, options, faults)``: clean records with 0-3 faults put in, ``faults`` the set of
    ``(record index, key)`` they touched."""
    split, ratings = draw(st.sampled_from(SPLITS)), draw(st.sampled_from(RATINGS))
    recs = [draw(clean_record(i, split, ratings)) for i in range(draw(st.integers(0, 6)))]
    faults = set()
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3])) if recs else 0):
        i, k = draw(st.integers(0, len(recs) - 1)), draw(st.sampled_from(list(COLUMNS.values()) + ["generator"]))
        kind, r = draw(st.sampled_from(FAULTS)), recs[i]
        faults |= {(i, k), (i, "labels")} if k == "steps" else {(i, k)}  # (steps changed: no longer the labels')
        if kind == "missing":
            r.pop(k, None)
        elif kind == "null":
            r[k] = None
        elif kind == "any JSON value":
            r[k] = draw(json_values)
        elif kind == "blank":
            r[k] = draw(st.sampled_from(["", " ", "\t\n", "\u3000", "\x85"]))
        elif kind == "empty list":
            r[k] = []
        elif kind in ("null in a list", "blank in a list") and isinstance(r.get(k), list) and r[k]:
            r[k][draw(st.integers(0, len(r[k]) - 1))] = None if kind == "null in a list" else " "
        elif kind == "duplicate id" and i:
            j = draw(st.integers(0, i - 1))
            r["id"], r["pid"] = recs[j].get("id"), recs[j].get("pid")
            faults.add((i, "id"))
        elif kind == "bad gold":
            r["ref"] = draw(st.sampled_from(["", " ", "}", "\\frac{", float("nan"), float("inf"), True, [1]]))
            faults.add((i, "ref"))
        elif kind == "bad rating" and isinstance(r.get("labels"), list):
            r["labels"] = r["labels"] + [draw(st.sampled_from([2, None, "x", 0.5, [1]]))]
            faults.add((i, "labels"))
        elif kind == "long text":
            r[k] = draw(long_text)
    opts = {k: draw(st.sampled_from([None, col, col])) for k, col in COLUMNS.items() if k not in ("prompt_col",
                                                                                                  "steps_col")}
    opts = {"prompt_col": "prompt", "steps_col": "steps", "split": split, **{k: v for k, v in opts.items() if v}}
    if opts.get("labels_col"):
        opts["neutral_as"] = draw(st.sampled_from(["positive", "negative"]))
    misspelt = draw(st.sampled_from([None] * 16 + list(COLUMNS)))
    if misspelt:
        opts[misspelt] = "gold"
    opts.update(draw(st.one_of(st.just({}), st.just({}), st.fixed_dictionaries({}, optional={
        "limit": st.integers(1, 4), "skip": st.integers(0, 2), "sample": st.integers(1, 3)}))))
    return recs, opts, faults


def values_of(t: pa.DataType, size: int = 4):
    """Values (with nulls) that fit the Arrow type ``t``."""
    if pa.types.is_dictionary(t):
        return values_of(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return st.one_of(st.none(), some_text, ids.map(str))
    if pa.types.is_boolean(t):
        return st.one_of(st.none(), st.booleans())
    if pa.types.is_integer(t):
        bits = t.bit_width - 1
        return st.one_of(st.none(), st.integers(-2, 6), st.integers(-2**bits, 2**bits - 1))
    if pa.types.is_floating(t):
        return st.one_of(st.none(), st.floats(width=32 if t == pa.float32() else 64), st.sampled_from([0.0, 0.5, 1.0]))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return st.one_of(st.none(), st.lists(values_of(t.value_type), max_size=size))
    if pa.types.is_struct(t):
        return st.one_of(st.none(), st.fixed_dictionaries({f.name: values_of(f.type) for f in t}))
    if pa.types.is_binary(t):
        return st.one_of(st.none(), st.binary(max_size=8))
    return st.none()


S, I32, F32, B = pa.string(), pa.int32(), pa.float32(), pa.bool_()
WRONG_TYPES = [S, pa.large_string(), pa.dictionary(pa.int32(), S), pa.int64(), pa.float64(), B, pa.null(),
               pa.binary(), pa.list_(S), pa.large_list(S), pa.list_(pa.int64()), pa.list_(B), pa.list_(pa.float64()),
               pa.list_(pa.null()), pa.list_(pa.list_(S)), pa.struct([("a", S)])]
TRAJ_COLUMNS = {  # the columns of a trajectory shard after some stages, with their right types
    "id": S, "problem_id": S, "source": S, "prompt": S, "reference_answer": S, "steps": pa.list_(S),
    "step_separator": S, "final_answer": S, "outcome_correct": B, "generator": S, "error": S,
    "reference_first_error": I32, "mc_label": pa.list_(B), "mc_value": pa.list_(F32), "mc_first_error": I32,
    "mc_status": S, "judge_label": pa.list_(B), "filter_reason": S, "filter_kept_steps": I32,
    "filter_steps_before": I32,
}
PER_STEP = ("mc_label", "mc_value", "judge_label")
FIRST_ERRORS = ("reference_first_error", "mc_first_error")
CLUE_LISTS = ("clue_texts", "clue_values", "clue_depends")
LINKED = {"steps": PER_STEP + FIRST_ERRORS + ("filter_kept_steps",), **{c: CLUE_LISTS for c in CLUE_LISTS},
          **{c: PER_STEP + FIRST_ERRORS for c in ("filter_kept_steps", "filter_steps_before")}}
"""A bad cell in the key column makes the columns checked against it wrong too (labels for the steps)."""


@st.composite
def clean_row(draw, i: int) -> dict:
    """A trajectory row every stage reads: unique id, odd but non-blank prompt and steps, per-step columns
    one entry per step (nulls allowed), first errors in -1..M-1, a few upstream errors."""
    n = draw(st.integers(1, 4))
    per_step = {"mc_label": B, "mc_value": F32, "judge_label": B}
    r = {"id": f"r{i}", "problem_id": f"p{i % 2}", "source": draw(st.sampled_from(
        [None, f"processbench/gsm8k/{i}", f"processbench/math/{i}", "x"])), "prompt": draw(nonblank),
         "reference_answer": draw(st.sampled_from(GOOD_GOLDS[:6] + [None])), "steps": draw(
            st.lists(nonblank, min_size=n, max_size=n)), "step_separator": draw(st.sampled_from(["\n", "\n\n", " "])),
         "final_answer": draw(st.one_of(st.none(), text)), "outcome_correct": draw(st.one_of(st.none(), st.booleans())),
         "generator": draw(st.one_of(st.none(), text)),
         "error": draw(st.sampled_from([None] * 5 + ["rollout: engine: boom"])),
         "mc_status": draw(st.sampled_from(["ok", "ok", "no_signal", None])), "filter_reason": None,
         "filter_kept_steps": draw(st.sampled_from([None, None, n, max(1, n - 1)]))}
    r["filter_steps_before"] = None if r["filter_kept_steps"] is None else n  # (as a --flag-only filter writes)
    for c in FIRST_ERRORS:
        r[c] = draw(st.one_of(st.none(), st.integers(-1, n - 1)))
    for c, t in per_step.items():
        cell = st.lists(st.booleans() if t == B else st.floats(0, 1, width=32), min_size=n, max_size=n)
        r[c] = draw(st.one_of(st.none(), cell, cell, cell))
    return r


def _cell_fault(draw, r: dict, col: str, t: pa.DataType, rows: list[dict], i: int):
    """A bad value for ``r[col]``: null, blank, empty or wrong-length lists, nulls in lists, out-of-range
    indices, NaN, a repeated id, very long text."""
    n = len(r["steps"]) if isinstance(r.get("steps"), list) else 1
    choices = [None, draw(long_text)]
    if col in ("id", "prompt", "problem_id", "step_separator", "reference_answer"):
        choices += ["", " ", "\u3000", "}"] + ([rows[draw(st.integers(0, i - 1))][col]] if i else [])
    if col == "steps" and isinstance(r["steps"], list):
        choices += [[], [None], [" "] + r["steps"], r["steps"] + [""]]
    if col in PER_STEP and isinstance(r[col], list) and r[col]:
        choices += [r[col][:-1], r[col] + r[col][:1], [None] * n]
        if col == "mc_value":
            choices += [[float("nan")] * n, [float("inf")] + r[col][1:]]
    if col in FIRST_ERRORS or col in ("filter_kept_steps", "filter_steps_before"):
        choices += [-2, n, 2**31 - 1, -2**31, 0]
    if col in ("error", "filter_reason", "mc_status", "clue_status"):
        choices += ["", "x", "ok"]
    if col.startswith("clue_") and isinstance(r.get(col), list):
        choices += [[], r[col] + r[col][:1], [None] * len(r[col])]
        if col == "clue_values":
            choices += [["abc"] * len(r[col])]
        if col == "clue_depends":
            choices += [[[k + 1] for k in range(len(r[col]))], [[-1]] * len(r[col])]
    return draw(st.sampled_from([v for v in choices if _fits(v, t)]))


def _fits(value, t: pa.DataType) -> bool:
    if isinstance(value, str) and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return False  # (Arrow reads a string as a list of its characters)
    try:
        pa.array([value], type=t)
    except (pa.ArrowException, OverflowError):
        return False
    return True


@st.composite
def clean_clue_row(draw, i: int) -> dict:
    """A ``clue recover`` row of problem ``p<i>``: clue texts, numbers as text (or null) and earlier
    dependencies of one length."""
    n = draw(st.integers(1, 3))
    return {"problem_id": f"p{i}", "clue_texts": draw(st.lists(nonblank, min_size=n, max_size=n)),
            "clue_values": draw(st.lists(st.sampled_from([None, "18", "1/2", "-3", "0.5"]), min_size=n, max_size=n)),
            "clue_depends": [draw(st.lists(st.integers(0, k - 1), max_size=k)) if k else [] for k in range(n)],
            "clue_status": draw(st.sampled_from(["ok", "ok", "parse_failure", "no_reference"])),
            "error": draw(st.sampled_from([None] * 5 + ["clue-recover: engine: boom"]))}


CLUE_COLUMNS = {"problem_id": S, "clue_texts": pa.list_(S), "clue_values": pa.list_(S),
                "clue_depends": pa.list_(pa.list_(I32)), "clue_status": S, "error": S}


@st.composite
def trajectory_cases(draw, columns: dict[str, pa.DataType] = TRAJ_COLUMNS, row=clean_row, sizes=(0, 5)):
    """``(table, faults)``: clean rows (``row(i)``, as many as ``sizes`` allows) with 0-3 faults put in;
    ``faults`` holds ``(row, column)`` for a bad cell and ``(None, column)`` for a column that is missing
    or of a wrong type (random values of that type). Extra columns of any type come along."""
    rows = [draw(row(i)) for i in range(draw(st.integers(*sizes)))]
    faults: set[tuple[int | None, str]] = set()
    types = dict(columns)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        col = draw(st.sampled_from(list(columns)))
        kind = draw(st.sampled_from(["cell", "cell", "type", "type", "missing"] if rows else ["type", "missing"]))
        if kind == "cell":
            i = draw(st.integers(0, len(rows) - 1))
            rows[i][col] = _cell_fault(draw, rows[i], col, columns[col], rows, i)
            faults |= {(i, col)} | {(i, c) for c in LINKED.get(col, ())}  # (columns checked against it)
        elif kind == "missing":
            types.pop(col, None)
        else:
            types[col] = draw(st.sampled_from([t for t in WRONG_TYPES if t != columns[col]]))
        if kind != "cell":
            faults |= {(None, col)} | {(None, c) for c in LINKED.get(col, ())}
    cols = {}
    for col, t in types.items():
        if t == columns[col]:
            vals = [r[col] for r in rows]
        else:
            vals = draw(st.lists(values_of(t), min_size=len(rows), max_size=len(rows)))
        cols[col] = pa.array(vals, type=t)
    for name in draw(st.lists(st.sampled_from(EXTRA_KEYS), max_size=2, unique=True)):  # another tool's columns
        t = draw(st.sampled_from(WRONG_TYPES))
        cols[name] = pa.array(draw(st.lists(values_of(t), min_size=len(rows), max_size=len(rows))), type=t)
    table = pa.table(cols) if cols else pa.table({"x": pa.array([None] * len(rows), pa.null())})
    return table, faults


# ---- the property's checks ------------------------------------------------------------------------------
@contextmanager
def workdir():
    with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
        yield Path(d)


def listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def check_error(e: BaseException, files: list[Path]) -> None:
    """``e`` is a StepkitError of one line that names one of ``files`` (or, for a configuration error, the
    option)."""
    assert isinstance(e, StepkitError), f"{type(e).__name__}: {e}"
    msg = str(e)
    assert len(msg.splitlines()) == 1, f"not one line: {msg!r}"
    if isinstance(e, ConfigError) and msg.startswith("--"):
        return  # an option that does not fit the data (a --rule value no row has): named by its flag
    assert any(str(f) in msg for f in files), f"names none of {files}: {msg!r}"


def check_nothing_left(folder: Path, before: set[str]) -> None:
    left = listing(folder) - before
    assert not left, f"left behind: {sorted(left)}"


# ---- 1. ingest jsonl / parquet ----------------------------------------------------------------------------
def check_ingest(fmt, src: Path, opts: dict, checker, lines: list[int], faults: set[tuple[int, str]],
                 keys: set[str], bad_rows: frozenset[int] = frozenset()) -> pa.Table | None:
    """Run ingest on ``src`` (records at the row indices ``lines``, ``faults`` put in at ``(record, key)``,
    rows ``bad_rows`` not records at all) and check the property: clean records are ingested, one output
    row each; a fault is refused in one line naming the file, and the row and column of a fault; nothing
    is left behind. The table, or None."""
    out = src.with_name("out.parquet")
    before = listing(src.parent)
    take = lines[opts.get("skip", 0):][:opts.get("limit", len(lines))]
    try:
        m = ingest(fmt, src, out, IngestOptions(**opts), checker, checker_settings())
    except StepkitError as e:
        event(f"{type(e).__name__}: {getattr(e, 'detail', str(e))[:30]}")
        check_error(e, [src, out])
        assert faults or bad_rows or not take or "gold" in opts.values(), f"clean input refused: {e}"
        if isinstance(e, InputError) and e.row is not None:  # a fault in a row: that row, that column
            cells = {(lines[i], k) for i, k in faults} | {(lines[i], None) for i, _ in faults}
            assert (e.row, e.column) in cells or e.row in bad_rows, f"names a row or column without a fault: {e}"
        elif isinstance(e, InputError) and e.column is not None:  # a fault of the file: a column it lacks
            assert e.column in {v for k, v in opts.items() if k.endswith("_col")} - keys, str(e)
        check_nothing_left(src.parent, before)
        return None
    event("ingested")
    table = pq.read_table(out)
    assert table.schema.remove_metadata() == TRAJ_SCHEMA_WITH_REFS
    rows = table.to_pylist()
    assert len(rows) == min(len(take), opts.get("sample", len(take))) == m["counts"]["rows"]
    sources = [r["source"] for r in rows]
    assert len(set(sources)) == len(sources) and {int(s.rsplit("/", 1)[1]) for s in sources} <= set(take)
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["prompt"].strip() and r["id"].strip() and r["problem_id"].strip()
        assert r["steps"] and all(s.strip() for s in r["steps"])
        if r["reference_labels"] is not None:
            assert len(r["reference_labels"]) == len(r["steps"])
    return table


GARBAGE = st.one_of(st.sampled_from([b'{"prompt": "Q", "steps": ["a"]', b"[1, 2]", b'"text"', b"null", b"\xff\xfe{}",
                                     b"{'prompt': 1}", b'{"prompt": "\\ud800", "steps": ["a"]}', b"\x00", b"{} {}"]),
                    st.binary(min_size=1, max_size=24).map(lambda b: b.replace(b"\n", b" ")))


@FUZZ
@given(case=ingest_cases(), ascii_only=st.booleans(), blank=st.sampled_from(["", "", "\n", "  \r\n"]),
       garbage=st.one_of(st.none(), st.none(), st.tuples(st.integers(0, 6), GARBAGE)))
def test_ingest_jsonl_fuzz(checker, case, ascii_only, blank, garbage):
    """JSON Lines with faulted records, blank lines between them, and now and then a line that is no JSON
    object at all (bad syntax, a list, invalid UTF-8, a lone surrogate, NUL, random bytes)."""
    recs, opts, faults = case
    lines = [(json.dumps(r, ensure_ascii=ascii_only) + "\n" + blank).encode() for r in recs]
    bad_rows = set()
    if garbage is not None:
        k, junk = min(garbage[0], len(recs)), garbage[1]
        lines.insert(k, junk + b"\n")
        bad_rows = {sum(1 + bool(blank) for _ in recs[:k])} if junk.strip() else set()
    rows, at = [], 0  # the row index of each record (a blank line has a row index too)
    for i, line in enumerate(lines):
        if garbage is None or i != min(garbage[0], len(recs)):
            rows.append(at)
        at += line.count(b"\n")
    with workdir() as d:
        src = d / "in.jsonl"
        src.write_bytes(b"".join(lines))
        check_ingest("jsonl", src, opts, checker, rows, faults, {k for r in recs for k in r}, frozenset(bad_rows))


def parquet_columns(recs: list[dict]) -> tuple[dict[str, pa.Array], set[str]]:
    """The records as Parquet columns (a missing key is null): typed by Arrow where it can, else the
    values as JSON text (a wrong type for the whole column); the names of those."""
    cols, as_text = {}, set()
    for k in dict.fromkeys(k for r in recs for k in r):
        vals = [r.get(k) for r in recs]
        try:
            cols[k] = pa.array(vals)
            pq.write_table(pa.table({k: cols[k]}), pa.BufferOutputStream())
        except (pa.ArrowException, OverflowError):
            cols[k] = pa.array([None if v is None else json.dumps(v) for v in vals], pa.string())
            as_text.add(k)
    return cols, as_text


@FUZZ
@given(case=ingest_cases())
def test_ingest_parquet_fuzz(checker, case):
    recs, opts, faults = case
    with workdir() as d:
        src = d / "in.parquet"
        cols, as_text = parquet_columns(recs)
        pq.write_table(pa.table(cols) if cols else pa.table({"x": pa.array([], pa.null())}), src)
        faults |= {(i, k) for k in as_text | ({"labels"} if "steps" in as_text else set()) for i in range(len(recs))}
        faults |= {(i, k) for i, r in enumerate(recs) for k in cols if k not in r}  # (null in Parquet)
        check_ingest("parquet", src, opts, checker, list(range(len(recs))), faults, set(cols))


INGEST_TRAJECTORY = st.fixed_dictionaries({
    "prompt_col": st.just("prompt"), "steps_col": st.just("steps"),
    "reference_col": st.sampled_from([None, "reference_answer"]), "answer_col": st.sampled_from([None, "final_answer"]),
    "id_col": st.sampled_from([None, "id"]), "problem_id_col": st.sampled_from([None, "problem_id"]),
    "labels_col": st.sampled_from([None, "mc_label", "mc_value"]),
    "first_error_col": st.sampled_from([None, "reference_first_error"])}).map(
    lambda o: {k: v for k, v in o.items() if v is not None})


@FUZZ
@given(case=trajectory_cases(), opts=INGEST_TRAJECTORY)
def test_ingest_typed_parquet_fuzz(checker, case, opts):
    """Parquet with trajectory columns of every Arrow type (lists of lists, structs, dictionaries, binary,
    null) as ingest parquet input (any cell may be the fault: nulls are bad input for some options)."""
    table, _ = case
    with workdir() as d:
        src = d / "in.parquet"
        pq.write_table(table, src)
        check_ingest("parquet", src, opts, checker, list(range(table.num_rows)),
                     {(i, k) for i in range(table.num_rows) for k in table.column_names}, set(table.column_names))


# ---- 2. the readers of every stage ------------------------------------------------------------------------
class SharedChecker:
    """The session's answer checker for a stage, which must not close it."""

    def __init__(self, checker):
        self.checker = checker

    def __getattr__(self, name):
        return getattr(self.checker, name)

    def close(self):
        pass


SAMPLING = SamplingConfig(temperature=0, max_tokens=8)


def mc_stage(checker):
    from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage

    return MCLabelStage(MCLabelConfig(continuations=1), EngineSpec.of(ScriptedEngine()), SAMPLING,
                        lambda: SharedChecker(checker))


def judge_stage(checker):
    from stepkit.stages.judge import JudgeConfig, JudgeStage

    return JudgeStage(JudgeConfig(), EngineSpec.of(ScriptedEngine(judge_policy, "scripted:judge")), SAMPLING)


def likelihood_stage(checker):
    from stepkit.stages.likelihood import LikelihoodConfig, LikelihoodStage

    # (the flat scorer: the values do not matter here, only what the stage reads)
    return LikelihoodStage(LikelihoodConfig(threshold=-1.0), EngineSpec.of(ScriptedEngine(scorer=flat_scorer)),
                           SAMPLING)


STAGES = {"mc-label": mc_stage, "judge": judge_stage, "likelihood-label": likelihood_stage}


def check_failure(e: BaseException, src: Path, faults: set, files: list[Path], clean_ok=()) -> None:
    """An error of a stage reading ``src`` (with ``faults``, see :func:`trajectory_cases`): one line naming
    a file; an InputError about ``src`` names a faulted row and column, or a missing or mistyped column.
    Clean input is refused only with a message in ``clean_ok`` (a rule that matches no row...)."""
    event(f"{type(e).__name__}: {getattr(e, 'detail', str(e))[:30]}")
    check_error(e, files)
    if not faults:
        assert any(why in str(e) for why in clean_ok), f"clean input refused: {e}"
    if isinstance(e, InputError) and Path(e.path) == src and faults:
        bad_columns = {c for r, c in faults if r is None}
        if e.row is None:
            assert e.column is None or e.column in bad_columns, f"names a column without a fault: {e}"
        else:
            assert e.column in bad_columns or (e.row, e.column) in faults or (
                e.column is None and e.row in {r for r, _ in faults}), f"names a row or column without a fault: {e}"


def check_stage(stage, src: Path, out: Path, faults: set, side_outputs=(), side_inputs=(), one_to_one=True,
                clean_ok=()):
    """Run ``stage`` on ``src``; check the property. The output table, or None."""
    before = listing(src.parent)
    table = pq.read_table(src)
    try:
        run_stage(stage, src, out, progress=False, max_error_rate=1.0)
    except StepkitError as e:
        check_failure(e, src, faults, [src, out, *side_outputs, *side_inputs], clean_ok)
        check_nothing_left(src.parent, before)
        return None
    event("done")
    got = pq.read_table(out)
    assert got.schema.remove_metadata() == with_error_column(stage.output_schema(table.schema)).remove_metadata()
    key = "id" if "id" in table.column_names else "prompt"
    sides = [pq.read_table(p) for p in side_outputs]
    if one_to_one:
        assert got.column(key).to_pylist() == table.column(key).to_pylist()
    else:  # every input row is kept or in a side output (filter's dropped rows)
        assert sorted(map(repr, got.column(key).to_pylist() + [x for s in sides for x in s.column(key).to_pylist()])
                      ) == sorted(map(repr, table.column(key).to_pylist()))
    assert json.loads(manifest_path(out).read_text())["counts"]["rows"] == got.num_rows
    assert not out.with_name(out.name + ".parts").exists()
    return got


@pytest.mark.parametrize("name", list(STAGES))
@FUZZ
@given(case=trajectory_cases())
def test_labeller_readers_fuzz(checker, name, case):
    table, faults = case
    with workdir() as d:
        src = d / "in.parquet"
        pq.write_table(table, src)
        check_stage(STAGES[name](checker), src, d / "out.parquet", faults)


FILTER_RULES = ["dedupe", "no-error", "steps:1-3", "status:mc_status=ok", "status:outcome_correct!=false",
                "min-value:mc_value>=0.5", "max-value:reference_first_error<2", "consensus:mc_first_error,mc_label",
                "consensus:reference_first_error,judge_label", "truncate-after-first-error:mc_label",
                "keep-correct-steps:mc_first_error", "prof:mc_value"]


@FUZZ
@given(case=trajectory_cases(), rules=st.lists(st.sampled_from(FILTER_RULES), min_size=1, max_size=3, unique=True),
       flag_only=st.booleans())
def test_filter_reader_fuzz(case, rules, flag_only):
    from stepkit.stages.filter import FilterConfig, FilterStage

    table, faults = case
    with workdir() as d:
        src, out, dropped = d / "in.parquet", d / "out.parquet", d / "dropped.parquet"
        pq.write_table(table, src)
        stage = FilterStage(FilterConfig(rule=tuple(rules), flag_only=flag_only, remove=1,
                                         dropped=None if flag_only else str(dropped)))
        got = check_stage(stage, src, out, faults, side_outputs=[] if flag_only else [dropped], one_to_one=flag_only,
                          clean_ok=["so it would drop every row"])
        for r in got.to_pylist() if got is not None else []:
            assert r["steps"] and 1 <= r["filter_kept_steps"] <= len(r["steps"]) <= r["filter_steps_before"]
            for c in PER_STEP if not flag_only else ():  # per-step columns cut with the steps
                if r.get(c) is not None:
                    assert len(r[c]) == len(r["steps"])


@FUZZ
@given(case=trajectory_cases(), clues=trajectory_cases(CLUE_COLUMNS, clean_clue_row, (2, 3)))
def test_clue_score_readers_fuzz(checker, case, clues):
    from stepkit.stages.clue import ClueScoreConfig, ClueScoreStage

    (table, faults), (side_table, side_faults) = case, clues
    with workdir() as d:
        src, side = d / "in.parquet", d / "clues.parquet"
        pq.write_table(table, src)
        pq.write_table(side_table, side)
        stage = ClueScoreStage(ClueScoreConfig(clues=str(side)), None, None, lambda: SharedChecker(checker))
        # (a fault of the clue shard can leave a row of IN without its clue row: named by its problem_id)
        faults = faults | ({(i, "problem_id") for i in range(table.num_rows)} if side_faults else set())
        before = listing(d)
        try:
            run_stage(stage, src, d / "out.parquet", progress=False, max_error_rate=1.0)
        except StepkitError as e:
            if isinstance(e, InputError) and Path(e.path) == side:
                check_failure(e, side, side_faults, [side])
            else:
                check_failure(e, src, faults, [src, side, d / "out.parquet"])
            check_nothing_left(d, before)
            return
        event("done")
        got = pq.read_table(d / "out.parquet")
        assert got.column("id").to_pylist() == table.column("id").to_pylist()
        assert got.schema.remove_metadata() == with_error_column(stage.output_schema(table.schema)).remove_metadata()


EXPORTS = [("trl", "mc_label"), ("trl", "mc_value"), ("trl", "mc_first_error"), ("math-shepherd", "judge_label"),
           ("processbench", "mc_first_error"), ("processbench", "mc_label")]
EXPORT_CLEAN_OK = ["split would have no rows", "steps were cut by filter rule", "nothing left to train on",
                   "Math-Shepherd's step tag", "Math-Shepherd's first step marker", "cannot tell GSM8K from MATH",
                   "step separators disagree", "holds the step separator"]


@settings(FUZZ, max_examples=max(1, EXAMPLES * 5 // 8))
@given(case=trajectory_cases(), which=st.sampled_from(EXPORTS), test_size=st.sampled_from([None, None, 0.5]))
def test_export_reader_fuzz(case, which, test_size):
    from stepkit.stages.export import ExportConfig, export, read_export_manifest

    (table, faults), (fmt, labels) = case, which
    with workdir() as d:
        src, out = d / "in.parquet", d / "dataset"
        pq.write_table(table, src)
        before = listing(d)
        try:
            m = export(src, out, ExportConfig(format=fmt, labels=labels, test_size=test_size))
        except StepkitError as e:
            if not any(why in str(e) for why in EXPORT_CLEAN_OK):
                check_failure(e, src, faults, [src, out])
            check_nothing_left(d, before)
            return
        event("exported")
        c = m["counts"]
        assert c["rows_in"] == table.num_rows == c["rows_out"] + c["null_labels"] + c["filtered"]
        assert read_export_manifest(out) is not None
        assert sum(s["rows"] for s in m["splits"].values()) == c["rows_out"]
        for s in m["splits"].values():
            for f in s["files"]:
                part = pq.read_table(out / f)
                if fmt == "trl":
                    assert all(len(r["labels"]) == len(r["completions"]) for r in part.to_pylist())


EVAL_CLEAN_OK = ["no row has a gold first-error label", "expected a first-error index (int) or step labels"]


@FUZZ
@given(case=trajectory_cases(), pred=st.sampled_from(["mc_first_error", "mc_label", "judge_label", "mc_value"]))
def test_eval_readers_fuzz(case, pred):
    from stepkit.stages.evaluate import agreement_report, processbench_report

    table, faults = case
    with workdir() as d:
        src = d / "in.parquet"
        pq.write_table(table, src)
        for report in (lambda: processbench_report(src, pred), lambda: agreement_report(src, pred, "mc_first_error")):
            try:
                doc = report()
            except StepkitError as e:
                if not any(why in str(e) for why in EVAL_CLEAN_OK):
                    check_failure(e, src, faults, [src])
                continue
            event("reported")
            json.dumps(doc)  # the --json report
            if "splits" in doc:
                assert sum(s["rows"] for s in doc["splits"].values()) + doc["no_gold"] == table.num_rows
            else:
                assert doc["rows"] == table.num_rows


def _damage(data: bytes, how: str, at: float, byte: int) -> bytes:
    k = min(int(at * len(data)), len(data) - 1)
    if how == "cut":
        return data[:k]
    if how == "flip":
        return data[:k] + bytes([data[k] ^ (byte or 1)]) + data[k + 1:]
    return data[:k] + bytes(min(64, len(data) - k)) + data[k + 64:]  # a run of zero bytes


READERS = ["ingest parquet", "mc-label", "judge", "filter", "export", "eval"]


@FUZZ
@given(case=trajectory_cases(), how=st.sampled_from(["cut", "flip", "zero"]), at=st.floats(0, 1), byte=st.integers(0, 255),
       reader=st.sampled_from(READERS))
def test_damaged_shard_fuzz(checker, case, how, at, byte, reader):
    """A shard cut short or with bytes changed (footer, page headers, data pages): read as it is, or one
    error line naming it; never a traceback, nothing left behind."""
    table, _ = case
    with workdir() as d:
        src = d / "in.parquet"
        pq.write_table(table, src, compression=["snappy", "none"][byte % 2])
        src.write_bytes(_damage(src.read_bytes(), how, at, byte))
        before = listing(d)
        out = d / "out.parquet"
        run = {"ingest parquet": lambda: ingest("parquet", src, out, IngestOptions(), checker, checker_settings()),
               "mc-label": lambda: run_stage(mc_stage(checker), src, out, progress=False, max_error_rate=1.0),
               "judge": lambda: run_stage(judge_stage(checker), src, out, progress=False, max_error_rate=1.0),
               "filter": lambda: _filter(src, "dedupe", flag_only=False),
               "export": lambda: _export(src), "eval": lambda: _eval(src)}[reader]
        try:
            run()
        except StepkitError as e:
            event(f"{type(e).__name__}: {getattr(e, 'detail', str(e))[:30]}")
            check_error(e, [src, out, d / "dataset"])
            check_nothing_left(d, before)
            return
        event("read")


# ---- regressions: the defects the fuzzing found, one plain test each ----------------------------------------
def test_a_column_name_with_a_line_break_stays_on_one_line(tmp_path, checker):
    """Before: ``its columns: prompt, steps, a`` and ``b)`` on a second line (a key quoted as it is)."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "Q", "steps": ["x = 1."], "a\nb": 1, "c\u2028d": 2}) + "\n")
    with pytest.raises(InputError) as e:
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(prompt_col="question"), checker, checker_settings())
    assert str(e.value) == (f"{src}: column 'question': --prompt-col names no column of the file (its columns: "
                            "prompt, steps, a\\nb, c\\u2028d)")
    assert str(InputError("f.parquet", "bad\r\nvalue", row=2, column="x\ny")) == \
        "f.parquet: row 2, column 'x\\ny': bad\\r\\nvalue"


def _shard(tmp_path, name="in.parquet", n=2, **columns) -> Path:
    """Two labelled trajectory rows, with ``columns`` replaced or added."""
    cols = {"id": [f"r{i}" for i in range(n)], "problem_id": [f"p{i}" for i in range(n)], "prompt": ["What is 6+12?"] * n,
            "reference_answer": ["18"] * n, "steps": [["6 + 12 = 18.", "The answer is 18."]] * n,
            "outcome_correct": [True, False][:n], "reference_first_error": pa.array([-1, 1][:n], I32),
            "mc_label": [[True, True], [True, False]][:n], "source": [f"processbench/gsm8k/{i}" for i in range(n)]}
    pq.write_table(pa.table({**cols, **columns}), tmp_path / name)
    return tmp_path / name


def _filter(src, *rules, flag_only=True):
    from stepkit.stages.filter import FilterConfig, FilterStage

    dropped = None if flag_only else str(src.with_name("dropped.parquet"))
    run_stage(FilterStage(FilterConfig(rule=rules, flag_only=flag_only, dropped=dropped)), src,
              src.with_name("out.parquet"), progress=False)


def _export(src, fmt="trl"):
    from stepkit.stages.export import ExportConfig, export

    export(src, src.with_name("dataset"), ExportConfig(format=fmt, labels="mc_label"))


def _eval(src):
    from stepkit.stages.evaluate import processbench_report

    processbench_report(src, "mc_label")


# (reader, column, its wrong type, what happened before)
WRONGLY_TYPED = [
    ("filter", "mc_label", pa.array([3, 4]), "TypeError: object of type 'int' has no len()"),
    ("filter --dropped", "filter_reason", pa.array([["x"], ["y"]]), "filter: internal error, its dropped output ..."),
    ("filter", "filter_kept_steps", pa.array(["1", "2"]), "TypeError: '<' not supported"),
    ("export", "filter_kept_steps", pa.array(["1", "2"]), "TypeError: '>=' not supported"),
    ("export", "mc_status", pa.array([["ok"], ["ok"]]), "TypeError: unhashable type: 'list'"),
    ("export math-shepherd", "source", pa.array([1, 2]), "AttributeError: 'int' object has no attribute 'lower'"),
    ("export processbench", "generator", pa.array([1, 2]), "ArrowTypeError: Expected bytes, got a 'int' object"),
    ("eval", "steps", pa.array(["ab", "cd"]), "the characters of the text counted as steps"),
    ("eval", "id", pa.array([["a"], ["b"]]), "TypeError: unhashable type: 'list'"),
    ("eval", "source", pa.array([1, 2]), "AttributeError: 'int' object has no attribute 'split'"),
    ("mc-label", "step_separator", pa.array([1, 2]), "AttributeError: 'int' object has no attribute 'join'"),
]


@pytest.mark.parametrize("reader, column, values, before", WRONGLY_TYPED, ids=[f"{r}-{c}" for r, c, *_ in WRONGLY_TYPED])
def test_a_stepkit_column_of_another_type_is_one_error_line(tmp_path, checker, reader, column, values, before):
    src = _shard(tmp_path, **{column: values})
    run = {"filter": lambda: _filter(src, "dedupe"), "filter --dropped": lambda: _filter(src, "dedupe", flag_only=False),
           "export": lambda: _export(src), "export math-shepherd": lambda: _export(src, "math-shepherd"),
           "export processbench": lambda: _export(src, "processbench"), "eval": lambda: _eval(src),
           "mc-label": lambda: run_stage(mc_stage(checker), src, tmp_path / "lab.parquet", progress=False)}[reader]
    before_files = listing(tmp_path)
    with pytest.raises(InputError) as e:
        run()
    assert str(e.value) == f"{src}: column '{column}': expected type {CORE_FIELDS.get(column) or LEGACY_COLUMNS[column][0]}, found " \
                           f"{pq.read_schema(src).field(column).type}"
    check_nothing_left(tmp_path, before_files)


def test_a_per_step_column_that_is_no_list_is_one_error_line(tmp_path):
    src = _shard(tmp_path, clue_label=pa.array(["TF", "TT"]))  # (a string's characters are no step labels)
    with pytest.raises(InputError, match=r"column 'clue_label': expected type list<item: bool>, found string"):
        _filter(src, "dedupe")


@pytest.mark.parametrize("kept", [-1, 0, 3])
def test_kept_steps_outside_the_steps_are_bad_input(tmp_path, kept):
    """Before: filter and export cut the steps to ``steps[:-1]`` (or to none) without a word."""
    src = _shard(tmp_path, filter_kept_steps=pa.array([kept, 2], I32))
    for run in (lambda: _filter(src, "steps:1-5", flag_only=False), lambda: _export(src)):
        with pytest.raises(InputError, match=rf"^{src}: row 0, column 'filter_kept_steps': {kept} kept steps of 2 "
                                             r"\(expected 1..2\)$"):
            run()
    assert not src.with_name("out.parquet").exists() and not src.with_name("dataset").exists()


def test_steps_before_filtering_fewer_than_the_steps_are_bad_input(tmp_path):
    """Before: filter carried ``filter_steps_before`` -2 over to a row of 2 steps (found by the fuzz)."""
    src = _shard(tmp_path, filter_steps_before=pa.array([-2, 2], I32))
    for flag_only in (True, False):
        with pytest.raises(InputError, match=rf"^{src}: row 0, column 'filter_steps_before': -2 steps before "
                                             r"filtering, but the row has 2$"):
            _filter(src, "dedupe", flag_only=flag_only)


def test_a_status_typo_leaves_nothing_behind(tmp_path):
    """Before: the typo check ran in the first chunk, after the parts folder was made (found by the fuzz)."""
    src = _shard(tmp_path, mc_status=pa.array(["no_signal", "no_signal"]))
    before = listing(tmp_path)
    with pytest.raises(ConfigError, match=r"no input row has mc_status ok, so it would drop every row \(present: "
                                          r"no_signal \(2 rows\)\); every row is no_signal, which mc_status uses for a row with no labels"):
        _filter(src, "status:mc_status=ok", flag_only=False)
    check_nothing_left(tmp_path, before)


def test_a_status_rule_on_a_nested_column_is_one_error_line(tmp_path):
    src = _shard(tmp_path, my_status=pa.array([{"a": "x"}, {"a": "y"}]))  # before: TypeError: unhashable 'dict'
    with pytest.raises(InputError, match=r"column 'my_status': --rule 'status:my_status=x' compares a whole cell, "
                                         r"found a nested column struct<a: string>"):
        _filter(src, "status:my_status=x")


def test_clue_score_reads_a_prompt_with_a_number_too_long_for_python(tmp_path, checker):
    """Before: ValueError "Exceeds the limit (4300 digits) for integer string conversion" from the problem's
    numbers. A number Python will not convert is no number a step can state."""
    from stepkit.grading.clues import problem_numbers
    from stepkit.stages.clue import ClueScoreConfig, ClueScoreStage

    assert problem_numbers(f"Tom has 3 apples and {'7' * 5000} pears.") == {3}
    src = _shard(tmp_path, n=1, prompt=[f"Tom has 3 apples and {'7' * 5000} pears. How many?"],
                 steps=[["3 + 12 = 15.", "The answer is 15."]])
    clues = tmp_path / "clues.parquet"
    pq.write_table(pa.table({"problem_id": ["p0"], "clue_texts": [["3 + 15 = 18", "The answer is 18"]],
                             "clue_values": [["18", "18"]], "clue_depends": pa.array([[[], [0]]], pa.list_(pa.list_(I32))),
                             "clue_status": ["ok"], "error": pa.array([None], S)}), clues)
    stage = ClueScoreStage(ClueScoreConfig(clues=str(clues)), None, None, lambda: SharedChecker(checker))
    run_stage(stage, src, tmp_path / "scored.parquet", progress=False)
    (row,) = pq.read_table(tmp_path / "scored.parquet").to_pylist()
    assert row["clue_status"] == "ok" and row["error"] is None and len(row["clue_score"]) == 2


def _damaged_text_shards(tmp_path) -> tuple[Path, Path]:
    """A shard whose ``generator`` text is not UTF-8 (a damaged data page; planning reads no such column)
    and one whose footer names a column in bytes that are not UTF-8."""
    t = pa.table({"id": ["r0", "r1"], "prompt": ["What is 6+12?"] * 2, "steps": [["6 + 12 = 18."]] * 2,
                  "generator": ["MARKER-0", "MARKER-1"], "mc_label": [[True], [False]],
                  "reference_first_error": pa.array([-1, 0], I32), "weird_name": ["a", "b"]})
    pq.write_table(t, tmp_path / "ok.parquet", compression="none", write_statistics=False)
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "text.parquet").write_bytes(data.replace(b"MARKER-", b"\xffARKER-"))
    (tmp_path / "name.parquet").write_bytes(data.replace(b"weird_name", b"\xffeird_name"))
    return tmp_path / "text.parquet", tmp_path / "name.parquet"


def test_text_that_is_not_utf8_in_a_shard_is_one_error_line(tmp_path, checker):
    """Before: UnicodeDecodeError from Arrow, and the filter's parts folder left behind."""
    text, name = _damaged_text_shards(tmp_path)
    why = "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"
    before = listing(tmp_path)
    with pytest.raises(InputError, match=rf"^{text}: cannot read rows after row 0 \({why}\)$"):
        _filter(text, "dedupe")
    with pytest.raises(InputError, match=rf"^{text}: cannot read rows after row 0 \({why}\)$"):
        ingest("parquet", text, tmp_path / "i.parquet", IngestOptions(), checker, checker_settings())
    for run in (lambda: _filter(name, "dedupe"), lambda: _eval(name),
                lambda: ingest("parquet", name, tmp_path / "i.parquet", IngestOptions(), checker, checker_settings())):
        with pytest.raises(InputError, match=rf"^{name}: not a readable Parquet file \({why}\)"):
            run()
    check_nothing_left(tmp_path, before)


def test_the_command_line_prints_a_wrongly_typed_column_as_one_line(tmp_path):
    from tests.conftest import run_cli

    src = _shard(tmp_path, id=pa.array([["a"], ["b"]]))  # before: a TypeError traceback (unhashable list)
    p = run_cli("eval", "processbench", src, "--pred", "mc_label", check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr == f"error: {src}: column 'id': expected type string, found list<element: string>\n"
