"""The rows of ``stepkit export``: input checks, label columns read by their declared meaning, and one
output record per row for each format (the formats and their sources: :mod:`stepkit.stages.export`)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from stepkit.columns import Meanings, read_meanings
from stepkit.errors import ConfigError, InputError
from stepkit.grading.verdicts import first_error_of, labels_from_first_error
from stepkit.schema import (
    PROBLEMS_NOT_TRAJECTORIES,
    check_column_types,
    check_columns,
    check_kept_steps,
    holds_problems,
)
from stepkit.shards import read_manifest
from stepkit.stages import export_text

if TYPE_CHECKING:
    from stepkit.stages.export import ExportConfig

SOFT_FORMATS = ("trl", "messages")  # the formats whose labels may be soft

def features_for(cfg: ExportConfig, kind: str | None = None):
    """The ``datasets.Features`` of a format (explicit: never inferred); ``kind`` is the label column's
    kind (``bool``, ``float``, ``index``): hard labels from values keep the values as ``soft_labels``."""
    from datasets import Features, List, Value

    s = Value("string")
    if cfg.format == "trl":
        f = {"id": s, "prompt": s, "completions": List(s),
             "labels": List(Value("float32")) if cfg.soft else List(Value("bool"))}
        if kind == "float" and not cfg.soft:
            f["soft_labels"] = List(Value("float32"))  # the values the hard labels came from
        return Features(f)
    if cfg.format == "math-shepherd":
        return Features({"id": s, "input": s, "label": s, "task": s})
    if cfg.format == "messages":
        from stepkit.stages import export_messages

        return Features(export_messages.features(cfg.soft, kind))
    if cfg.format == "processbench":
        return Features({"id": s, "generator": s, "problem": s, "steps": List(s),
                         "final_answer_correct": Value("bool"), "label": Value("int32")})
    return Features({"id": s, "prompt": s, "chosen": s, "rejected": s, "chosen_value": Value("float32"),
                     "rejected_value": Value("float32")})


def _textual(t: pa.DataType) -> bool:
    t = t.value_type if pa.types.is_dictionary(t) else t
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def check_row(row: dict, path: Path, i: int, fmt: str, seen: set) -> None:
    """One input row's values: text where text is needed, steps present, ids unique (InputError)."""
    if fmt == "pairs":
        if not row.get("prompt"):
            raise InputError(path, "null or empty prompt", row=i, column="prompt")
        for c in ("chosen", "rejected"):
            if not row.get(c) or any(not isinstance(x, str) or not x.strip() for x in row[c]):
                raise InputError(path, "null, empty or blank steps", row=i, column=c)
        for c in ("chosen_value", "rejected_value"):
            v = row.get(c)
            if v is not None and not math.isfinite(v):
                raise InputError(path, f"{v} is not a finite value", row=i, column=c)
        return
    if not row.get("id"):
        raise InputError(path, "null or empty id", row=i, column="id")
    if row["id"] in seen:
        raise InputError(path, f"duplicate id {row['id']!r}: one row per id", row=i, column="id")
    seen.add(row["id"])
    if not row.get("prompt"):
        raise InputError(path, "null or empty prompt", row=i, column="prompt")
    steps = row.get("steps")
    if not steps:
        raise InputError(path, "null or empty steps (a dataset row needs at least one step)", row=i, column="steps")
    for k, x in enumerate(steps):
        if x is None or not x.strip():
            raise InputError(path, f"step {k} is null or blank", row=i, column="steps")
    check_kept_steps(row, len(steps), path, i)


def threshold(cfg: ExportConfig) -> float:
    """The threshold of hard labels from values: ``--threshold``, else 0 (Math-Shepherd's hard estimate)."""
    return 0.0 if cfg.threshold is None else cfg.threshold


def _label_kind(schema: pa.Schema, path: Path, col: str, soft: bool = False, threshold: float | None = None) -> str:
    """``index``, ``bool`` or ``float``: what ``--labels COL`` holds, by its type and its declared meaning (a
    float column in nats or on a score scale of its own is no value in [0, 1])."""
    if col not in schema.names:
        raise InputError(path, f"missing --labels column (has: {', '.join(schema.names)})", column=col)
    t = schema.field(col).type
    if pa.types.is_integer(t):
        return "index"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if pa.types.is_boolean(t.value_type):
            return "bool"
        if pa.types.is_floating(t.value_type):
            meaning = read_meanings(schema, path).get(col)
            scale = meaning.scale if meaning is not None else None
            prefix = col.split("_")[0]
            if scale == "nats" and not soft:
                raise InputError(path, "holds log-probabilities (nats), not values in [0, 1]: hard labels from it "
                                       f"need its stage's first-error rule; use --labels {prefix}_label (or "
                                       f"{prefix}_first_error), or --soft to export the values", column=col)
            if scale == "score" and (soft or threshold is None):
                own = col.replace("_score", "_label")
                low, high = meaning.range
                raise InputError(path, f"holds {low:g}-{high:g} scores on a scale of their own (declared "
                                       f"scale 'score'), not step values: "
                                       + ("they are no soft labels" if soft else "value > 0 would call nearly every "
                                          "step correct") + f"; use --labels {own}, or hard labels with --threshold X",
                                 column=col)
            return "float"
    raise InputError(path, f"--labels needs step labels (list<bool>), step values (list<float>) or a first-error "
                           f"index (int), found {t}", column=col)


