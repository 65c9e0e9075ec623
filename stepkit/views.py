"""``stepkit stats`` and ``stepkit show``: rich views of a shard.

This module draws what every shard has (rows, steps, outcomes, errors, the step table); each stage adds
its own part through a :class:`StageView` declared beside its command (``stepkit/cli/<stage>.py``), so
adding a stage touches no branch here (``docs/architecture.md``, "Adding a stage").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from stepkit.errors import InputError
from stepkit.schema import error_reason
from stepkit.shards import list_shards, mixed_configuration, read_manifest, read_rows


@dataclass(frozen=True)
class StageView:
    """How ``stats`` and ``show`` present one stage's columns.

    Attributes:
        marker: a column the stage always writes; its presence on a row means the stage ran there.
        stats: ``stats(rows, console, figs, shards)`` prints the stage's tables for the rows that have
            ``marker`` and adds its figures to ``figs``.
        status_column: the stage's status column, which ``show --status`` matches.
        header: ``header(row) -> str | None``, a line under the prompt (text is escaped by the caller).
        step_columns: ``step_columns(row) -> [(title, justify)]``, extra columns of the step table
            (empty when the row has no labels from this stage).
        step_cells: ``step_cells(row, s) -> (cells, style or None)`` for step ``s``.
        footer: ``footer(row, console)`` prints what follows the step table (e.g. the last reply).
    """

    marker: str
    stats: Callable | None = None
    status_column: str | None = None
    header: Callable | None = None
    step_columns: Callable | None = None
    step_cells: Callable | None = None
    footer: Callable | None = None


def make_console(stderr: bool = False) -> Console:
    """A rich console; 120 columns when not writing to a terminal (rich would wrap at 80)."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 120)


def _load(shard) -> list[dict]:
    rows = []
    for p in list_shards(shard):
        rows.extend(read_rows(p))
    return rows


def _fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def print_stats(shard, views: list[StageView] = (), console: Console | None = None) -> dict:
    """Print the summary tables of a trajectory shard (or folder) and return the figures as a dict.

    Figures: rows, steps (total, mean, max), outcome accuracy (of rows with an outcome), rows with no
    final answer, errors by reason; then each stage's own figures from ``views`` (for the rows that
    stage wrote), e.g. mc-label's value by step position and first-error histogram. A folder whose
    shards were made with different settings gets a warning line naming two of them and the setting
    (:func:`~stepkit.shards.mixed_configuration`; also ``figs["mixed_configuration"]``).
    """
    console = console or make_console()
    rows = _load(shard)
    figs: dict = {"rows": len(rows)}
    t = Table(title=escape(f"{shard}"), show_header=False)
    t.add_row("rows", str(len(rows)))
    if any("steps" in r for r in rows):
        n_steps = [len(r.get("steps") or []) for r in rows]
        figs["steps"] = sum(n_steps)
        t.add_row("steps", f"{sum(n_steps)} (mean {sum(n_steps) / len(rows):.1f}, max {max(n_steps)})")
    if any("outcome_correct" in r for r in rows):
        graded = [r["outcome_correct"] for r in rows if r.get("outcome_correct") is not None]
        figs["outcome_accuracy"] = sum(graded) / len(graded) if graded else None
        t.add_row("outcome accuracy", f"{_fmt(figs['outcome_accuracy'], 3)} ({sum(graded)}/{len(graded)})")
        figs["no_final_answer"] = sum(1 for r in rows if r.get("final_answer") is None)
        t.add_row("no final answer", str(figs["no_final_answer"]))
    if any("reference_answer" in r for r in rows):
        t.add_row("with reference answer", str(sum(1 for r in rows if r.get("reference_answer"))))
    if any("source_outcome_correct" in r for r in rows):
        both = [r for r in rows if r.get("source_outcome_correct") is not None and r.get("outcome_correct") is not None]
        if both:
            agree = sum(r["source_outcome_correct"] == r["outcome_correct"] for r in both)
            t.add_row("outcome agrees with source file", f"{agree}/{len(both)}")
    errors = Counter(error_reason(r["error"]) for r in rows if r.get("error"))
    figs["errors"] = dict(errors)
    t.add_row("rows with error", str(sum(errors.values())))
    console.print(t)

    shards = list_shards(shard)
    for view in views:
        if view.stats and any(view.marker in r for r in rows):
            view.stats([r for r in rows if view.marker in r], console, figs, shards)
    if errors:
        et = Table(title="errors by reason")
        et.add_column("reason")
        et.add_column("rows", justify="right")
        for k, v in errors.most_common():
            et.add_row(Text(str(k)), str(v))
        console.print(et)
    for p in shards:
        m = read_manifest(p)
        if m:
            cfg = m.get("config", {})
            eng = cfg.get("engine") if isinstance(cfg.get("engine"), dict) else {}
            console.print(Text(f"{p.name}: stage {m.get('stage')}, stepkit {m.get('stepkit_version')}, "
                               f"engine {eng.get('name', '-')}, model {eng.get('model', '-')}", style="dim"))
    mixed = mixed_configuration(shards)
    if mixed:
        figs["mixed_configuration"] = mixed
        console.print(Text(f"warning: {shard}: {mixed}", style="yellow"), soft_wrap=True)
    return figs


