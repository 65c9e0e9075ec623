"""``stepkit stats`` and ``stepkit show``: rich views of a shard."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stepkit.errors import InputError
from stepkit.schema import error_reason
from stepkit.shards import list_shards, read_manifest, read_rows


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


def print_stats(shard, console: Console | None = None) -> dict:
    """Print the summary tables of a trajectory shard (or folder) and return the figures as a dict.

    Figures: rows, steps (total, mean, max), outcome accuracy (of rows with an outcome), rows with no
    final answer, MC value by step position (mean, n), first-error histogram (incl. -1 = no error and
    null = no signal), mc_status counts, errors by reason, truncated continuations.
    """
    console = console or make_console()
    rows = _load(shard)
    figs: dict = {"rows": len(rows)}
    t = Table(title=f"{shard}", show_header=False)
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

    if any("rollout_finish_reason" in r for r in rows):
        _rollout_tables([r for r in rows if "rollout_finish_reason" in r], console, figs)
    if any("mc_value" in r for r in rows):
        _mc_tables([r for r in rows if "mc_value" in r], console, figs, shard)
    if any("judge_status" in r for r in rows):
        _judge_table([r for r in rows if "judge_status" in r], console, figs)
    if errors:
        et = Table(title="errors by reason")
        et.add_column("reason")
        et.add_column("rows", justify="right")
        for k, v in errors.most_common():
            et.add_row(str(k), str(v))
        console.print(et)
    for p in list_shards(shard):
        m = read_manifest(p)
        if m:
            cfg = m.get("config", {})
            console.print(f"[dim]{p.name}: stage {m.get('stage')}, stepkit {m.get('stepkit_version')}, "
                          f"engine {cfg.get('engine', {}).get('name', '-') if isinstance(cfg.get('engine'), dict) else '-'}, "
                          f"model {cfg.get('engine', {}).get('model', '-') if isinstance(cfg.get('engine'), dict) else '-'}[/dim]")
    return figs


def _rollout_tables(rows, console, figs):
    by_problem: dict[str, list[dict]] = {}
    for r in rows:
        by_problem.setdefault(r["problem_id"], []).append(r)
    t = Table(title="per problem (rollout)")
    for c in ("problem", "samples", "solve rate", "distinct solutions", "mean steps", "truncated"):
        t.add_column(c, justify="left" if c == "problem" else "right")
    per = {}
    for pid, rs in by_problem.items():
        solved = sum(1 for r in rs if r.get("outcome_correct"))
        distinct = len({"\n".join(r.get("steps") or []) for r in rs})
        trunc = sum(1 for r in rs if r.get("rollout_finish_reason") == "length")
        mean_steps = sum(len(r.get("steps") or []) for r in rs) / len(rs)
        per[pid] = {"samples": len(rs), "solve_rate": solved / len(rs), "distinct": distinct,
                    "mean_steps": mean_steps, "truncated": trunc}
        t.add_row(pid, str(len(rs)), f"{solved / len(rs):.2f}", str(distinct), f"{mean_steps:.1f}", str(trunc))
    figs["per_problem"] = per
    console.print(t)


def _mc_tables(rows, console, figs, shard):
    status = Counter(r.get("mc_status") for r in rows)
    figs["mc_status"] = dict(status)
    by_pos: dict[int, list[float]] = {}
    trunc = sum(sum(r.get("mc_truncated") or []) for r in rows)
    cont = sum(sum(r.get("mc_rollouts") or []) for r in rows)
    for r in rows:
        for s, v in enumerate(r.get("mc_value") or []):
            if v is not None and s < len(r["steps"]) - 1:  # the last value is the graded outcome
                by_pos.setdefault(s, []).append(v)
    t = Table(title="MC value by step position (estimated prefixes; last step = outcome excluded)")
    for c in ("step", "n", "mean value", "share == 0", "share == 1"):
        t.add_column(c, justify="right")
    figs["value_by_position"] = {}
    for s in sorted(by_pos):
        vs = by_pos[s]
        figs["value_by_position"][s] = sum(vs) / len(vs)
        t.add_row(str(s), str(len(vs)), f"{sum(vs) / len(vs):.3f}", f"{sum(v == 0 for v in vs) / len(vs):.2f}",
                  f"{sum(v == 1 for v in vs) / len(vs):.2f}")
    console.print(t)
    fe = Counter(r.get("mc_first_error") for r in rows if r.get("mc_status") is not None)
    figs["first_error_histogram"] = {str(k): v for k, v in fe.items()}
    h = Table(title="first error (mc_first_error)")
    h.add_column("step")
    h.add_column("rows", justify="right")
    for k in sorted(fe, key=lambda x: (x is None, x if x is not None else 0)):
        h.add_row("none (-1)" if k == -1 else "no signal" if k is None else str(k), str(fe[k]))
    console.print(h)
    s = Table(title="MC labelling", show_header=False)
    s.add_row("status", ", ".join(f"{k}: {v}" for k, v in status.items()))
    counts = [m.get("counts", {}) for m in map(read_manifest, list_shards(shard)) if m and m.get("stage") == "mc-label"]
    if counts:  # the manifests count v_0's continuations too
        cont = sum(c.get("continuations", 0) for c in counts)
        trunc = sum(c.get("truncated", 0) for c in counts)
    s.add_row("continuations (incl. v0)" if counts else "continuations from step prefixes", str(cont))
    s.add_row("truncated (excluded from values)", str(trunc))
    figs["continuations"], figs["truncated"] = cont, trunc
    console.print(s)


def _judge_table(rows, console, figs):
    status = Counter(r.get("judge_status") for r in rows)
    fe = Counter(r.get("judge_first_error") for r in rows if r.get("judge_status") == "ok")
    figs["judge_status"] = dict(status)
    figs["judge_first_error_histogram"] = {str(k): v for k, v in fe.items()}
    t = Table(title="judge", show_header=False)
    t.add_row("status", ", ".join(f"{k}: {v}" for k, v in status.items()))
    t.add_row("first error", ", ".join(f"{'none (-1)' if k == -1 else k}: {fe[k]}" for k in sorted(fe)))
    t.add_row("replies / parse failures", f"{sum(len(r.get('judge_replies') or []) for r in rows)} / "
                                          f"{sum(r.get('judge_parse_failures') or 0 for r in rows)}")
    t.add_row("rows with a tied vote", str(sum(bool(r.get("judge_tie")) for r in rows)))
    console.print(t)


def _text(x) -> str:
    return "-" if x is None else str(x)


def _value_style(v) -> str:
    if v is None:
        return "dim"
    return "green" if v >= 0.5 else "yellow" if v > 0 else "red"


def print_row(shard, row_id: str | None = None, index: int | None = None, status: str | None = None,
              console: Console | None = None) -> dict:
    """Print one trajectory, each step with its MC counts, value and label (colored by value) and the
    judge's verdict with its votes, then the last judge reply.

    Picks the row with id ``row_id``, else the ``index``-th row, else the first row (of those whose
    ``mc_status`` or ``judge_status`` is ``status``, when given).

    Raises:
        InputError: no row with that id / index / status.
    """
    console = console or make_console()
    if row_id is not None and index is not None:
        raise InputError(shard, "give --id or --index, not both")
    rows = _load(shard)
    if rows and not any("steps" in r for r in rows):
        raise InputError(shard, "has no 'steps' column: show displays trajectory shards")
    if status is not None:
        rows = [r for r in rows if status in (r.get("mc_status"), r.get("judge_status"))]
        if not rows:
            have = sorted({str(r.get(c)) for r in _load(shard) for c in ("mc_status", "judge_status") if r.get(c)})
            raise InputError(shard, f"no row with mc_status or judge_status {status!r} (present: {', '.join(have) or 'none'})")
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
    console.print(Text(row.get("prompt", ""), style="italic"))
    if row.get("mc_value_start") is not None or "mc_value" in row:
        console.print(f"v0 (bare problem) = {_fmt(row.get('mc_value_start'))}   status {row.get('mc_status')}   "
                      f"first error {_text(row.get('mc_first_error'))}"
                      + (f"   human first error {row.get('reference_first_error')}" if row.get("reference_first_error") is not None else ""))
    if row.get("judge_status") is not None:
        console.print(f"judge: status {row['judge_status']}   first error {_text(row.get('judge_first_error'))}   "
                      f"valid votes {row.get('judge_valid_votes')}   parse failures {row.get('judge_parse_failures')}"
                      + ("   tie" if row.get("judge_tie") else "")
                      + (f"   human first error {row.get('reference_first_error')}"
                         if row.get("reference_first_error") is not None and "mc_value" not in row else ""))
    t = Table(show_lines=False)
    t.add_column("#", justify="right")
    t.add_column("step")
    has_mc = bool(row.get("mc_value"))
    has_judge = bool(row.get("judge_label"))
    if has_mc:
        for c in ("succ/roll", "trunc", "value", "progress", "label"):
            t.add_column(c, justify="right")
    if has_judge:
        t.add_column("judge", justify="right")
    for s, step in enumerate(row.get("steps") or []):
        cells = [str(s), step]
        style = None
        if has_mc:
            v = row["mc_value"][s]
            est = (row.get("mc_estimated") or [True] * len(row["steps"]))[s]
            last = s == len(row["steps"]) - 1
            lab = row["mc_label"][s] if row.get("mc_label") else None
            cells += ["outcome" if last else f"{row['mc_successes'][s]}/{row['mc_rollouts'][s]}",
                      str(row["mc_truncated"][s]), _fmt(v), _fmt(row["mc_progress"][s]),
                      ("?" if lab is None else "ok" if lab else "WRONG") + ("" if est else " (inferred)")]
            style = _value_style(v)
            if row.get("mc_first_error") == s:
                style = "bold red"
        if has_judge:
            ok = row["judge_label"][s]
            cells.append(f"{'ok' if ok else 'WRONG'} ({row['judge_correct_votes'][s]}/{row['judge_valid_votes']} say ok)")
        t.add_row(*cells, style=style)
    console.print(t)
    if row.get("judge_replies"):
        reply = row["judge_replies"][-1]
        console.print(Text(f"last judge reply ({len(row['judge_replies'])} in all):", style="bold"))
        console.print(Text(reply if len(reply) <= 1500 else reply[:700] + " [...] " + reply[-700:], style="dim"))
    if row.get("error"):
        console.print(f"[red]error:[/red] {row['error']}")
    return row
