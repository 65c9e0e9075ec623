"""The rules of ``stepkit filter`` (the module docstring of :mod:`stepkit.stages.filter` says what each
does and where it comes from): one class per rule, and :func:`parse_rule`, which builds one from its text. A rule sees the rows still kept and returns one decision per row."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa

from stepkit.columns import Column, read_meanings
from stepkit.errors import ConfigError, InputError
from stepkit.grading.verdicts import first_error_of
from stepkit.options import Config

RULE_SYNTAX = ("consensus:A,B | prof:COL | min-value:COL>=X | max-value:COL<=X | status:COL=V | "
               "status:COL!=V | dedupe | steps:MIN-MAX | no-error | truncate-after-first-error:COL | "
               "keep-correct-steps:COL")


# ---------------------------------------------------------------------------------------------- rules
# A rule sees the rows still kept (views: steps and per-step columns already cut by earlier rules) and
# returns one decision per row: KEEP, ("drop", reason) or ("cut", n_steps).

KEEP = None


class Rule:
    """One ``--rule``: its text as written, the columns it reads, and its decisions."""

    kind = ""
    text = ""
    columns: tuple[str, ...] = ()

    labels_read: tuple[str, ...] = ()  # columns whose rows may say "no labels" through their stage's status

    def check_schema(self, schema: pa.Schema, path: Path) -> None:
        for c in self.columns:
            if c not in schema.names:
                raise InputError(path, f"missing column for --rule {self.text!r} (has: {', '.join(schema.names)})",
                                 column=c)
        # which status column (and which of its values) say a row has no labels in a column this rule reads
        # (mc_status = no_signal: its mc_value is all placeholder zeros), as the shard declares it
        meanings = read_meanings(schema, path)
        for c in self.labels_read:
            status = meanings.status_of(c)
            if status is not None:
                self.no_labels.setdefault(c, (status, set()))[1].update(meanings.no_labels(status))

    _no_labels: dict[str, tuple[str, set]] | None = None

    @property
    def no_labels(self) -> dict[str, tuple[str, set]]:
        """Column -> (its status column, the status values that mean no labels), over the planned shards."""
        if self._no_labels is None:
            self._no_labels = {}
        return self._no_labels

    def status_columns(self) -> set[str]:
        """The status columns :meth:`labelled` reads (the stage reads them with the rows)."""
        return {status for status, _ in self.no_labels.values()}

    def labelled(self, row: dict, col: str) -> bool:
        """False when the row's status says ``col`` holds no labels for it (its values are placeholders)."""
        status, values = self.no_labels.get(col, (None, ()))
        return status is None or row.get(status) not in values

    def decide(self, rows: list[dict], cfg: Config) -> list:
        raise NotImplementedError


def _first_error_kind(schema: pa.Schema, path: Path, col: str, rule: str) -> str:
    t = schema.field(col).type
    if pa.types.is_integer(t):
        return "index"
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_boolean(t.value_type):
        return "labels"
    raise InputError(path, f"--rule {rule!r} needs a first-error index (int) or step labels (list<bool>), "
                           f"found {t}", column=col)


def first_error(row: dict, col: str) -> int | None:
    """The row's first error from ``col``: an int index (``-1``: none) or list<bool> labels (first
    false; None when a null label comes first); None when unknown."""
    v = row.get(col)
    if v is None or isinstance(v, int):
        return v
    return first_error_of(list(v)) if len(v) else None


class FirstErrorRule(Rule):
    def check_schema(self, schema, path):
        super().check_schema(schema, path)
        for c in self.columns:
            _first_error_kind(schema, path, c, self.text)


class Consensus(FirstErrorRule):
    kind = "consensus"

    def __init__(self, text, a, b):
        self.text, self.columns = text, (a, b)
        self.labels_read = self.columns

    def decide(self, rows, cfg):
        out = []
        for r in rows:
            a, b = (first_error(r, c) if self.labelled(r, c) else None for c in self.columns)
            out.append(("drop", "unlabelled") if a is None or b is None else KEEP if a == b else ("drop", "consensus"))
        return out


