"""What ``stepkit report`` reads: labelled shards or an export folder as one table, the labellers present in
it (from the columns' declared meaning, :mod:`stepkit.columns`), and the summary figures per labeller.

A **labeller** is the group of a shard's declared ``label``, ``value`` and ``first_error`` columns that share
a stage prefix (``mc_``, ``judge_``, ``clue_``, ``lh_``, ``mcts_``, or any new stage's: a column is named by
the stage that writes it, ``docs/architecture.md``, "Records"), with the ``status`` column that governs them
(:meth:`~stepkit.columns.Meanings.status_of`) and that status's ``no_labels`` values. The human labels that
``ingest`` keeps (:data:`stepkit.schema.REFERENCE_COLUMNS`) are one more labeller, marked ``human``. Nothing
here names a labeller's columns: a new stage's columns appear in the report from their declaration alone.

An **export folder** (``stepkit export``: ``stepkit.manifest.json`` and ``data/*.parquet``) is read through
its format (trl, processbench, math-shepherd, messages), whose columns are the format's, not stepkit's;
they are turned into trajectory-shaped columns here (``export_label``, ``export_value``,
``export_first_error``, declared with their meaning), so the rest of the report reads one shape.

Summary figures (the card's, :mod:`stepkit.stages.dataset_card`, here per labeller and over every row, not
only the rows the page carries): rows with labels, statuses, label balance (steps labelled true / false /
null), the first-error histogram (-1: no wrong step) and the mean of each value column by step position.
They are computed over the Arrow columns with numpy, so a 50,000-row shard costs a fraction of a second.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stepkit.columns import Column, Meanings, read_meanings
from stepkit.errors import InputError
from stepkit.schema import PROBLEMS_NOT_TRAJECTORIES, REFERENCE_COLUMNS, check_column_types, holds_problems
from stepkit.shards import list_shards, open_parquet, read_manifest

MAX_POSITIONS = 40  # value-by-position figures stop at this step position
HUMAN = {c.name for c in REFERENCE_COLUMNS}
NODE_COLUMN = "mcts_node_id"  # mcts-label's per-step node ids: where a row's path lies in its --tree-out tree
ROW_COLUMNS = ("id", "problem_id", "prompt", "steps", "outcome_correct", "final_answer", "reference_answer",
               "generator", "error", "filter_reason", "filter_rule", "prompt_messages", "step_messages", NODE_COLUMN)
"""The columns the page shows besides the labellers' (the core trajectory columns, filter's reason, a
conversation's messages, mcts-label's node ids); only these and the declared label, value, first-error and
status columns are read."""


@dataclass
class Source:
    """The rows a report is made of: one table, its columns' meanings, and where they came from.

    Attributes:
        table: every row of every input (shards concatenated; an export's rows converted).
        meanings: the declared meaning of the table's columns.
        inputs: ``[{"path", "rows", "kind"}]`` per input file (kind ``shard`` or ``export:<format>``).
        trees: the ``mcts-label --tree-out`` files found in the shards' manifests (that exist).
        titles: a display title per labeller key, where it is not the key (an export's label rule).
    """

    table: pa.Table
    meanings: Meanings
    inputs: list[dict] = field(default_factory=list)
    trees: list[Path] = field(default_factory=list)
    titles: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ reading

def load(paths: list[str | os.PathLike]) -> Source:
    """Read every IN (a shard, a folder of shards, or an export folder) into one :class:`Source`.

    Raises:
        InputError: a path that is no shard, folder or export; shards whose columns cannot be combined
            (one line naming the file); an export of the pairs format (no steps to show).
    """
    tables, inputs, trees, titles = [], [], [], {}
    given: dict[Path, str] = {}  # every file read, resolved -> the IN it came from

    def once(p: Path, via: str) -> None:  # (breaking run D10: one IN twice counted its rows twice)
        key = p.resolve()
        if key in given:
            same = "given twice" if given[key] == via else f"also read through {given[key]}"
            raise InputError(p, f"{same}: its rows would be counted twice; give each IN once")
        given[key] = via

    for path in paths:
        p = Path(path)
        if p.is_dir() and (p / "stepkit.manifest.json").is_file():
            once(p, str(path))
            key = "export" if "export" not in titles else f"export{len([k for k in titles if k.startswith('export')]) + 1}"
            t, info, title = _load_export(p)  # each export its own labeller (D8: a second one took the first's)
            tables.append(t.rename_columns([c.replace("export_", f"{key}_", 1) if c.startswith("export_") else c
                                            for c in t.column_names]))
            inputs.extend(info)
            titles[key] = f"{title} ({p.name})" if len(paths) > 1 else title
            continue
        for shard in list_shards(p):
            once(shard, str(path))
            pf = open_parquet(shard)
            if holds_problems(pf.schema_arrow):
                raise InputError(shard, PROBLEMS_NOT_TRAJECTORIES)
            meanings = read_meanings(pf.schema_arrow, shard)  # bad metadata is one line naming the file
            roles = {n for n, c in meanings.columns.items() if c.role in ("label", "value", "first_error", "status")}
            columns = [n for n in pf.schema_arrow.names if n in ROW_COLUMNS or n in roles]
            # the columns it reads of their declared types (breaking run, 2026-12-03: string steps were a
            # traceback, list<string> values were drawn as they came)
            check_column_types(pf.schema_arrow, shard, columns)
            try:
                tables.append(pf.read(columns=columns))
            except (pa.ArrowException, OSError) as e:
                raise InputError(shard, f"cannot read its rows ({str(e).splitlines()[0][:160]})") from None
            _check_step_lengths(tables[-1], meanings, shard)
            inputs.append({"path": shard.name, "rows": pf.metadata.num_rows, "kind": "shard"})
            side = ((read_manifest(shard) or {}).get("side_outputs") or {}).get("tree") or {}
            if side.get("path") and Path(side["path"]).is_file():
                trees.append(Path(side["path"]))
    try:
        table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise InputError(paths[0], f"its shards cannot be read as one table ({str(e).splitlines()[0][:160]})") from None
    if "steps" not in table.column_names:
        raise InputError(paths[0], "has no 'steps' column: report shows trajectory shards and export folders")
    return Source(table, Meanings(table.schema), inputs, trees, titles)


def _check_step_lengths(table: pa.Table, meanings: Meanings, shard: Path) -> None:
    """Every per-step label or value list of a row has one entry per step (a null list is allowed).

    Raises:
        InputError: the first row where one does not, naming the file, row and column (breaking run D11: the
            page drew such rows, each step beside another step's label, with no word)."""
    if "steps" not in table.column_names:
        return
    steps = pc.list_value_length(table.column("steps")).to_numpy(zero_copy_only=False)
    for name, col in meanings.columns.items():
        if name == "steps" or not col.per_step or col.role not in ("label", "value") or name not in table.column_names:
            continue
        n = pc.list_value_length(table.column(name)).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~np.isnan(n.astype(float)) & ~np.isnan(steps.astype(float)) & (n != steps))
        if len(bad):
            i = int(bad[0])
            raise InputError(shard, f"{int(n[i])} entries for {int(steps[i])} steps (a per-step column has one per "
                                    f"step){f'; {len(bad)} rows like it' if len(bad) > 1 else ''}", row=i, column=name)


EXPORT_COLUMNS = {  # the columns an export's labels become (their meaning declared, as a stage would)
    "label": Column("export_label", pa.list_(pa.bool_()), "the exported hard label of the step", per_step=True,
                    role="label"),
    "value": Column("export_value", pa.list_(pa.float32()), "the exported soft label (or the value the hard "
                    "label came from)", per_step=True, role="value", scale="unit"),
    "first_error": Column("export_first_error", pa.int32(), "the exported first error (-1: none)",
                          role="first_error"),
}


def _load_export(folder: Path) -> tuple[pa.Table, list[dict], str]:
    """An export folder's rows as trajectory-shaped columns (see the module docstring)."""
    try:
        manifest = json.loads((folder / "stepkit.manifest.json").read_text())
        fmt = manifest["config"]["format"]
        files = [f for s in manifest["splits"].values() for f in s["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(folder / "stepkit.manifest.json", "damaged (no format or splits); re-export the folder") from None
    if fmt == "pairs":
        raise InputError(folder, "holds preference pairs (--format pairs): report shows step-labelled rows")
    rows: list[dict] = []
    info = []
    for f in files:
        t = open_parquet(folder / f).read()
        info.append({"path": f, "rows": t.num_rows, "kind": f"export:{fmt}"})
        rows.extend(_export_row(r, fmt) for r in t.to_pylist())
    fields = [pa.field("id", pa.string()), pa.field("prompt", pa.string()), pa.field("steps", pa.list_(pa.string())),
              pa.field("outcome_correct", pa.bool_()), pa.field("generator", pa.string()),
              pa.field("prompt_messages", pa.string()), pa.field("step_messages", pa.list_(pa.string())),
              *(c.field() for c in EXPORT_COLUMNS.values())]
    table = pa.Table.from_pylist(rows, schema=pa.schema(fields))
    rule = manifest.get("label_rule") or (manifest["config"].get("labels") or "")
    return table, info, f"export ({fmt}): {rule}"


_SHEPHERD = re.compile(r" ([+-])(?:\n|$)")


def _export_row(r: dict, fmt: str) -> dict:
    """One row of an export's data file in the trajectory shape."""
    out = {"id": r.get("id"), "prompt": r.get("prompt") or r.get("problem") or "", "steps": r.get("steps"),
           "outcome_correct": r.get("final_answer_correct", r.get("outcome_correct")), "generator": r.get("generator"),
           "prompt_messages": None, "step_messages": None, "export_label": None, "export_value": None,
           "export_first_error": None}
    labels = r.get("labels")
    if fmt == "trl":
        out["steps"] = r.get("completions")
    elif fmt == "processbench":
        out["export_first_error"] = r.get("label")
        labels = [r["label"] == -1 or s < r["label"] for s in range(len(r["steps"] or []))] \
            if r.get("label") is not None else None
    elif fmt == "math-shepherd":  # the problem is part of the first step's text (the format joins them)
        parts = _SHEPHERD.split(r.get("label") or "")
        out["steps"] = [s.strip() for s in parts[0::2] if s.strip()]
        labels = [t == "+" for t in parts[1::2]]
    elif fmt == "messages":
        msgs = r.get("messages") or []
        turns = r.get("turn_index") or []
        out["prompt_messages"] = json.dumps(msgs[:turns[0]] if turns else msgs)
        bounds = [*turns, len(msgs)]
        out["step_messages"] = [json.dumps(msgs[a:b]) for a, b in zip(bounds, bounds[1:])]
        out["steps"] = [(msgs[i].get("content") or "") for i in turns]
    if labels and isinstance(labels[0], float):
        out["export_value"] = labels
    elif labels is not None:
        out["export_label"] = labels
    if r.get("soft_labels") is not None:
        out["export_value"] = r["soft_labels"]
    return out


# ------------------------------------------------------------------------------------------------ labellers

@dataclass
class Labeller:
    """One labeller present in a table (see the module docstring).

    Attributes:
        key: the stage prefix (``mc``) or ``reference`` for the human labels.
        title: what the page calls it.
        human: the source dataset's own (human) labels.
        status: its status column, or None; ``no_labels``: the statuses that mean "this row has no labels".
        labels / values: its per-step label (``list<bool>``) and value (``list<float>``) columns.
        first_error: its first-error column, or None (then the page derives it from the first label column).
        scales: per value column, ``[scale, low, high]``: the range its colours span.
    """

    key: str
    title: str
    human: bool = False
    status: str | None = None
    no_labels: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)
    first_error: str | None = None
    scales: dict[str, list] = field(default_factory=dict)

    def doc(self) -> dict:
        return {k: getattr(self, k) for k in ("key", "title", "human", "status", "no_labels", "labels", "values",
                                              "first_error", "scales")}


def labellers(table: pa.Table, meanings: Meanings, titles: dict[str, str] | None = None) -> list[Labeller]:
    """Every labeller present in ``table``: its declared label, value and first-error columns grouped by
    stage prefix, human labels first, then in schema order (only columns with some non-null value)."""
    out: dict[str, Labeller] = {}
    for name, col in meanings.columns.items():
        if col.role not in ("label", "value", "first_error") or name not in table.column_names:
            continue
        if col.role != "first_error" and not col.per_step:
            continue
        if table.column(name).null_count == table.num_rows:
            continue
        key = "reference" if name in HUMAN else name.split("_")[0]
        lab = out.get(key)
        if lab is None:
            status = meanings.status_of(name)
            lab = out[key] = Labeller(key, (titles or {}).get(key) or ("human (reference)" if key == "reference" else key),
                                      human=key == "reference", status=status,
                                      no_labels=sorted(meanings.no_labels(status)) if status else [])
        if col.role == "label":
            lab.labels.append(name)
        elif col.role == "value":
            lab.values.append(name)
            lab.scales[name] = _scale(table, name, col)
        elif lab.first_error is None:
            lab.first_error = name
    return sorted(out.values(), key=lambda lab: not lab.human)


def _scale(table: pa.Table, name: str, col: Column) -> list:
    """``[scale, low, high]`` of a value column: declared (unit, difference, score range) or, for nats,
    the 5th and 95th percentiles of the column's values."""
    if col.scale == "unit":
        return ["unit", 0.0, 1.0]
    if col.scale == "difference":
        return ["difference", -1.0, 1.0]
    if col.scale == "score" and col.range:
        return ["score", float(col.range[0]), float(col.range[1])]
    flat = pc.drop_null(pc.list_flatten(table.column(name)))
    xs = flat.to_numpy(zero_copy_only=False).astype(float) if len(flat) else np.array([0.0, 1.0])
    xs = xs[np.isfinite(xs)]
    lo, hi = (float(np.percentile(xs, 5)), float(np.percentile(xs, 95))) if len(xs) else (0.0, 1.0)
    return [col.scale or "value", round(lo, 4), round(hi if hi > lo else lo + 1, 4)]


def labelled_mask(table: pa.Table, lab: Labeller) -> np.ndarray:
    """Per row: the labeller ran there and its status does not say "no labels"."""
    cols = [*lab.labels, *lab.values, *([lab.first_error] if lab.first_error else [])]
    ran = np.zeros(table.num_rows, dtype=bool)
    for c in cols:
        ran |= np.asarray(pc.is_valid(table.column(c)))
    if lab.status and lab.no_labels:
        status = table.column(lab.status).cast(pa.string())
        ran &= ~np.asarray(pc.fill_null(pc.is_in(status, pa.array(lab.no_labels)), False))
    return ran


def _flat(table: pa.Table, col: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column's entries of the rows in mask ``rows``: (values as float, valid, step position)."""
    arr = table.column(col).combine_chunks()
    if isinstance(arr, pa.ChunkedArray):  # (an empty table)
        arr = pa.concat_arrays(arr.chunks) if arr.num_chunks else pa.array([], arr.type)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(arr), 0), dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    flat = pc.list_flatten(arr)
    valid = np.asarray(pc.is_valid(flat), dtype=bool)
    if pa.types.is_boolean(flat.type):
        values = np.asarray(pc.fill_null(flat, False), dtype=float)
    else:
        values = np.asarray(pc.fill_null(flat.cast(pa.float64()), 0.0), dtype=float)
    position = np.arange(len(flat)) - np.repeat(starts, lengths)
    keep = np.repeat(rows, lengths)
    return values[keep], valid[keep] & np.isfinite(values[keep]), position[keep]


def first_errors(table: pa.Table, lab: Labeller) -> list[int | None]:
    """Per row: the labeller's first error (its column, else the first false label: -1 for none), None
    where it has no labels."""
    mask = labelled_mask(table, lab)
    if lab.first_error:
        fe = table.column(lab.first_error).to_pylist()
    elif lab.labels:
        fe = [None if ls is None or None in ls else next((i for i, x in enumerate(ls) if not x), -1)
              for ls in table.column(lab.labels[0]).to_pylist()]
    else:
        fe = [None] * table.num_rows
    return [f if m and f is not None else None for f, m in zip(fe, mask)]


def summary(table: pa.Table, lab: Labeller, fe: list[int | None]) -> dict[str, Any]:
    """The labeller's figures over every row (see the module docstring)."""
    mask = labelled_mask(table, lab)
    doc: dict[str, Any] = {"rows": int(mask.sum()), "statuses": {}, "balance": {}, "first_error": {}, "by_position": {}}
    if lab.status:
        counts = Counter(table.column(lab.status).cast(pa.string()).to_pylist())
        doc["statuses"] = {("null" if k is None else k): v for k, v in counts.most_common()}
    for c in lab.labels:
        values, valid, _ = _flat(table, c, mask)
        doc["balance"][c] = {"true": int((values[valid] == 1).sum()), "false": int((values[valid] == 0).sum()),
                             "null": int((~valid).sum())}
    hist = Counter(f for f in fe if f is not None)
    doc["first_error"] = {str(k): hist[k] for k in sorted(hist)}
    for c in lab.values:
        values, valid, pos = _flat(table, c, mask)
        keep = valid & (pos < MAX_POSITIONS)
        if not keep.any():
            continue
        n = np.bincount(pos[keep], minlength=1)
        s = np.bincount(pos[keep], weights=values[keep], minlength=1)
        doc["by_position"][c] = [[i, round(float(s[i] / n[i]), 4), int(n[i])] for i in range(len(n)) if n[i]]
    return doc


def read_trees(paths: list[Path], problems: set[str], max_nodes: int = 400) -> dict[str, list]:
    """The ``--tree-out`` nodes of ``problems`` (``mcts_label.NODE_SCHEMA``): per problem, up to ``max_nodes``
    nodes as ``[node, parent, depth, step, visits, rollouts, successes, value_own, value_subtree]`` (node
    ids without the problem prefix; the step clipped to 400 characters; a node in two files once).

    Raises:
        InputError: a file without the node columns.
    """
    need = ["problem_id", "node_id", "parent_id", "depth", "step", "visits", "rollouts", "successes",
            "value_own", "value_subtree"]
    out: dict[str, list] = {}
    seen: set[tuple[str, str]] = set()  # (a node in two files is drawn once, from the first)
    for p in paths:
        pf = open_parquet(p)
        missing = [c for c in need if c not in pf.schema_arrow.names]
        if missing:
            raise InputError(p, f"is no mcts-label --tree-out file (missing {', '.join(missing)})")
        t = pf.read(columns=need)
        t = t.filter(pc.is_in(t.column("problem_id"), pa.array(sorted(problems), pa.string())))
        for r in t.to_pylist():
            nodes = out.setdefault(r["problem_id"], [])
            if len(nodes) >= max_nodes or (r["problem_id"], r["node_id"]) in seen:
                continue
            seen.add((r["problem_id"], r["node_id"]))
            short = lambda x: None if x is None else x.rsplit("/", 1)[-1]  # noqa: E731
            step = r["step"] if r["step"] is None or len(r["step"]) <= 400 else r["step"][:400] + "…"
            nodes.append([short(r["node_id"]), short(r["parent_id"]), r["depth"], step, r["visits"], r["rollouts"],
                          r["successes"], _round(r["value_own"]), _round(r["value_subtree"])])
    return out


def _round(x):
    return None if x is None else round(float(x), 4)

