"""Explicit pyarrow schemas for stepkit shards, and validation with one-line errors.

Shards are never typed by inference from their first rows: a shard whose list columns hold only empty
lists would otherwise be typed ``list<null>`` and refuse to load beside other shards
(case ``shard-empty-lists-null-type``). Every writer passes one of the schemas below.

Two kinds of shard (``docs/architecture.md``, "Records"):

* **problems**: :data:`PROBLEM_FIELDS`, written by ``ingest gsm8k`` and read by ``rollout``.
* **trajectories**: :data:`TRAJECTORY_FIELDS`, one row per solution; labelers add their own
  prefixed columns (``mc_*`` ...) and never rewrite another stage's columns.
"""

from __future__ import annotations

import pyarrow as pa

from stepkit.columns import Column, fields, read_meanings
from stepkit.errors import InputError

PROBLEM_FIELDS = [
    pa.field("problem_id", pa.string(), nullable=False),
    pa.field("source", pa.string()),
    pa.field("prompt", pa.string(), nullable=False),
    pa.field("reference_answer", pa.string()),
    pa.field("reference_steps", pa.list_(pa.string())),
]

STEPS = Column("steps", pa.list_(pa.string()), "the solution's steps, split once and kept as a list end to end",
               per_step=True)

TRAJECTORY_FIELDS = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("problem_id", pa.string(), nullable=False),
    pa.field("source", pa.string()),
    pa.field("prompt", pa.string(), nullable=False),
    pa.field("reference_answer", pa.string()),
    STEPS.field(nullable=False),
    pa.field("step_separator", pa.string()),
    pa.field("final_answer", pa.string()),
    pa.field("outcome_correct", pa.bool_()),
    pa.field("generator", pa.string()),
    pa.field("error", pa.string()),
]

REFERENCE_COLUMNS = (  # optional columns some ingesters add (kept by every later stage)
    Column("reference_first_error", pa.int32(), "the human label: 0-based index of the earliest wrong step, -1 if "
           "none (ProcessBench)", role="first_error"),
    Column("source_outcome_correct", pa.bool_(), "the source file's own correctness flag, beside stepkit's outcome"),
    Column("reference_status", pa.string(), "status of the reference label: ok, or 'inconsistent: <why>'"),
    Column("reference_labels", pa.list_(pa.bool_()), "human step labels from an imported dataset (ingest "
           "--neutral-as)", per_step=True, role="label"),
    Column("reference_solution", pa.string(), "the gold solution as the source writes it (GSM8K's <<a=b>> "
           "annotations kept); clue recover --from-reference reads its intermediate values"),
)
REFERENCE_FIELDS = fields(REFERENCE_COLUMNS)
REFERENCE_SOLUTION_FIELD = REFERENCE_FIELDS[-1]

MESSAGE_COLUMNS = (  # ingest messages (stepkit/conversations.py): a tool-calling conversation as a row
    Column("step_observations", pa.list_(pa.string()), "what came back after the turn (tool results, the next user "
           "message), as text", per_step=True),
    Column("prompt_messages", pa.string(), "the original messages before the first turn, as JSON"),
    Column("step_messages", pa.list_(pa.string()), "the original messages of the turn and its observation, as JSON",
           per_step=True),
    Column("reference_actions", pa.list_(pa.string()), "gold tool calls the task required, each canonical JSON "
           "{arguments, name} (sorted keys)"),
    Column("source_reward", pa.float64(), "the source file's own reward (outcome_correct is reward >= "
           "--success-threshold)"),
)
MESSAGE_FIELDS = fields(MESSAGE_COLUMNS)

PROBLEM_SCHEMA = pa.schema(PROBLEM_FIELDS)
TRAJECTORY_SCHEMA = pa.schema(TRAJECTORY_FIELDS)

# The columns a labeler needs from a trajectory shard.
LABELER_REQUIRED = ("id", "problem_id", "prompt", "reference_answer", "steps", "outcome_correct")


def extend_schema(base: pa.Schema, fields: list[pa.Field]) -> pa.Schema:
    """``base`` plus ``fields`` (a field already in ``base`` is replaced, keeping its position)."""
    names = {f.name: f for f in fields}
    out = [names.pop(f.name, f) for f in base]
    out += [f for f in fields if f.name in names]
    return pa.schema(out, metadata=base.metadata)


ERROR_FIELD = pa.field("error", pa.string())
"""The ``error`` column every stage's output carries (``"<stage>: <reason>[: detail]"``, null when fine)."""


