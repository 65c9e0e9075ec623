"""Columns that say what they mean: a stage declares each column it writes once, in its own module, and the
meaning travels with the shard in the column's Arrow field metadata.

A :class:`Column` is a name, an explicit Arrow type, one line of documentation and its meaning:

* ``per_step``: a list with one entry per step (``filter`` cuts it with the steps, every reader checks its
  length against the step count);
* ``role``: what the values are: ``label`` (hard step labels, ``list<bool>``), ``value`` (step values or
  scores, ``list<float>``), ``first_error`` (ProcessBench's 0-based index of the earliest wrong step, -1 for
  none), ``status`` (why a row has labels or not), or None (counts, texts, bookkeeping);
* ``scale`` of a ``value``: ``unit`` (a probability or estimate in [0, 1]: ``value > 0`` is Math-Shepherd's
  hard label), ``nats`` (log-probabilities and their differences: a hard label needs the stage's own rule),
  ``score`` (a scale of its own, ``range = (low, high)``: never a probability, a hard label needs an explicit
  threshold), ``difference`` (a change of a unit value, in [-1, 1]);
* ``status``: for a label/value/first-error column, the status column of the same stage that says whether a
  row has labels at all; for a status column, ``values`` (what it may hold) and ``no_labels`` (which of them
  mean "this row has no labels": ``mc_status = no_signal`` means every value is a placeholder 0).

The declaration is written into the field's metadata under ``b"stepkit"`` (JSON), so ``filter``, ``export``,
``show``/``stats``, ``eval`` and ``report`` read the meaning from the shard, whatever stage wrote it: a new stage
touches no shared table. Shards written before column metadata existed (stepkit 0.1.0 up to this change) keep
working through :data:`stepkit.columns_legacy.LEGACY_COLUMNS`, a frozen snapshot of the columns stepkit wrote
then; new columns are never added there.

The model is the Hugging Face ``datasets`` feature metadata and Arrow's own extension-type metadata: meaning
that travels with the data rather than in a reader's table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from stepkit.errors import InputError

META_KEY = b"stepkit"
ROLES = ("label", "value", "first_error", "status")
SCALES = ("unit", "nats", "score", "difference")


@dataclass(frozen=True)
class Column:
    """One column a stage writes, with its meaning (see the module docstring).

    Attributes:
        name: the column name, prefixed by the owning stage (``mc_value``).
        type: its explicit Arrow type (never inferred from rows).
        doc: one line: what an entry holds, with its unit.
        per_step: a list with one entry per step.
        role: ``label``, ``value``, ``first_error``, ``status`` or None.
        scale: for ``role="value"``: ``unit``, ``nats``, ``score`` or ``difference``.
        range: for ``scale="score"``: ``(low, high)``.
        status: for a label/value/first-error column: the status column governing it.
        values: for a status column: the values it may hold (documentation; not enforced on read).
        no_labels: for a status column: the values that mean the row has no labels.

    Raises:
        ValueError: an inconsistent declaration (unknown role or scale, a score without a range, a per-step
            column whose type is not a list, ``no_labels`` on a column that is no status), at import time.
    """

    name: str
    type: pa.DataType
    doc: str
    per_step: bool = False
    role: str | None = None
    scale: str | None = None
    range: tuple[float, float] | None = None
    status: str | None = None
    values: tuple[str, ...] = ()
    no_labels: tuple[str, ...] = ()

    def __post_init__(self):
        if self.role is not None and self.role not in ROLES:
            raise ValueError(f"column {self.name}: role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.scale is not None and self.scale not in SCALES:
            raise ValueError(f"column {self.name}: scale {self.scale!r} is not one of {', '.join(SCALES)}")
        if (self.scale == "score") != (self.range is not None):
            raise ValueError(f"column {self.name}: a score scale needs its range, and only a score has one")
        if self.per_step and not (pa.types.is_list(self.type) or pa.types.is_large_list(self.type)):
            raise ValueError(f"column {self.name}: a per-step column must be a list type, not {self.type}")
        if (self.values or self.no_labels) and self.role != "status":
            raise ValueError(f"column {self.name}: values/no_labels belong to a status column")
        if not set(self.no_labels) <= set(self.values or self.no_labels):
            raise ValueError(f"column {self.name}: no_labels must be among its values")

    def meaning(self) -> dict:
        """The declaration as the JSON object stored in the field's metadata (defaults left out)."""
        doc = {"doc": self.doc, "per_step": self.per_step, "role": self.role, "scale": self.scale,
               "range": list(self.range) if self.range else None, "status": self.status,
               "values": list(self.values), "no_labels": list(self.no_labels)}
        return {k: v for k, v in doc.items() if v not in (None, False, [])}

    def field(self, nullable: bool = True) -> pa.Field:
        """The Arrow field, its meaning in the metadata under :data:`META_KEY`."""
        return pa.field(self.name, self.type, nullable=nullable,
                        metadata={META_KEY: json.dumps(self.meaning(), sort_keys=True)})