class Truncate(FirstErrorRule):
    """``truncate-after-first-error`` (keep through the error) or ``keep-correct-steps`` (before it)."""

    def __init__(self, text, col, through_error: bool):
        self.text, self.columns, self.through = text, (col,), through_error
        self.labels_read = self.columns
        self.kind = "truncate-after-first-error" if through_error else "keep-correct-steps"

    def decide(self, rows, cfg):
        out = []
        for r in rows:
            col = self.columns[0]
            k, n = first_error(r, col) if self.labelled(r, col) else None, len(r["steps"])
            if k is None:
                out.append(("drop", "unlabelled"))
            elif k < 0 or k >= n:  # no error among the (possibly already cut) steps
                out.append(KEEP)
            elif self.through:
                out.append(("cut", k + 1) if k + 1 < n else KEEP)
            else:
                out.append(("cut", k) if k > 0 else ("drop", "no-correct-steps"))
        return out


def _values(v) -> list[float]:
    """The non-null, finite numbers of a cell (a number, or a per-step list of numbers or bools); NaN
    counts as null, so it never decides a comparison by where it sits."""
    if v is None:
        return []
    xs = [float(x) for x in (v if isinstance(v, (list, tuple)) else [v]) if x is not None]
    return [x for x in xs if math.isfinite(x)]


def _check_numeric(schema, path, col, rule):
    t = schema.field(col).type
    inner = t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else t
    if not (pa.types.is_integer(inner) or pa.types.is_floating(inner) or pa.types.is_boolean(inner)):
        raise InputError(path, f"--rule {rule!r} needs numbers (or a per-step list of them), found {t}", column=col)


class Threshold(Rule):
    def __init__(self, text, kind, col, op, x):
        self.text, self.kind, self.columns, self.op, self.x = text, kind, (col,), op, x
        self.labels_read = self.columns

    def check_schema(self, schema, path):
        super().check_schema(schema, path)
        _check_numeric(schema, path, self.columns[0], self.text)

    def decide(self, rows, cfg):
        out = []
        for r in rows:
            vs = _values(r.get(self.columns[0])) if self.labelled(r, self.columns[0]) else []
            if not vs:
                out.append(("drop", "unlabelled"))
                continue
            v = min(vs) if self.kind == "min-value" else max(vs)
            ok = {">=": v >= self.x, ">": v > self.x, "<=": v <= self.x, "<": v < self.x}[self.op]
            out.append(KEEP if ok else ("drop", self.kind))
        return out