def with_error_column(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the :data:`ERROR_FIELD` every stage writes: appended when the input has no
    ``error`` column (a shard from another tool), typed string when the input's is all-null (``null``)."""
    i = schema.get_field_index("error")
    if i < 0:
        return schema.append(ERROR_FIELD)
    return schema.set(i, ERROR_FIELD) if pa.types.is_null(schema.field(i).type) else schema


def check_error_column(schema: pa.Schema, path) -> None:
    """Raise :class:`InputError` when the shard has an ``error`` column that cannot hold error strings."""
    if "error" in schema.names and not _stringish(schema.field("error").type):
        raise InputError(path, f"expected type string, found {schema.field('error').type}", column="error")


CORE_FIELDS = {f.name: f.type for f in TRAJECTORY_FIELDS + PROBLEM_FIELDS}
"""The types of the core columns of a trajectory or problem shard."""


def _fits_type(got: pa.DataType, want: pa.DataType) -> bool:
    """A column of type ``got`` can be read as ``want``: the same kind of value (any string type for a
    string, any integer type for an integer, integers or floats for a float, lists of such for a list),
    or all null."""
    if got == want or pa.types.is_null(got):
        return True
    if pa.types.is_dictionary(got):
        got = got.value_type
    if pa.types.is_list(want):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and _fits_type(got.value_type, want.value_type)
    if _stringish(want):
        return _stringish(got)
    if pa.types.is_integer(want):
        return pa.types.is_integer(got)
    if pa.types.is_floating(want):
        return pa.types.is_floating(got) or pa.types.is_integer(got)
    return False


def check_column_types(schema: pa.Schema, path, names=None) -> None:
    """Raise :class:`InputError` for the first column of the shard (of ``names``, default all) whose type its
    values cannot be read as: a core column (:data:`CORE_FIELDS`), a column whose declaration travels in its
    field metadata or is a stepkit column of an older shard (:mod:`stepkit.columns`), checked against its
    declared type; a per-step column that is no list. A stage would otherwise misread it (the characters of a
    string counted as steps) or fail on its values. Also refused: a column name given twice (a shard written
    by another tool: which of the two a stage reads would be arbitrary), and metadata that is no declaration."""
    seen: set[str] = set()
    for name in schema.names:
        if name in seen:
            raise InputError(path, "the shard has two columns of this name; rename or drop one", column=name)
        seen.add(name)
    meanings = read_meanings(schema, path)
    for name in schema.names if names is None else [n for n in names if n in schema.names]:
        got, declared = schema.field(name).type, meanings.get(name)
        want = CORE_FIELDS.get(name) or (declared.type if declared is not None else None)
        if want is not None and not _fits_type(got, want):
            raise InputError(path, f"expected type {want}, found {got}", column=name)
        if declared is not None and declared.per_step and not (pa.types.is_list(got) or pa.types.is_large_list(got)
                                                               or pa.types.is_null(got)):
            raise InputError(path, f"a per-step column must be a list (one entry per step), found {got}",
                             column=name)


PROBLEMS_NOT_TRAJECTORIES = ("holds problems, not trajectories (no steps to label): run `stepkit rollout IN OUT` "
                             "first, and give its OUT here")


def holds_problems(schema: pa.Schema) -> bool:
    """Whether a shard is a problems shard (``ingest`` of problems: a prompt, no ``id`` and no ``steps``), which a
    stage that reads trajectories refuses with :data:`PROBLEMS_NOT_TRAJECTORIES` (breaking run D12: ``judge`` on
    one said "missing column 'id'")."""
    names = set(schema.names)
    return "prompt" in names and not names & {"id", "steps"}


def check_columns(schema: pa.Schema, required: tuple[str, ...] | list[str], path) -> None:
    """Raise :class:`InputError` naming the first required column missing from ``schema``.

    Also checks the type of the core columns whose type stepkit relies on (``steps`` must be a list
    of strings, ``outcome_correct`` a bool).
    """
    have = set(schema.names)
    missing = [name for name in required if name not in have]
    if missing and "steps" in required and holds_problems(schema):
        raise InputError(path, PROBLEMS_NOT_TRAJECTORIES)
    for name in missing:
        raise InputError(path, f"missing column (has: {', '.join(schema.names)})", column=name)
    expected = {f.name: f.type for f in TRAJECTORY_FIELDS + PROBLEM_FIELDS}
    for name in required:
        want = expected.get(name)
        got = schema.field(name).type
        if want is None or got == want:
            continue
        ok = (pa.types.is_list(want) and (pa.types.is_list(got) or pa.types.is_large_list(got))
              and _stringish(got.value_type)) or (_stringish(want) and _stringish(got))
        if not ok:
            raise InputError(path, f"expected type {want}, found {got}", column=name)


def _stringish(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)


CONVERSATION_STEP_COLUMNS = ("step_observations", "step_messages")
"""The per-turn columns of a conversation row (``ingest messages``) that stages read beside its steps."""


def check_steps(rows: list[dict], path, first_row: int = 0) -> None:
    """Raise :class:`InputError` for the first row whose ``steps`` is null, empty or has an empty step, or
    whose conversation columns (:data:`CONVERSATION_STEP_COLUMNS`, when not null) do not hold one entry
    per step (a ``step_messages`` entry a string), or that has ``step_messages`` but a null
    ``step_observations``: a judge prompt or a likelihood prefix would pair turns with the wrong
    observations, or drop them.

    Rows that carry an ``error`` from an earlier stage are skipped (they pass through unlabelled).

    ``first_row`` is the 0-based index of ``rows[0]`` in the file, so the message names the file row.
    """
    for i, row in enumerate(rows):
        if row.get("error"):  # failed upstream: passed through, not labelled
            continue
        steps = row.get("steps")
        if steps is None:
            raise InputError(path, "steps is null", row=first_row + i, column="steps")
        if len(steps) == 0:
            raise InputError(path, "steps is an empty list", row=first_row + i, column="steps")
        for k, s in enumerate(steps):
            if s is None or not s.strip():
                raise InputError(path, f"step {k} is empty", row=first_row + i, column="steps")
        for c in CONVERSATION_STEP_COLUMNS:
            v = row.get(c)
            if v is None:
                if c == "step_observations" and c in row and row.get("step_messages") is not None:
                    raise InputError(path, "null on a conversation row (it has step_messages)", row=first_row + i,
                                     column=c)
                continue
            if not isinstance(v, list) or len(v) != len(steps):
                raise InputError(path, f"{len(v) if isinstance(v, list) else 'no list of'} entries for {len(steps)} "
                                       "steps (one per turn)", row=first_row + i, column=c)
            if c == "step_messages" and any(not isinstance(x, str) for x in v):
                raise InputError(path, f"entry {next(k for k, x in enumerate(v) if not isinstance(x, str))} is "
                                       "not the JSON text of a turn's messages", row=first_row + i, column=c)


def check_kept_steps(row: dict, n: int, path, i: int) -> None:
    """Raise InputError when the row's ``filter_kept_steps`` (the cut a ``--flag-only`` run left pending)
    is not a step count of its ``n`` steps (1..n); null is no cut."""
    k = row.get("filter_kept_steps")
    if k is not None and not 1 <= k <= n:
        raise InputError(path, f"{k} kept steps of {n} (expected 1..{n})", row=i, column="filter_kept_steps")
    b = row.get("filter_steps_before")
    if b is not None and b < n:  # an earlier filter only ever cut steps
        raise InputError(path, f"{b} steps before filtering, but the row has {n}", row=i, column="filter_steps_before")


def error_reason(error: str) -> str:
    """The reason part of an ``error`` value ``"<stage>: <reason>[: <detail>]"``, for counting by reason."""
    parts = error.split(": ")
    return parts[1] if len(parts) > 1 else error


def check_values(rows: list[dict], path, first_row: int, columns: tuple[str, ...], unique: str | None = None,
                 seen: set | None = None) -> None:
    """Raise :class:`InputError` for the first row whose ``columns`` are null or empty strings, or whose
    ``unique`` column repeats a value already in ``seen`` (a set the caller keeps across chunks).

    Rows with an upstream ``error`` skip the value checks but not the uniqueness check."""
    for i, row in enumerate(rows):
        for c in columns if not row.get("error") else ():
            v = row.get(c)
            if v is None or (isinstance(v, str) and not v.strip()):
                raise InputError(path, "null or empty", row=first_row + i, column=c)
        if unique is not None and seen is not None and row.get(unique) is not None:
            key = row.get(unique)
            if key in seen:
                raise InputError(path, f"duplicate value {key!r}", row=first_row + i, column=unique)
            seen.add(key)
