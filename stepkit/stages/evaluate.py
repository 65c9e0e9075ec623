"""``eval``: how good are a shard's step labels?

* :func:`processbench_report`: ProcessBench (Zheng et al. 2024) scores of any first-error column against
  the human labels (``reference_first_error``, written by ``ingest processbench``): accuracy on erroneous
  samples (exact index), accuracy on correct samples, and their harmonic mean F1, per split and averaged
  over splits (the paper's "Avg. F1").
* :func:`agreement_report`: the agreement matrix of two labelers' first-error predictions.

A prediction column is either a first-error index (int: ``mc_first_error``, ``judge_first_error``, a
filter's consensus) or per-step hard labels (list<bool>: ``mc_label``, ``judge_label``), read as the index
of the first False (-1 when all are True). A row with no prediction (null: a parse failure, no signal, a
row error of the stage that owns the column, a null label before the first False, a row whose status column
says it has no labels, as the shard declares it: :mod:`stepkit.columns`) is *missing*. An
``error`` from another stage does not hide a column that was written before it. The paper's protocol counts a missing
prediction as wrong (``f1``); ``f1_answered`` scores only the rows with a prediction, and ``coverage``
says how many those are, so a labeler that abstains is neither hidden nor scored as if it had answered.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from stepkit.columns import read_meanings
from stepkit.errors import InputError
from stepkit.grading.verdicts import first_error_of
from stepkit.metrics import processbench_f1
from stepkit.schema import check_column_types
from stepkit.shards import list_shards, open_parquet, read_rows, unfinished_runs


def _kind(path: Path, schema: pa.Schema, column: str) -> str:
    """``index`` or ``labels``; InputError when ``column`` is missing or of another type."""
    if column not in schema.names:
        raise InputError(path, f"missing column (has: {', '.join(schema.names)})", column=column)
    t = schema.field(column).type
    if pa.types.is_integer(t):
        return "index"
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_boolean(t.value_type):
        return "labels"
    raise InputError(path, f"expected a first-error index (int) or step labels (list<bool>), found {t}",
                     column=column)


def _first_error(value, kind: str, n_steps: int | None, path: Path, row: int, column: str) -> int | None:
    """One cell as a first-error prediction (None: missing); InputError for an impossible value."""
    if value is None:
        return None
    if kind == "index":
        k = int(value)
        if k < -1 or (n_steps is not None and k >= n_steps):
            bound = f"-1..{n_steps - 1}" if n_steps is not None else ">= -1"
            raise InputError(path, f"first-error index {k} outside {bound}", row=row, column=column)
        return k
    labels = list(value)
    if n_steps is not None and len(labels) != n_steps:
        raise InputError(path, f"{len(labels)} labels for {n_steps} steps", row=row, column=column)
    return first_error_of(labels) if labels else None


def load_predictions(shard: str | Path, columns: list[str]) -> tuple[list[dict], dict[str, str], list[str]]:
    """First-error predictions of ``columns`` for every row of ``shard`` (a file or folder).

    Each row is ``{"id", "source", "n_steps", <column>: int | None ...}``; cells are checked against
    the row's step count when the shard has ``steps``.

    Returns:
        (rows, kinds, unfinished): kinds maps each column to ``index`` or ``labels``; unfinished lists
        the ``*.parquet.parts`` folders of runs that have not finished (their rows are not there yet).

    Raises:
        InputError: unreadable shard; a missing column; a column of another type, or of another kind
            than in an earlier shard; an index outside -1..M-1 or a label list of another length than
            the steps; an id seen twice (naming file, row and column).
    """
    rows: list[dict] = []
    kinds: dict[str, tuple[str, Path]] = {}
    seen: dict[str, Path] = {}
    shards = list_shards(shard)
    for p in shards:
        schema = open_parquet(p).schema_arrow
        for c in columns:
            k = _kind(p, schema, c)
            if c in kinds and kinds[c][0] != k:
                raise InputError(p, f"holds {'step labels' if k == 'labels' else 'first-error indices'} but "
                                    f"{kinds[c][1].name} holds {'step labels' if kinds[c][0] == 'labels' else 'first-error indices'}",
                                 column=c)
            kinds.setdefault(c, (k, p))
        meanings = read_meanings(schema, p)
        status = {c: meanings.status_of(c) for c in columns}
        extra = [c for c in ("id", "source", "steps") if c in schema.names and c not in columns]
        check_column_types(schema, p, extra)
        read = list(dict.fromkeys(columns + extra + [s for s in status.values() if s]))
        for i, r in enumerate(read_rows(p, columns=read)):
            n = len(r["steps"]) if r.get("steps") is not None else None
            rid = r.get("id")
            if rid is not None:
                if rid in seen:
                    raise InputError(p, f"duplicate id {rid!r}" + (f" (also in {seen[rid].name})" if seen[rid] != p else ""),
                                     row=i, column="id")
                seen[rid] = p
            out = {"id": rid, "source": r.get("source"), "n_steps": n}
            for c in columns:
                labelled = meanings.row_has_labels(r, c)
                out[c] = _first_error(r.get(c), kinds[c][0], n, p, i, c) if labelled else None
            rows.append(out)
    folder = Path(shard)
    unfinished = [str(x) for x in unfinished_runs(folder)] if folder.is_dir() else []  # (list_shards warned)
    return rows, {c: k for c, (k, _) in kinds.items()}, unfinished


def split_of(row: dict) -> str:
    """The benchmark split of a row: ``gsm8k`` for source ``processbench/gsm8k/<id>``, else ``all``."""
    parts = (row.get("source") or "").split("/")
    return parts[1] if len(parts) >= 3 and parts[0] == "processbench" else "all"


def _scores(gold: list[int], pred: list[int | None]) -> dict[str, Any]:
    full = processbench_f1(gold, pred)
    answered = [(g, p) for g, p in zip(gold, pred) if p is not None]
    ans = processbench_f1([g for g, _ in answered], [p for _, p in answered])
    return {"rows": len(gold), **full, "missing": len(gold) - len(answered),
            "coverage": len(answered) / len(gold) if gold else None,
            "acc_erroneous_answered": ans["acc_erroneous"], "acc_correct_answered": ans["acc_correct"],
            "f1_answered": ans["f1"]}


def processbench_report(shard: str | Path, pred: str, gold: str = "reference_first_error") -> dict[str, Any]:
    """ProcessBench scores of the ``pred`` column of ``shard`` against ``gold``.

    Args:
        shard: a trajectory shard or folder (e.g. ``ingest processbench`` -> ``mc-label`` -> ``judge``).
        pred: a first-error (int) or step-label (list<bool>) column.
        gold: the human first-error column (0-based, -1 = no error).

    Returns:
        ``{"pred", "gold", "splits": {split: scores}, "average": {...}, "no_gold": n}``. Scores hold
        ``acc_erroneous``, ``acc_correct``, ``f1`` (fractions in [0, 1]; missing predictions count as
        wrong, the paper's protocol), ``f1_answered`` (missing predictions left out), ``coverage``,
        ``missing``, ``n_erroneous``, ``n_correct``, ``rows``. ``average`` is the mean over splits of
        ``f1`` and ``f1_answered`` (None when a split has no F1). Rows whose gold label is null (e.g.
        flagged inconsistent at import) are left out and counted in ``no_gold``; ``unfinished`` lists
        runs in the folder that have not finished (their rows are missing from the scores).

    Raises:
        InputError: see :func:`load_predictions`; a gold column of step labels; no row with a gold label.
    """
    rows, kinds, unfinished = load_predictions(shard, [pred, gold])
    if kinds[gold] != "index":
        raise InputError(shard, "the gold column must hold first-error indices (int)", column=gold)
    by_split: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    no_gold = 0
    for r in rows:
        if r[gold] is None:
            no_gold += 1
            continue
        g, p = by_split[split_of(r)]
        g.append(r[gold])
        p.append(r[pred])
    if not by_split:
        raise InputError(shard, "no row has a gold first-error label", column=gold)
    splits = {s: _scores(g, p) for s, (g, p) in sorted(by_split.items())}

    def mean(key):
        vals = [v[key] for v in splits.values()]
        return None if any(x is None for x in vals) else sum(vals) / len(vals)

    return {"pred": pred, "gold": gold, "splits": splits, "no_gold": no_gold, "unfinished": unfinished,
            "average": {"f1": mean("f1"), "f1_answered": mean("f1_answered"),
                        "rows": sum(v["rows"] for v in splits.values())}}


def _category(x: int | None, cap: int) -> str:
    if x is None:
        return "none"
    return str(x) if x < cap else f">={cap}"


def agreement_report(shard: str | Path, a: str, b: str, cap: int = 8) -> dict[str, Any]:
    """How two labelers' first-error predictions agree, row by row.

    Args:
        shard: a shard or folder holding both columns (e.g. ``mc-label`` then ``judge`` on one shard).
        a, b: first-error (int) or step-label (list<bool>) columns.
        cap: indices >= ``cap`` share one matrix bucket.

    Returns:
        ``rows``; ``both`` (rows where both predict); over those: ``exact`` (same index),
        ``error_vs_none`` agreement (both say "some step is wrong" or both "-1") and its Cohen's kappa,
        ``a_earlier``/``b_earlier`` (both name an error, at different steps); ``a_missing``/``b_missing``;
        ``matrix``: {a category: {b category: count}} over -1, 0 .. cap-1, ``>=cap`` and ``none``.

    Raises:
        InputError: see :func:`load_predictions`.
    """
    rows, _, unfinished = load_predictions(shard, [a, b])
    pa_, pb = [r[a] for r in rows], [r[b] for r in rows]
    matrix: dict[str, Counter] = defaultdict(Counter)
    for x, y in zip(pa_, pb):
        matrix[_category(x, cap)][_category(y, cap)] += 1
    both = [(x, y) for x, y in zip(pa_, pb) if x is not None and y is not None]
    n = len(both)
    exact = sum(x == y for x, y in both)
    ea = [x >= 0 for x, _ in both]
    eb = [y >= 0 for _, y in both]
    agree_bin = sum(p == q for p, q in zip(ea, eb))
    kappa = None
    if n:
        po = agree_bin / n
        pa1, pb1 = sum(ea) / n, sum(eb) / n
        pe = pa1 * pb1 + (1 - pa1) * (1 - pb1)
        kappa = None if pe == 1 else (po - pe) / (1 - pe)
    order = ["-1"] + [str(i) for i in range(cap)] + [f">={cap}", "none"]
    return {"a": a, "b": b, "rows": len(rows), "both": n, "unfinished": unfinished,
            "exact": exact / n if n else None, "error_vs_none": agree_bin / n if n else None, "kappa": kappa,
            "a_earlier": sum(0 <= x < y for x, y in both), "b_earlier": sum(0 <= y < x for x, y in both),
            "a_missing": sum(x is None for x in pa_), "b_missing": sum(y is None for y in pb),
            "matrix": {ka: {kb: matrix[ka][kb] for kb in order if matrix[ka][kb]} for ka in order if ka in matrix}}


def print_processbench(report: dict, console) -> None:
    """Rich table of :func:`processbench_report` (percentages, as the paper reports them)."""
    from rich.table import Table

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}"

    t = Table(title=f"ProcessBench: {report['pred']} vs {report['gold']} (accuracies and F1 in %)")
    for c in ("split", "rows", "erroneous", "correct", "acc err", "acc corr", "F1", "missing", "F1 answered"):
        t.add_column(c, justify="left" if c == "split" else "right")
    for s, v in report["splits"].items():
        t.add_row(s, str(v["rows"]), str(v["n_erroneous"]), str(v["n_correct"]), pct(v["acc_erroneous"]),
                  pct(v["acc_correct"]), pct(v["f1"]), str(v["missing"]), pct(v["f1_answered"]))
    if len(report["splits"]) > 1:
        avg = report["average"]
        t.add_row("average", str(avg["rows"]), "", "", "", "", pct(avg["f1"]), "", pct(avg["f1_answered"]))
    console.print(t)
    console.print("[dim]F1 counts rows with no prediction (missing) as wrong, as the paper does; F1 answered "
                  "leaves them out; '-': a class with no rows to score[/dim]")
    _warn_unfinished(report, console)
    if report["no_gold"]:
        console.print(f"{report['no_gold']} row(s) without a gold label left out")


def print_agreement(report: dict, console) -> None:
    """Rich tables of :func:`agreement_report`: the summary and the matrix (rows: a, columns: b)."""
    from rich.table import Table

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    s = Table(title=f"agreement: {report['a']} (a) vs {report['b']} (b)", show_header=False)
    s.add_row("rows", str(report["rows"]))
    s.add_row("both predict", str(report["both"]))
    s.add_row("same first error", pct(report["exact"]))
    s.add_row("agree error vs no error", pct(report["error_vs_none"]))
    s.add_row("Cohen's kappa (error vs no error)", "-" if report["kappa"] is None else f"{round(report['kappa'], 3) + 0.0:.3f}")
    s.add_row("both name an error, a's is earlier", str(report["a_earlier"]))
    s.add_row("both name an error, b's is earlier", str(report["b_earlier"]))
    s.add_row("a missing / b missing", f"{report['a_missing']} / {report['b_missing']}")
    console.print(s)
    _warn_unfinished(report, console)
    cols = sorted({kb for row in report["matrix"].values() for kb in row},
                  key=lambda k: (k == "none", k.startswith(">="), int(k) if k.lstrip("-").isdigit() else 0))
    m = Table(title="first error: a (rows) x b (columns); -1 = no error, none = no prediction")
    m.add_column("a \\ b")
    for c in cols:
        m.add_column(c, justify="right")
    for ka, row in report["matrix"].items():
        m.add_row(ka, *[str(row.get(c, "")) for c in cols])
    console.print(m)


def _warn_unfinished(report: dict, console) -> None:
    if report.get("unfinished"):  # (the warning line itself came from reading the folder: shards.list_shards)
        console.print(f"{len(report['unfinished'])} unfinished run(s) in the folder: their rows are not scored")