class Status(Rule):
    kind = "status"

    def __init__(self, text, col, negate, values):
        self.text, self.columns, self.negate, self.raw = text, (col,), negate, [v for v in values]
        self.values: set = set(values)
        # set while the runner plans (every shard of the run is validated first): does any input row, in any
        # shard, have one of the values? A folder where one shard lacks a value is no typo.
        self.seen: bool | None = None
        self.present: Counter = Counter()  # the column's values over the planned rows, as text
        self.meaning: Column | None = None  # the column's declared meaning (from the first planned shard)

    def observe(self, rows) -> None:
        """Record, while planning, whether the input rows hold one of the values (see :meth:`decide`)."""
        col = self.columns[0]
        self.seen = bool(self.seen) or any(r.get(col) in self.values for r in rows)
        self.present.update(str(r.get(col)) for r in rows)

    def check_schema(self, schema, path):
        super().check_schema(schema, path)
        col = self.columns[0]
        if self.meaning is None:
            self.meaning = read_meanings(schema, path).get(col)
        t = schema.field(col).type
        if pa.types.is_nested(t):
            raise InputError(path, f"--rule {self.text!r} compares a whole cell, found a "
                                   f"{'list' if pa.types.is_list(t) or pa.types.is_large_list(t) else 'nested'} "
                                   f"column {t}", column=col)
        try:
            if pa.types.is_boolean(t):
                words = {"true": True, "false": False}
                self.values = {words[v.lower()] for v in self.raw}
            elif pa.types.is_integer(t):
                self.values = {int(v) for v in self.raw}
            elif pa.types.is_floating(t):  # read as the column's type: "0.0" is the float 0.0
                self.values = {float(v) for v in self.raw}
                if any(not math.isfinite(v) for v in self.values):
                    raise ValueError
        except (KeyError, ValueError):
            what = "true or false" if pa.types.is_boolean(t) else "an integer" if pa.types.is_integer(t) else \
                "a finite number"
            raise InputError(path, f"--rule {self.text!r}: {', '.join(self.raw)} is not a {t} value ({what})",
                             column=col) from None

    def check_seen(self, rows=()) -> None:
        """Raise :class:`ConfigError` when no input row (observed while planning, else ``rows``) has one of
        the values of a ``=`` rule, which would drop every row. The line says what the column holds
        (``present: no_signal (6 rows)``) and the likely cause (:meth:`_why_none`)."""
        col = self.columns[0]
        seen = self.seen if self.seen is not None else any(r.get(col) in self.values for r in rows)
        if not self.negate and (rows or self.seen is not None) and not seen:
            present = self.present or Counter(str(r.get(col)) for r in rows)
            held = ", ".join(f"{v} ({n} row{'s' if n != 1 else ''})" for v, n in
                             sorted(present.items(), key=lambda kv: (-kv[1], kv[0]))[:10])
            raise ConfigError(f"--rule {self.text!r}: no input row has {col} {' or '.join(self.raw)}, so it would "
                              f"drop every row (present: {held}); {self._why_none(present)}")

    def _why_none(self, present: Counter) -> str:
        """The likely cause of a ``=`` rule matching no row, from the column's declared meaning: a value
        the column does not declare is a typo; when every row holds a value that means "no labels", the
        stage that wrote the column labelled no row; else the rows hold other declared values."""
        col, m = self.columns[0], self.meaning
        declared = list(m.values) if m is not None else []
        unknown = [v for v in self.raw if v not in declared]
        if declared and unknown:
            return (f"{', '.join(unknown)} is not a value {col} declares ({', '.join(declared)}): a typo would "
                    f"drop every row")
        said = f'{col} declares: "{m.doc}"' if m is not None and declared and m.doc else None
        wants_labels = m is not None and not set(self.raw) <= set(m.no_labels)
        if wants_labels and m.no_labels and set(present) <= set(m.no_labels):
            return (f"{f'this is no typo ({said}): ' if said else ''}every row is {' or '.join(sorted(present))}, "
                    f"which {col} uses for a row with no labels, so the stage that wrote {col} could label no row; "
                    f"likely cause: its model solves none of these problems (a model too small for them, or a "
                    f"scripted stand-in), or its continuations were empty or copies (see that stage's summary and "
                    f"warnings); filter with rules that need no labels, or label with a stronger model"
                    f"{'' if declared else ' (or check the value spelling: the shard declares no values)'}")
        if said:
            return f"this is no typo ({said}): the rows hold other values; choose one of those"
        return "check the value's spelling (a typo would drop every row)"

    def decide(self, rows, cfg):
        col = self.columns[0]
        self.check_seen(rows)
        return [KEEP if ((r.get(col) in self.values) != self.negate) else ("drop", "status") for r in rows]


class Dedupe(Rule):
    kind = "dedupe"
    text = "dedupe"
    columns = ("prompt", "steps")

    def decide(self, rows, cfg):
        seen, out = set(), []
        for r in rows:
            key = (r.get("prompt"), tuple(r["steps"]))
            out.append(("drop", "dedupe") if key in seen else KEEP)
            seen.add(key)
        return out


class Steps(Rule):
    kind = "steps"

    def __init__(self, text, lo, hi):
        self.text, self.lo, self.hi = text, lo, hi

    def decide(self, rows, cfg):
        return [KEEP if self.lo <= len(r["steps"]) <= self.hi else ("drop", "steps") for r in rows]


class NoError(Rule):
    kind = "error"
    text = "no-error"

    def decide(self, rows, cfg):
        return [("drop", "error") if r.get("error") else KEEP for r in rows]