REQUIRED = {"trl": ("id", "prompt", "steps"), "math-shepherd": ("id", "prompt", "steps"),
            "processbench": ("id", "prompt", "steps", "outcome_correct"),
            "messages": ("id", "prompt", "steps", "prompt_messages", "step_messages"),
            "pairs": ("prompt", "prefix_steps", "chosen", "rejected")}


class Converter:
    """Turns one input row into one output record of ``cfg.format`` (None: null labels)."""

    def __init__(self, cfg: ExportConfig):
        self.cfg = cfg
        self.kind: str | None = None
        self.meanings: dict[Path, Meanings] = {}  # per shard: its columns' declared meaning
        self.dropped_keys: Counter = Counter()  # messages: message keys left out, with how many messages had one
        self.sep: str = export_text.DEFAULT_SEPARATOR  # the export's step separator (set by export())
        self.counts: Counter = Counter()  # steps_rejoined, converter_drops_first_step
        self.task_hint: dict[Path, str | None] = {}  # math-shepherd: each shard's ingest input path

    def check_schema(self, schema: pa.Schema, path: Path) -> None:
        self.meanings[Path(path)] = read_meanings(schema, path)
        if holds_problems(schema) and self.cfg.format != "pairs":
            raise InputError(path, PROBLEMS_NOT_TRAJECTORIES)
        if self.cfg.format == "math-shepherd":
            self.task_hint[Path(path)] = export_text.ingest_input(read_manifest(Path(path)))
        if self.cfg.format == "messages":
            from stepkit.stages.export_messages import check_schema

            check_schema(schema, path)  # names what the rows must come from before any generic message
        for c in REQUIRED[self.cfg.format]:
            if c not in schema.names:
                raise InputError(path, f"missing column for --format {self.cfg.format} "
                                       f"(has: {', '.join(schema.names)})", column=c)
        if self.cfg.format == "pairs":
            for c in ("prefix_steps", "chosen", "rejected"):
                t = schema.field(c).type
                if not ((pa.types.is_list(t) or pa.types.is_large_list(t)) and _textual(t.value_type)):
                    raise InputError(path, f"expected a list of step strings, found {t}", column=c)
            if not _textual(schema.field("prompt").type):
                raise InputError(path, f"expected a string, found {schema.field('prompt').type}", column="prompt")
            return
        check_columns(schema, REQUIRED[self.cfg.format], path)  # steps list<string>, id string, outcome bool
        # the other columns it reads (filter_*, <labeller>_status, source, generator); --labels by its kind
        check_column_types(schema, path, [c for c in schema.names if c != self.cfg.labels])
        kind = _label_kind(schema, path, self.cfg.labels, self.cfg.soft, self.cfg.threshold)
        if self.cfg.soft and kind != "float":
            raise InputError(path, f"--soft needs step values (list<float>), found "
                                   f"{schema.field(self.cfg.labels).type}", column=self.cfg.labels)
        if self.cfg.threshold is not None and self.cfg.soft:  # (after a score column's own refusal)
            raise ConfigError("--threshold makes hard labels from step values: --soft writes the values themselves; "
                              "give one or the other")
        if self.cfg.threshold is not None and kind != "float":
            raise InputError(path, f"holds {'first-error indices' if kind == 'index' else 'step labels'}: "
                                   "--threshold is for step values (list<float>); drop it", column=self.cfg.labels)
        if self.cfg.format == "processbench" and kind == "float":
            raise InputError(path, "--format processbench needs a first-error index or step labels, found step "
                                   "values", column=self.cfg.labels)
        if self.kind is not None and kind != self.kind:
            raise InputError(path, f"holds {kind} labels but an earlier shard holds {self.kind} labels: "
                                   "one dataset has one label type", column=self.cfg.labels)
        self.kind = kind

    def labels(self, row: dict, path: Path, i: int) -> tuple[list | None, list | None]:
        """``(hard labels or soft values, values hard labels came from)``; (None, None) when null, or when
        the labelling stage's status says it has no labels for the row (``mc_status = no_signal``: its
        values are all 0 because nothing succeeded, which says nothing about the steps)."""
        v, n, col = row.get(self.cfg.labels), len(row["steps"]), self.cfg.labels
        if v is None or not self.meanings[Path(path)].row_has_labels(row, col):
            return None, None
        if self.kind == "index":
            if v >= n and row.get("filter_steps_before", n) > n:  # keep-correct-steps cut off the error
                return [True] * n, None
            if not -1 <= v < n:
                raise InputError(path, f"first-error index {v} outside -1..{n - 1}", row=i, column=col)
            return labels_from_first_error(v, n), None
        v = list(v)
        if len(v) != n:
            raise InputError(path, f"{len(v)} labels for {n} steps", row=i, column=col)
        if any(x is None for x in v):
            return None, None
        if self.kind == "bool":
            return v, None
        if any(not math.isfinite(x) for x in v):
            raise InputError(path, "a step value is not a finite number", row=i, column=col)
        return (v, None) if self.cfg.soft else ([x > threshold(self.cfg) for x in v], v)

    def convert(self, row: dict, path: Path, i: int) -> dict | None:
        """The output record of ``row``; None when its labels are null. A row that ``stepkit filter
        --flag-only`` flagged never gets here (see :func:`flagged`); one it would cut is cut here."""
        f = self.cfg.format
        row = _apply_cut(row, self.meanings.get(Path(path)))
        if f == "pairs":
            pair = {c: self._steps(row[c] or [], path, i, c) for c in ("prefix_steps", "chosen", "rejected")}
            prompt, chosen, rejected = export_text.pair_texts({**row, **pair}, self.sep)
            return {"id": f"{row.get('node_id') or i}:{row.get('chosen_node_id')}:{row.get('rejected_node_id')}",
                    "prompt": prompt, "chosen": chosen, "rejected": rejected,
                    "chosen_value": row.get("chosen_value"), "rejected_value": row.get("rejected_value")}
        labels, values = self.labels(row, path, i)
        if labels is None:
            return None
        steps = list(row["steps"]) if f == "messages" else self._steps(row["steps"], path, i, "steps")
        if f == "messages":
            from stepkit.stages.export_messages import record

            return record(row, labels, values, self.cfg.soft, path, i, self.dropped_keys)
        if f == "trl":
            rec = {"id": row["id"], "prompt": row["prompt"], "completions": steps, "labels": labels}
            if self.kind == "float" and not self.cfg.soft:
                rec["soft_labels"] = values
            return rec
        if f == "math-shepherd":
            task = self.cfg.task or export_text.task_of(row.get("source"), self.task_hint.get(Path(path)))
            if task is None:
                raise InputError(path, f"cannot tell GSM8K from MATH by the row's source {row.get('source')!r} or "
                                       "its ingest input: give --task GSM8K or --task MATH", row=i, column="source")
            return export_text.shepherd_record(row, steps, labels, task, self.sep, path, i, self.counts)
        if row.get("filter_cut_by"):
            raise InputError(path, f"steps were cut by filter rule {row['filter_cut_by']!r}: the processbench "
                                   "format describes whole solutions (its final_answer_correct)", row=i,
                             column="filter_cut_by")
        if row.get("outcome_correct") is None:
            return None
        return {"id": row["id"], "generator": row.get("generator"), "problem": row["prompt"], "steps": steps,
                "final_answer_correct": row["outcome_correct"], "label": first_error_of(labels)}


    def _steps(self, steps: list[str], path: Path, i: int, column: str) -> list[str]:
        return export_text.checked_steps(list(steps), self.sep, self.cfg.separator_in_step, path, i, column,
                                         self.counts, self.cfg.format)


def flagged(row: dict) -> bool:
    """Whether ``stepkit filter --flag-only`` flagged the row as one to drop."""
    return bool(row.get("filter_reason"))


def _apply_cut(row: dict, meanings: Meanings | None) -> dict:
    """The row with its per-step columns (as its shard declares them) cut to ``filter_kept_steps`` (set by
    ``filter --flag-only``)."""
    k = row.get("filter_kept_steps")
    if k is None or k >= len(row.get("steps") or []):
        return row
    per_step = set(meanings.per_step()) if meanings is not None else {"steps"}
    return {**row, **{c: v[:k] for c, v in row.items() if c in per_step and v is not None},
            "filter_cut_by": row.get("filter_cut_by") or "(flagged)"}
