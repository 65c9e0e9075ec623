"""``stepkit stats`` and ``stepkit show``: rich views of a shard.

This module draws what every shard has (rows, steps, outcomes, errors, the step table); each stage adds
its own part through a :class:`StageView` declared beside its command (``stepkit/cli/<stage>.py``), so
adding a stage touches no branch here (``docs/architecture.md``, "Adding a stage").

A row of ``ingest messages`` (a tool-calling conversation, :mod:`stepkit.conversations`) is shown as the
conversation: each message with its role, each turn's tool calls (name and arguments) and its labels,
tool results and system messages clipped; ``stats`` adds turns, tool calls and per-turn label figures.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from stepkit.columns import Column, read_meanings
from stepkit.console import make_console
from stepkit.conversations import ConversationError, message_text, tool_calls
from stepkit.errors import InputError
from stepkit.schema import check_column_types, error_reason
from stepkit.shards import (
    iter_record_batches,
    list_shards,
    mixed_configuration,
    open_parquet,
    read_manifest,
    read_rows,
)


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
        stream: ``stream(shards)`` -> an object with ``columns`` (what it reads besides the step count,
            :func:`n_steps`), ``add(rows)`` (rows of a record batch, in file order, only those columns) and
            ``print(console, figs, shards)``, doing what ``stats`` does without holding the rows (``shards``:
            the paths ``stats`` reads, whose manifests may make some columns unneeded); None: ``stats`` is
            given every row at once.
    """

    marker: str
    stats: Callable | None = None
    status_column: str | None = None
    header: Callable | None = None
    step_columns: Callable | None = None
    step_cells: Callable | None = None
    footer: Callable | None = None
    stream: Callable | None = None


def _load(shard) -> list[dict]:
    rows = []
    for p in list_shards(shard):
        rows.extend(read_rows(p))
    return rows


def _declared(shard) -> dict[str, Column]:
    """The declared columns (:mod:`stepkit.columns`) of every shard of ``shard``, by name."""
    out: dict[str, Column] = {}
    for p in list_shards(shard):
        out.update(read_meanings(open_parquet(p).schema_arrow, p).columns)
    return out


def finite(xs) -> list[float]:
    """The non-null, finite numbers of ``xs`` (numbers or bools): null, NaN and ±inf are left out, as
    ``filter`` reads them (``stepkit/stages/filter_rules.py``), so no statistic of ``stats`` is NaN."""
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def mean(xs) -> float | None:
    """The mean of the finite numbers of ``xs`` (:func:`finite`); None when there are none."""
    v = finite(xs)
    return sum(v) / len(v) if v else None


def share(pred: Callable, xs) -> float | None:
    """The share of the finite numbers of ``xs`` for which ``pred`` holds; None when there are none."""
    v = finite(xs)
    return sum(1 for x in v if pred(x)) / len(v) if v else None


def stat(x: float | None, n: int, digits: int = 3, what: str = "values") -> str:
    """A statistic as ``stats`` prints it: ``x`` to ``digits`` places, or ``n/a (N values)`` when it is
    undefined (None: computed from ``n`` = no finite values, or 0/0), never ``nan``."""
    return f"n/a ({n} {what})" if x is None else f"{x:.{digits}f}"


def left_out(xs) -> int:
    """How many entries of ``xs`` are NaN or ±inf (not null): the values a statistic left out."""
    return sum(1 for x in xs if x is not None and not math.isfinite(x))


def number(x, digits=2, none="n/a"):
    """A number as ``show`` and ``stats`` print it: ``digits`` places; ``none`` for null; ``n/a (NaN)`` or
    ``n/a (inf)`` for a value that is not finite (a shard written elsewhere may hold them), never ``nan``."""
    if x is None:
        return none
    return f"{x:.{digits}f}" if math.isfinite(x) else f"n/a ({'NaN' if x != x else 'inf' if x > 0 else '-inf'})"


STREAM_ROWS = 8192  # rows per record batch ``stats`` reads when every view present streams (the tests: fewer)
N_STEPS = "_stepkit_n_steps"  # a streamed row's step count (its steps' text is never read into Python)


def n_steps(row: dict) -> int:
    """The number of steps of a row given to a ``stats`` view: a streamed row carries the count
    (:data:`N_STEPS`), a whole row its ``steps`` (null or absent: 0)."""
    return row[N_STEPS] if N_STEPS in row else len(row.get("steps") or [])