def _text(x) -> str:
    return "-" if x is None else str(x)


def print_row(shard, row_id: str | None = None, index: int | None = None, status: str | None = None,
              views: list[StageView] = (), console: Console | None = None) -> dict:
    """Print one trajectory: its header, each step with the columns every stage in ``views`` adds
    (MC counts, value and label colored by value; the judge's verdict and votes), then each stage's
    footer (the last judge reply). Text from the shard is shown as written, never read as markup.

    Picks the row with id ``row_id``, else the ``index``-th row, else the first row (of those whose
    status column of some stage is ``status``, when given).

    Raises:
        InputError: no row with that id / index / status.
    """
    console = console or make_console()
    if row_id is not None and index is not None:
        raise InputError(shard, "give --id or --index, not both")
    rows = _load(shard)
    if rows and not any("steps" in r for r in rows):
        raise InputError(shard, "has no 'steps' column: show displays trajectory shards")
    present_cols = set().union(*(r.keys() for r in rows)) if rows else set()
    status_cols = [v.status_column for v in views if v.status_column and v.status_column in present_cols]
    if status is not None:
        every = rows
        rows = [r for r in rows if any(r.get(c) == status for c in status_cols)]
        if not rows:
            have = sorted({str(r.get(c)) for r in every for c in status_cols if r.get(c)})
            raise InputError(shard, f"no row with {' or '.join(status_cols) or 'a status column'} {status!r} "
                                    f"(present: {', '.join(have) or 'none'})")
    if not rows:
        raise InputError(shard, "shard has no rows")
    if row_id is not None:
        match = [r for r in rows if r.get("id") == row_id]
        if not match:
            raise InputError(shard, f"no row with id {row_id!r}")
        row = match[0]
    else:
        i = index or 0
        if i >= len(rows):
            raise InputError(shard, f"row index {i} out of range (shard has {len(rows)} rows)")
        row = rows[i]
    head = Text()
    head.append(f"{row.get('id')}  ", style="bold")
    head.append(f"generator {row.get('generator')}  reference {_text(row.get('reference_answer'))}  "
                f"final {_text(row.get('final_answer'))}  ")
    oc = row.get("outcome_correct")
    head.append("correct" if oc else "incorrect" if oc is not None else "ungraded",
                style="green" if oc else "red" if oc is not None else "dim")
    console.print(head)
    console.print(Text(row.get("prompt") or "", style="italic"))
    if row.get("reference_first_error") is not None:
        console.print(Text(f"human first error {row['reference_first_error']}"))
    present = [v for v in views if v.marker in row]
    for view in present:
        line = view.header(row) if view.header else None
        if line:
            console.print(Text(line))
    t = Table(show_lines=False)
    t.add_column("#", justify="right")
    t.add_column("step")
    cols = {id(v): (v.step_columns(row) if v.step_columns else []) for v in present}
    for v in present:
        for title, justify in cols[id(v)]:
            t.add_column(title, justify=justify)
    for s, step in enumerate(row.get("steps") or []):
        cells, style = [str(s), Text(step)], None
        for v in present:
            if cols[id(v)]:
                more, st = v.step_cells(row, s)
                cells += [Text(str(c)) for c in more]
                style = st or style
        t.add_row(*cells, style=style)
    console.print(t)
    for view in present:
        if view.footer:
            view.footer(row, console)
    if row.get("error"):
        line = Text("error: ", style="red")
        line.append(str(row["error"]))
        console.print(line)
    return row
