"""``stepkit mc-label``: the command and its ``stats``/``show`` view (the method: :mod:`stepkit.stages.mc_label`)."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table

from stepkit.cli.common import engine_options, engine_spec, run, runner_options, sampling
from stepkit.options import click_options, from_params
from stepkit.per_row import MIN_DISTINCT_SHARE, ContinuationTally, distinct_share
from stepkit.shards import read_manifest
from stepkit.stages.mc_label import MCLabelConfig
from stepkit.views import StageView, finite, left_out, mean, n_steps, number, share, stat


@click.command("mc-label")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(MCLabelConfig)
@engine_options
@runner_options
def command(inp, out, **kw):
    """Monte Carlo value of every step prefix of the trajectories in IN (Math-Shepherd / OmegaPRM).

    For each prefix steps[:i], K continuations are sampled and graded against the reference answer;
    writes mc_rollouts, mc_successes, mc_truncated, mc_value, mc_label, mc_progress, mc_first_error ...
    """
    from stepkit.prompts import DEFAULT_STOP
    from stepkit.stages.mc_label import MCLabelStage

    cfg = from_params(MCLabelConfig, kw)
    stage = MCLabelStage(cfg, engine_spec(kw), sampling(kw, DEFAULT_STOP + cfg.stop))
    run(stage, inp, out, kw, "mc-label")


class _MCStats:
    """mc-label's part of ``stats``, added batch by batch: value by step position, first-error histogram,
    status and continuations (only numbers are kept: the values by position, the counters)."""

    TALLY = ("mc_rollouts", "mc_truncated", "mc_empty", "mc_distinct")

    def __init__(self, shards=()):
        # With an mc-label manifest at hand its counts are the continuations' (v_0's too): the per-step
        # counts, four list columns, are then neither read nor added up.
        self.from_rows = not _mc_counts(shards)
        self.columns = ("mc_status", "mc_value", "filter_cut_by", "mc_first_error",
                        *(self.TALLY if self.from_rows else ()))
        self.status: Counter = Counter()
        self.by_pos: dict[int, list[float]] = {}  # the finite values at each position
        self.not_finite = 0  # NaN/inf values, left out as null is (a position of only those: n/a)
        self.no_signal = 0
        self.fe: Counter = Counter()
        self.tally = dict.fromkeys(("continuations", "truncated", "empty", *ContinuationTally.NAMES), 0)

    def add(self, rows) -> None:
        for r in rows:
            self.status[r.get("mc_status")] += 1
            if r.get("mc_status") == "no_signal":  # nothing succeeded: its zeros say nothing about the steps
                self.no_signal += 1
            else:
                n = n_steps(r)
                for s, v in enumerate(r.get("mc_value") or []):
                    # the last value is the graded outcome (unless filter cut the steps before the answer)
                    if v is not None and (s < n - 1 or r.get("filter_cut_by")):
                        self.by_pos.setdefault(s, []).extend(finite([v]))
                        self.not_finite += left_out([v])
            # ungraded rows were never labelled: they are in the status counts, not in the histogram
            if r.get("mc_status") in ("ok", "no_signal"):
                self.fe[r.get("mc_first_error")] += 1
        if self.from_rows:
            for k, v in continuation_tally(rows, "mc_").items():
                self.tally[k] += v

    def print(self, console, figs, shards) -> None:
        status, by_pos, no_signal, fe = self.status, self.by_pos, self.no_signal, self.fe
        figs["mc_status"] = dict(status)
        notes = (f"; {no_signal} no_signal row(s) left out" if no_signal else "") + \
            (f"; {self.not_finite} NaN or infinite value(s) left out" if self.not_finite else "")
        t = Table(title=f"MC value by step position (estimated prefixes of rows with a signal; last step = outcome "
                        f"excluded{notes})")
        figs["value_by_position_rows_left_out"] = no_signal
        figs["value_by_position_not_finite"] = self.not_finite
        for c in ("step", "n", "mean value", "share == 0", "share == 1"):
            t.add_column(c, justify="right")
        figs["value_by_position"] = {}
        for s in sorted(by_pos):
            vs = by_pos[s]
            figs["value_by_position"][s] = mean(vs)  # None (n/a) when the position holds no finite value
            t.add_row(str(s), str(len(vs)), stat(mean(vs), len(vs)), stat(share(lambda v: v == 0, vs), len(vs), 2),
                      stat(share(lambda v: v == 1, vs), len(vs), 2))
        console.print(t)
        figs["first_error_histogram"] = {str(k): v for k, v in fe.items()}
        h = Table(title="first error (mc_first_error)")
        h.add_column("step")
        h.add_column("rows", justify="right")
        for k in sorted(fe, key=lambda x: (x is None, x if x is not None else 0)):
            h.add_row("none (-1)" if k == -1 else "no signal" if k is None else str(k), str(fe[k]))
        console.print(h)
        s = Table(title="MC labelling", show_header=False)
        s.add_row("status", ", ".join(f"{k}: {v}" for k, v in status.items()))
        counts = _mc_counts(shards)
        tally = self.tally
        if counts:  # the manifests count v_0's continuations too
            tally = {k: sum(c.get(k, 0) for c in counts) for k in ("continuations", "truncated", "empty",
                                                                    *ContinuationTally.NAMES)}
        add_continuation_rows(s, figs, tally, "continuations (incl. v0)" if counts else
                              "continuations from step prefixes")
        console.print(s)


def _mc_counts(shards) -> list[dict]:
    """The ``counts`` of the mc-label manifests among ``shards`` (none: the rows' per-step counts are read)."""
    return [m.get("counts", {}) for m in map(read_manifest, shards) if m and m.get("stage") == "mc-label"]


def _mc_tables(rows, console, figs, shards):
    """mc-label's part of ``stats`` for rows held at once (:class:`_MCStats` over one batch)."""
    acc = _MCStats()
    acc.add(rows)
    acc.print(console, figs, shards)


def continuation_tally(rows, prefix: str) -> dict[str, int]:
    """The continuation counters of a run read from its rows' per-step columns (``<prefix>rollouts``,
    ``truncated``, ``empty``, ``distinct``), for shards whose manifest is not at hand; a step with no count
    (null) is skipped. Keys as :class:`~stepkit.per_row.ContinuationTally` and the stages' counters."""
    t = dict.fromkeys(("continuations", "truncated", "empty", *ContinuationTally.NAMES), 0)
    for r in rows:
        rolls = r.get(prefix + "rollouts") or []
        cols = [r.get(prefix + c) or [None] * len(rolls) for c in ("truncated", "empty", "distinct")]
        for roll, trunc, empty, distinct in zip(rolls, *cols):  # (a shard from before mc_empty: no counts)
            if roll is None:
                continue
            t["continuations"] += roll
            t["truncated"] += trunc or 0
            t["empty"] += empty or 0
            n = roll - (empty or 0)
            if distinct is not None and n >= 2:
                t["compared_prefixes"] += 1
                t["distinct_continuations"] += distinct
                t["repeated_continuations"] += n - distinct
    return t


def add_continuation_rows(table, figs, tally: dict[str, int], label: str) -> None:
    """The continuation rows of a labeller's ``stats`` table: run, truncated, empty, distinct share."""
    ds = distinct_share(tally)
    table.add_row(label, str(tally["continuations"]))
    table.add_row("truncated (excluded from values)", str(tally["truncated"]))
    table.add_row("empty: no text (excluded from values)", str(tally.get("empty", 0)))
    table.add_row("distinct share (beyond each prefix's first continuation)",
                  f"n/a ({tally.get('compared_prefixes', 0)} prefixes with two continuations or more)" if ds is None
                  else f"{ds:.2f}" + (f" (below {MIN_DISTINCT_SHARE}: repeated samples)" if ds < MIN_DISTINCT_SHARE else ""))
    figs.update(continuations=tally["continuations"], truncated=tally["truncated"], empty=tally.get("empty", 0),
                distinct_share=ds)


def _header(row):
    return (f"v0 (bare problem) = {number(row.get('mc_value_start'), none='-')}   status {row.get('mc_status')}   "
            f"first error {'-' if row.get('mc_first_error') is None else row['mc_first_error']}")


def _step_columns(row):
    if not row.get("mc_value"):
        return []
    return [(c, "right") for c in ("succ/roll", "trunc", "empty", "distinct", "value", "progress", "label")]


def _count(row, col, s) -> str:
    """A per-step count, ``-`` for a shard written before the column existed."""
    v = (row.get(col) or [None] * len(row["steps"]))[s]
    return "-" if v is None else str(v)


def _value_style(v) -> str:
    if v is None:
        return "dim"
    return "green" if v >= 0.5 else "yellow" if v > 0 else "red"


def _step_cells(row, s):
    v = row["mc_value"][s]
    est = (row.get("mc_estimated") or [True] * len(row["steps"]))[s]
    last = s == len(row["steps"]) - 1 and not row.get("filter_cut_by")  # a cut row ends before its outcome
    lab = row["mc_label"][s] if row.get("mc_label") else None
    cells = ["outcome" if last else f"{row['mc_successes'][s]}/{row['mc_rollouts'][s]}",
             str(row["mc_truncated"][s]), _count(row, "mc_empty", s), _count(row, "mc_distinct", s), number(v, none="-"), number(row["mc_progress"][s], none="-"),
             ("?" if lab is None else "ok" if lab else "WRONG") + ("" if est else " (inferred)")]
    return cells, "bold red" if row.get("mc_first_error") == s else _value_style(v)


VIEW = StageView(marker="mc_value", stats=_mc_tables, stream=_MCStats, status_column="mc_status", header=_header,
                 step_columns=_step_columns, step_cells=_step_cells)