class _Summary:
    """The figures every shard has (``print_stats``' first table and its errors table), added batch by
    batch (:meth:`add`, rows in file order) so that ``stats`` never holds a shard."""

    COLUMNS = ("outcome_correct", "final_answer", "reference_answer", "source_outcome_correct", "error")

    def __init__(self):
        self.rows = self.steps = self.max_steps = self.graded = self.correct = self.no_final = 0
        self.with_reference = self.both = self.agree = 0
        self.has = {"steps": False, "outcome_correct": False, "reference_answer": False,
                    "source_outcome_correct": False}
        self.errors: Counter = Counter()

    def add(self, rows: list[dict]) -> None:
        for r in rows:
            self.rows += 1
            if "steps" in r or N_STEPS in r:
                self.has["steps"] = True
            n = n_steps(r)
            self.steps, self.max_steps = self.steps + n, max(self.max_steps, n)
            for c in ("outcome_correct", "reference_answer", "source_outcome_correct"):
                self.has[c] = self.has[c] or c in r
            if r.get("outcome_correct") is not None:
                self.graded += 1
                self.correct += r["outcome_correct"]
            self.no_final += r.get("final_answer") is None
            self.with_reference += bool(r.get("reference_answer"))
            if r.get("source_outcome_correct") is not None and r.get("outcome_correct") is not None:
                self.both += 1
                self.agree += r["source_outcome_correct"] == r["outcome_correct"]
            if r.get("error"):
                self.errors[error_reason(r["error"])] += 1

    def print(self, shard, console: Console, figs: dict) -> None:
        figs["rows"] = self.rows
        t = Table(title=escape(f"{shard}"), show_header=False)
        t.add_row("rows", str(self.rows))
        if self.has["steps"]:
            figs["steps"] = self.steps
            t.add_row("steps", f"{self.steps} (mean {self.steps / self.rows:.1f}, max {self.max_steps})")
        if self.has["outcome_correct"]:
            figs["outcome_accuracy"] = self.correct / self.graded if self.graded else None
            t.add_row("outcome accuracy", f"{number(figs['outcome_accuracy'], 3)} ({self.correct}/{self.graded})")
            figs["no_final_answer"] = self.no_final
            t.add_row("no final answer", str(self.no_final))
        if self.has["reference_answer"]:
            t.add_row("with reference answer", str(self.with_reference))
        if self.has["source_outcome_correct"] and self.both:
            t.add_row("outcome agrees with source file", f"{self.agree}/{self.both}")
        figs["errors"] = dict(self.errors)
        t.add_row("rows with error", str(sum(self.errors.values())))
        console.print(t)

    def print_errors(self, console: Console) -> None:
        if self.errors:
            et = Table(title="errors by reason")
            et.add_column("reason")
            et.add_column("rows", justify="right")
            for k, v in self.errors.most_common():
                et.add_row(Text(str(k)), str(v))
            console.print(et)