def fields(columns) -> list[pa.Field]:
    """``[c.field() for c in columns]``: the Arrow fields of a stage's declared columns."""
    return [c.field() for c in columns]


def from_field(field: pa.Field) -> Column | None:
    """The :class:`Column` a field declares in its metadata; for a field without it, the frozen declaration
    of a column stepkit wrote before metadata existed (:data:`~stepkit.columns_legacy.LEGACY_COLUMNS`);
    else None (a column of another tool's, or a core column with no meaning to declare).

    Raises:
        ValueError: the metadata is not a valid declaration (a shard edited by hand).
    """
    raw = (field.metadata or {}).get(META_KEY)
    if raw is None:
        from stepkit.columns_legacy import LEGACY_COLUMNS, LEGACY_DOC

        if field.name not in LEGACY_COLUMNS:
            return None
        type_, meaning = LEGACY_COLUMNS[field.name]
        return Column(field.name, type_, doc=LEGACY_DOC, **meaning)
    try:
        doc = json.loads(raw)
        return Column(field.name, field.type, doc=doc.get("doc", ""), per_step=bool(doc.get("per_step")),
                      role=doc.get("role"), scale=doc.get("scale"),
                      range=tuple(doc["range"]) if doc.get("range") else None, status=doc.get("status"),
                      values=tuple(doc.get("values", ())), no_labels=tuple(doc.get("no_labels", ())))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"column {field.name}: its stepkit metadata is not a column declaration ({e})") from None


class Meanings:
    """The declared meaning of every column of a shard's schema, read once.

    ``Meanings(schema)[name]`` is the :class:`Column` (or None); the methods answer what readers ask.
    Built from one schema; for a folder of shards build one per shard or from a unified schema.
    """

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.columns: dict[str, Column] = {}
        for f in schema:
            c = from_field(f)
            if c is not None:
                self.columns[f.name] = c

    def __getitem__(self, name: str) -> Column | None:
        return self.columns.get(name)

    def get(self, name: str) -> Column | None:
        return self.columns.get(name)

    def per_step(self) -> list[str]:
        """The per-step list columns of the shard, in schema order."""
        return [n for n, c in self.columns.items() if c.per_step]

    def with_role(self, role: str) -> list[str]:
        """The columns of one role (``label``, ``value``, ``first_error``, ``status``), in schema order."""
        return [n for n, c in self.columns.items() if c.role == role]

    def status_of(self, name: str) -> str | None:
        """The status column governing ``name`` (present in the shard), or None."""
        c = self.columns.get(name)
        s = c.status if c is not None else None
        return s if s in self.columns else None

    def no_labels(self, status_column: str) -> frozenset[str]:
        """The values of ``status_column`` that mean a row has no labels."""
        c = self.columns.get(status_column)
        return frozenset(c.no_labels) if c is not None else frozenset()

    def row_has_labels(self, row: dict, name: str) -> bool:
        """False when the row's status for ``name``'s stage says it has no labels (``mc_status = no_signal``:
        its values are placeholders), True otherwise (also when no status governs ``name``)."""
        s = self.status_of(name)
        return s is None or row.get(s) not in self.no_labels(s)


def read_meanings(schema: pa.Schema, path) -> Meanings:
    """:class:`Meanings` of a shard's schema.

    Raises:
        InputError: a column's stepkit metadata is not a declaration (naming the file and the column).
    """
    try:
        return Meanings(schema)
    except ValueError as e:
        name = str(e).split(":")[0].removeprefix("column ")
        raise InputError(path, str(e).split(": ", 1)[-1], column=name) from None
