"""``stepkit filter``: the command and its ``stats`` view (the rules: :mod:`stepkit.stages.filter`)."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table
from rich.text import Text

from stepkit.cli.common import run, runner_options_only
from stepkit.options import click_options, from_params
from stepkit.shards import read_manifest
from stepkit.stages.filter import FilterConfig
from stepkit.views import StageView, n_steps, stat


@click.command("filter")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(FilterConfig)
@runner_options_only("force", "rank", "world_size", "progress")
def command(inp, out, **kw):
    """Keep the rows of IN that pass every --rule (in order); dropped rows go to --dropped.

    \b
    Rules: consensus:A,B  prof:COL  min-value:COL>=X  max-value:COL<=X  status:COL=V  status:COL!=V
           dedupe  steps:MIN-MAX  no-error  truncate-after-first-error:COL  keep-correct-steps:COL
    Cutting steps cuts every per-step column the same way. Writes filter_reason, filter_rule,
    filter_steps_before, filter_kept_steps, filter_cut_by.
    """
    from stepkit.stages.filter import FilterStage

    cfg = from_params(FilterConfig, kw)
    title = "filter (--flag-only: 'dropped' rows stay in OUT, flagged)" if cfg.flag_only else "filter"
    run(FilterStage(cfg), inp, out, kw, title, shown=_summary_counter)


def _summary_counter(name: str) -> bool:
    """The run summary shows rows and steps; the label balance is in the manifest and ``stats``."""
    return name.startswith(("rows_", "steps_", "dropped_")) and not name.startswith("steps_dropped_")


class _FilterStats:
    """filter's part of ``stats``, added batch by batch: the rows (and their steps) flagged by reason; the
    rest is in the manifests."""

    columns = ("filter_reason",)

    def __init__(self, shards=()):
        self.flagged: Counter = Counter()
        self.steps: Counter = Counter()

    def add(self, rows) -> None:
        for r in rows:
            if r.get("filter_reason"):
                self.flagged[r["filter_reason"]] += 1
                self.steps[r["filter_reason"]] += n_steps(r)

    def print(self, console, figs, shards) -> None:
        _print_tables(self.flagged, self.steps, console, figs, shards)


def _filter_tables(rows, console, figs, shards):
    """filter's part of ``stats`` for rows held at once (:class:`_FilterStats` over one batch)."""
    acc = _FilterStats()
    acc.add(rows)
    acc.print(console, figs, shards)


def _print_tables(flagged: Counter, flagged_steps: Counter, console, figs, shards):
    """Rows and steps by reason, label balance before and after, rows flagged by reason."""
    counts: dict[str, int] = {}
    rules: list[str] = []
    for m in map(read_manifest, shards):
        if m and m.get("stage") == "filter":
            for k, v in m.get("counts", {}).items():
                if isinstance(v, int):
                    counts[k] = counts.get(k, 0) + v
            rules = m.get("config", {}).get("rule", rules)
    if rules:
        console.print(Text(f"filter rules, in order: {'  '.join(rules)}"))
    figs["filter"] = {"counts": counts, "flagged_rows": dict(flagged)}
    if counts:
        t = Table(title="filter: rows and steps by reason")
        for c in ("reason", "rows", "steps"):
            t.add_column(c, justify="right" if c != "reason" else "left")
        t.add_row("in", str(counts.get("rows_in", 0)), str(counts.get("steps_in", 0)))
        dropped = {k.removeprefix("dropped_"): v for k, v in counts.items() if k.startswith("dropped_")}
        for reason, n in sorted(dropped.items()):
            t.add_row(Text(f"dropped: {reason}"), str(n), str(counts.get(f"steps_dropped_{reason}", 0)))
        t.add_row("steps cut from kept rows", str(counts.get("rows_cut", 0)), str(counts.get("steps_cut", 0)))
        t.add_row("kept", str(counts.get("rows_kept", 0)), str(counts.get("steps_kept", 0)))
        console.print(t)
        b = Table(title="label balance before -> after")
        for c in ("label", "true / correct", "false / incorrect", "share true"):
            b.add_column(c, justify="right" if c != "label" else "left")
        for col in ["outcome"] + sorted(k[: -len("_true_in")] for k in counts if k.endswith("_true_in")):
            pos_k, neg_k = ("outcome_correct", "outcome_incorrect") if col == "outcome" else (f"{col}_true", f"{col}_false")
            cells = []
            for when in ("in", "kept"):
                p, n = counts.get(f"{pos_k}_{when}", 0), counts.get(f"{neg_k}_{when}", 0)
                cells.append((p, n, stat(p / (p + n) if p + n else None, 0, 2, "labels")))
            b.add_row(col, *(f"{cells[0][i]} -> {cells[1][i]}" for i in range(3)))
        console.print(b)
    if flagged:
        f = Table(title="rows flagged (--flag-only) or dropped, by filter_reason")
        f.add_column("reason")
        f.add_column("rows", justify="right")
        f.add_column("steps", justify="right")
        for reason, n in flagged.most_common():
            f.add_row(Text(reason), str(n), str(flagged_steps[reason]))
        console.print(f)


def _header(row):
    if row.get("filter_reason"):
        return f"filter: dropped ({row['filter_reason']}) by {row.get('filter_rule')}"
    if row.get("filter_cut_by"):
        return (f"filter: {row.get('filter_steps_before')} steps cut to {row.get('filter_kept_steps')} "
                f"by {row['filter_cut_by']}")
    return None


VIEW = StageView(marker="filter_reason", stats=_filter_tables, stream=_FilterStats, status_column="filter_reason", header=_header)