def print_stats(shard, views: list[StageView] = (), console: Console | None = None) -> dict:
    """Print the summary tables of a trajectory shard (or folder) and return the figures as a dict.

    Figures: rows, steps (total, mean, max), outcome accuracy (of rows with an outcome), rows with no
    final answer, errors by reason; then each stage's own figures from ``views`` (for the rows that
    stage wrote), e.g. mc-label's value by step position and first-error histogram. A folder whose
    shards were made with different settings gets a warning line naming two of them and the setting
    (:func:`~stepkit.shards.mixed_configuration`; also ``figs["mixed_configuration"]``).

    Undefined statistics: null, NaN and ±inf values are left out of every mean and share (as ``filter`` reads
    them, :func:`finite`); a statistic with nothing left to be computed from (or a 0/0 share) prints
    ``n/a (N values)`` (:func:`stat`) and is None in the figures, so the figures are valid JSON (no NaN).

    Memory: when every view the shards have a column for streams (:attr:`StageView.stream`) and no shard
    holds conversations, the shards are read by record batch (:data:`STREAM_ROWS` rows), only the
    columns the figures use, step counts without the steps' text; else every row is read at once.

    Raises:
        InputError: a shard that cannot be read (naming the file, and the row after which it failed).
    """
    console = console or make_console()
    shards = list_shards(shard)
    for p in shards:  # every column of its declared type (breaking run, 2026-12-03: string steps counted as
        check_column_types(open_parquet(p).schema_arrow, p)  # characters, list<string> values a traceback)
    names = [set(open_parquet(p).schema_arrow.names) for p in shards]
    present = [v for v in views if v.stats and any(v.marker in n for n in names)]
    figs: dict = {}
    summary = _Summary()
    if any("step_messages" in n for n in names) or any(v.stream is None for v in present):
        rows = _load(shard)  # a view that reads whole rows (or conversations): every row at once
        summary.add(rows)
        summary.print(shard, console, figs)
        if any(r.get("step_messages") is not None for r in rows):
            _conversation_stats(shard, rows, console, figs)
        for view in views:
            if view.stats and any(view.marker in r for r in rows):
                view.stats([r for r in rows if view.marker in r], console, figs, shards)
    else:
        import pyarrow.compute as pc

        streams = [(v, v.stream(shards)) for v in present]
        seen = [False] * len(streams)
        for p, have in zip(shards, names):
            mine = [k for k, (v, _) in enumerate(streams) if v.marker in have]
            wanted = [*_Summary.COLUMNS, *(c for k in mine for c in (streams[k][0].marker, *streams[k][1].columns))]
            cols = [c for c in dict.fromkeys(wanted) if c in have and c != "steps"]
            for _, batch in iter_record_batches(p, STREAM_ROWS, cols + (["steps"] if "steps" in have else [])):
                rows = batch.select(cols).to_pylist() if cols else [{} for _ in range(batch.num_rows)]
                if "steps" in have:
                    for r, n in zip(rows, pc.list_value_length(batch.column("steps")).to_pylist()):
                        r[N_STEPS] = n or 0
                summary.add(rows)
                for k in mine:
                    streams[k][1].add(rows)
                    seen[k] = seen[k] or bool(rows)
        summary.print(shard, console, figs)
        for (_, acc), was in zip(streams, seen):
            if was:
                acc.print(console, figs, shards)
    summary.print_errors(console)
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
              views: list[StageView] = (), console: Console | None = None, clip: int = 300) -> dict:
    """Print one trajectory: its header, each step with the columns every stage in ``views`` adds
    (MC counts, value and label colored by value; the judge's verdict and votes) and every other per-step
    label or score column (:func:`label_columns`), then each stage's footer (the last judge reply). A
    conversation (a row with ``step_messages``) is printed message by message instead of as a step table:
    roles, each turn's tool calls and labels, tool results and system messages cut to ``clip`` characters
    (0: whole) with their length. Text from the shard is shown as written, never read as markup.

    Picks the row with id ``row_id``, else the ``index``-th row, else the first row (of those whose
    status column of some stage is ``status``, when given).

    Raises:
        InputError: no row with that id / index / status; a ``step_messages`` entry that is not a JSON
            list of messages.
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
    conversation = row.get("step_messages") is not None
    if not conversation:
        console.print(Text(row.get("prompt") or "", style="italic"))
    if row.get("reference_first_error") is not None:
        console.print(Text(f"human first error {row['reference_first_error']}"))
    present = [v for v in views if v.marker in row]
    for view in present:
        line = view.header(row) if view.header else None
        if line:
            console.print(Text(line))
    cols = {id(v): (v.step_columns(row) if v.step_columns else []) for v in present}
    extra = label_columns(row, present, _declared(shard))

    def step_cells(s: int) -> tuple[list[tuple[str, str]], str | None]:
        """(title, cell) of every label column at step ``s``, and the views' style for the step."""
        cells, style = [], None
        for v in present:
            if cols[id(v)]:
                more, st = v.step_cells(row, s)
                cells += [(title, str(c)) for (title, _), c in zip(cols[id(v)], more)]
                style = st or style
        for c in extra:
            x = row[c][s]
            cells.append((c, ("ok" if x else "WRONG") if isinstance(x, bool) else number(x, 3, none="-")))
            if x is False:
                style = style or "red"
        return cells, style

    if conversation:
        _print_conversation(shard, row, step_cells, console, clip)
    else:
        t = Table(show_lines=False)
        t.add_column("#", justify="right")
        t.add_column("step")
        for v in present:
            for title, justify in cols[id(v)]:
                t.add_column(title, justify=justify)
        for c in extra:
            t.add_column(c, justify="right")
        for s, step in enumerate(row.get("steps") or []):
            cells, style = step_cells(s)
            t.add_row(str(s), Text(step), *(Text(c) for _, c in cells), style=style)
        console.print(t)
    for view in present:
        if view.footer:
            view.footer(row, console)
    if row.get("error"):
        line = Text("error: ", style="red")
        line.append(str(row["error"]))
        console.print(line)
    return row