class Prof(Rule):
    kind = "prof"

    def __init__(self, text, col):
        self.text, self.columns = text, (col, "problem_id", "outcome_correct")
        self.labels_read = (col,)

    def check_schema(self, schema, path):
        super().check_schema(schema, path)
        _check_numeric(schema, path, self.columns[0], self.text)

    def score(self, row: dict, mean: float, cfg: Config) -> float:
        """PROF's consistency score of one row against its problem's mean step value ``mean``."""
        sign = 2 * int(row["outcome_correct"]) - 1
        vs = _values(row.get(self.columns[0]))
        s = sum(2 * (v - mean) * sign for v in vs) / len(vs)
        n = len(row["steps"])
        if n < cfg.min_steps or (cfg.max_steps is not None and n > cfg.max_steps):
            s -= cfg.step_penalty
        return s

    def decide(self, rows, cfg):
        out: list = [KEEP] * len(rows)
        groups: dict = {}
        for i, r in enumerate(rows):
            if r.get("outcome_correct") is None or not _values(r.get(self.columns[0])) \
                    or not self.labelled(r, self.columns[0]):
                out[i] = ("drop", "unlabelled")
            else:
                groups.setdefault(r["problem_id"], []).append(i)
        for idx in groups.values():
            vals = [v for i in idx for v in _values(rows[i].get(self.columns[0]))]
            mean = sum(vals) / len(vals)
            sides = {True: [], False: []}  # outcome -> [(score, position)], lowest first
            for i in idx:
                sides[bool(rows[i]["outcome_correct"])].append((self.score(rows[i], mean, cfg), i))
            for side in sides.values():
                side.sort()
            for _ in range(min(cfg.remove or 0, len(idx) - 1)):  # a problem keeps at least one row
                pos, neg = sides[True], sides[False]
                if len(pos) != len(neg):  # balance: the larger side loses one
                    take = pos if len(pos) > len(neg) else neg
                else:  # equal sides: the less consistent row goes
                    take = pos if (pos[0] <= neg[0]) else neg
                out[take.pop(0)[1]] = ("drop", "prof")
        return out


def _column(name: str, text: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w.\-]*", name or ""):
        raise ConfigError(f"--rule {text!r}: {name!r} is not a column name")
    return name


def parse_rule(text: str) -> Rule:
    """Parse one ``--rule`` (syntax: :data:`RULE_SYNTAX`).

    Raises:
        ConfigError: unknown rule or malformed arguments, naming the rule as written.
    """
    kind, _, arg = text.strip().partition(":")
    try:
        if kind == "dedupe" and not arg:
            return Dedupe()
        if kind == "no-error" and not arg:
            return NoError()
        if kind == "consensus":
            a, _, b = arg.partition(",")
            if not b or "," in b:
                raise ValueError("needs two columns, consensus:A,B")
            if a.strip() == b.strip():
                raise ValueError("compares a column with itself: name two labellers' columns")
            return Consensus(text, _column(a.strip(), text), _column(b.strip(), text))
        if kind in ("truncate-after-first-error", "keep-correct-steps"):
            return Truncate(text, _column(arg, text), kind == "truncate-after-first-error")
        if kind == "prof":
            return Prof(text, _column(arg, text))
        if kind in ("min-value", "max-value"):
            m = re.fullmatch(r"([^<>=!]+)(>=|>)(.+)" if kind == "min-value" else r"([^<>=!]+)(<=|<)(.+)", arg)
            if not m:
                raise ValueError(f"write {kind}:COL{'>=' if kind == 'min-value' else '<='}X")
            x = float(m.group(3))
            if not math.isfinite(x):
                raise ValueError("the threshold must be a finite number")
            return Threshold(text, kind, _column(m.group(1).strip(), text), m.group(2), x)
        if kind == "status":
            m = re.fullmatch(r"([^=!]+)(!=|=)(.+)", arg)
            if not m:
                raise ValueError("write status:COL=VALUE or status:COL!=VALUE")
            return Status(text, _column(m.group(1).strip(), text), m.group(2) == "!=",
                          [v.strip() for v in m.group(3).split(",")])
        if kind == "steps":
            m = re.fullmatch(r"(\d*)-(\d*)", arg)
            if not m or not (m.group(1) or m.group(2)):
                raise ValueError("write steps:MIN-MAX, steps:MIN- or steps:-MAX")
            lo, hi = int(m.group(1) or 1), int(m.group(2)) if m.group(2) else 10**9
            if lo > hi:
                raise ValueError(f"MIN {lo} is above MAX {hi}")
            return Steps(text, lo, hi)
    except ValueError as e:
        raise ConfigError(f"--rule {text!r}: {e}") from None
    raise ConfigError(f"--rule {text!r}: unknown rule (rules: {RULE_SYNTAX})")