# ------------------------------------------------------------------------------------------ conversations

LABEL_SUFFIXES = ("_label", "_labels", "_value", "_values", "_score", "_scores")
_STRUCTURE = {"steps", "step_observations", "step_messages"}


def _is_label_list(v, n: int) -> bool:
    return isinstance(v, list) and len(v) == n and any(x is not None for x in v) and \
        all(x is None or isinstance(x, (bool, float)) for x in v)


def label_columns(row: dict, views: list[StageView] = (), declared: dict[str, Column] | None = None) -> list[str]:
    """The row's per-step label and value columns (one bool or float per step) that no view in ``views``
    draws (a view draws its marker's prefix, ``mc_`` for ``mc_value``): those the shard declares per step
    with role ``label`` or ``value`` (``declared``: :mod:`stepkit.columns`), and undeclared ones named like
    labels (``_label``/``_value``/``_score``: a column added by hand, your own ``--step-column``)."""
    n = len(row.get("steps") or [])
    claimed = {v.marker.split("_")[0] for v in views}
    declared = declared or {}

    def labels(c: str) -> bool:
        d = declared.get(c)
        if d is not None:
            return d.per_step and d.role in ("label", "value")
        return c not in _STRUCTURE and c.endswith(LABEL_SUFFIXES)

    return [c for c, v in row.items() if labels(c) and c.split("_")[0] not in claimed and _is_label_list(v, n)]


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with its length noted (``… (N chars)``); 0: whole."""
    return text if not limit or len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


def _turns(shard, row: dict) -> tuple[list[dict], list[list[dict]]]:
    """The prompt messages and each turn's messages of a conversation row (InputError when not JSON, or
    when there is not one ``step_messages`` entry per step)."""
    def parsed(text, column):
        try:
            v = json.loads(text)
        except (TypeError, ValueError):
            v = None
        if not isinstance(v, list) or not all(isinstance(m, dict) for m in v):
            raise InputError(shard, f"row {row.get('id')!r}: not a JSON list of messages", column=column)
        return v

    prompt = parsed(row["prompt_messages"], "prompt_messages") if row.get("prompt_messages") is not None else []
    n = len(row.get("steps") or [])
    if len(row["step_messages"]) != n:  # the labels of step k would be drawn on another turn, or dropped
        raise InputError(shard, f"row {row.get('id')!r}: {len(row['step_messages'])} entries for {n} steps",
                         column="step_messages")
    return prompt, [parsed(t, "step_messages") for t in row["step_messages"]]


def _text_of(m: dict) -> str:
    try:
        return message_text(m)
    except ConversationError:
        return repr(m.get("content"))


def _print_message(m: dict, console: Console, limit: int) -> None:
    role = str(m.get("role"))
    line = Text()
    if role == "tool":
        line.append(f"tool ({m.get('name') or m.get('tool_call_id') or '?'}): ", style="bold magenta")
        line.append(clip(_text_of(m), limit))
    else:
        line.append(f"{role}:", style={"assistant": "bold cyan", "user": "bold green"}.get(role, "bold"))
        text = _text_of(m)
        if text:
            line.append(" " + (clip(text, limit) if role == "system" else text))
    console.print(line)
    if role == "assistant":
        try:
            calls = tool_calls(m)
        except ConversationError as e:
            calls = [(f"(unreadable tool call: {e})", {})]
        for name, args in calls:
            call = Text("  → call ", style="cyan")
            call.append(name, style="bold")
            call.append(" " + clip(json.dumps(args, ensure_ascii=False), limit))
            console.print(call)


def _print_conversation(shard, row: dict, step_cells: Callable, console: Console, limit: int) -> None:
    """The conversation of a row: prompt messages, then per turn a labelled rule and its messages."""
    prompt, turns = _turns(shard, row)
    n_calls = sum(len(t[0].get("tool_calls") or []) for t in turns if t)
    reward = row.get("source_reward")
    console.print(Text(f"{len(turns)} turns, {n_calls} tool calls, reward {'-' if reward is None else reward}",
                       style="dim"))
    for m in prompt:
        _print_message(m, console, limit)
    for k, msgs in enumerate(turns):
        cells, style = step_cells(k)
        rule = Text(f"── turn {k} ──", style=style or "bold")
        rule.append("".join(f"  {title} {cell}" for title, cell in cells))
        console.print(rule)
        for m in msgs:
            _print_message(m, console, limit)


def _conversation_stats(shard, rows: list[dict], console: Console, figs: dict) -> None:
    """``stats`` of conversation rows: turns, tool calls (by name), success, and per-turn labels split by
    whether the turn calls a tool."""
    rows = [r for r in rows if r.get("step_messages") is not None]
    n_turns = [len(r["step_messages"]) for r in rows]
    has_call: list[list[bool]] = []
    names: Counter = Counter()
    for r in rows:
        flags = []
        for msgs in _turns(shard, r)[1]:
            calls = (msgs[0].get("tool_calls") or []) if msgs else []
            names.update(str((c.get("function") or {}).get("name")) for c in calls if isinstance(c, dict))
            flags.append(bool(calls))
        has_call.append(flags)
    turns, calls = sum(n_turns), sum(names.values())
    with_call = sum(sum(f) for f in has_call)
    graded = [r["outcome_correct"] for r in rows if r.get("outcome_correct") is not None]
    rewards = finite(r.get("source_reward") for r in rows)
    fig = {"conversations": len(rows), "turns": turns, "turns_per_conversation": turns / len(rows),
           "tool_calls": calls, "turns_with_tool_calls": with_call,
           "share_turns_with_tool_calls": with_call / turns if turns else None,
           "success_rate": sum(graded) / len(graded) if graded else None,
           "mean_reward": mean(rewards), "tools": dict(names.most_common())}
    t = Table(title="conversations", show_header=False)
    t.add_row("conversations", str(len(rows)))
    t.add_row("turns per conversation", f"{fig['turns_per_conversation']:.1f} (min {min(n_turns)}, max "
                                        f"{max(n_turns)}; {turns} turns)")
    t.add_row("tool calls", f"{calls} ({calls / len(rows):.1f} per conversation)")
    t.add_row("turns with tool calls", f"{with_call}/{turns} ({number(fig['share_turns_with_tool_calls'])})")
    t.add_row("success rate", f"{number(fig['success_rate'], 3)} ({sum(graded)}/{len(graded)})")
    if any(r.get("source_reward") is not None for r in rows):  # (all NaN: n/a, not left out)
        t.add_row("mean reward", stat(fig["mean_reward"], len(rewards), what="rewards"))
    if names:
        t.add_row("tools", Text(", ".join(f"{k} {v}" for k, v in names.most_common(8))
                                + (f", … ({len(names)} tools)" if len(names) > 8 else "")))
    console.print(t)
    declared = _declared(shard)
    cols = sorted({c for r in rows for c in label_columns(r, (), declared)})
    fig["turn_labels"] = {}
    if cols:
        lt = Table(title="labels per turn (turns with / without a tool call)")
        for c in ("column", "turns labelled", "mean", "with tool call", "without", "rows with a false turn"):
            lt.add_column(c, justify="left" if c == "column" else "right")
        for c in cols:
            pairs = [(x, f) for r, fl in zip(rows, has_call) if _is_label_list(r.get(c), len(fl))
                     for x, f in zip(r[c], fl) if x is not None]
            xs = finite(x for x, _ in pairs)  # (a NaN score is no value, as for filter)
            tool, text = finite(x for x, f in pairs if f), finite(x for x, f in pairs if not f)
            hard = all(isinstance(x, bool) for x, _ in pairs)
            wrong = sum(1 for r in rows if isinstance(r.get(c), list) and any(x is False for x in r[c])) \
                if hard else None
            fig["turn_labels"][c] = {"turns": len(xs), "mean": mean(xs), "with_tool_call": mean(tool),
                                     "without_tool_call": mean(text), "rows_with_false": wrong}
            lt.add_row(c, str(len(xs)), stat(mean(xs), len(xs)), stat(mean(tool), len(tool)),
                       stat(mean(text), len(text)), _text(wrong))
        console.print(lt)
    figs["conversations"] = fig
