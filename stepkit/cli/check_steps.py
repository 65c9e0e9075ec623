"""``stepkit check-steps``: the command and its ``stats``/``show`` view (:mod:`stepkit.stages.check_steps`)."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table
from rich.text import Text

from stepkit.cli.common import run, runner_options_only
from stepkit.options import click_options, from_params
from stepkit.stages.check_steps import CheckStepsConfig
from stepkit.views import StageView


@click.command("check-steps")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(CheckStepsConfig)
@runner_options_only("chunk_size", "force", "rank", "world_size", "progress", "max_error_rate")
def command(inp, out, **kw):
    """Check the mathematics of every step of IN with sympy (no model): equalities and chains,
    inequalities, evaluations, substitutions into earlier definitions, solved equations, simplifications.

    \b
    Writes per step check_claims, check_held, check_failed, check_not_parsed, check_failures, check_score,
    check_label; per row check_first_failed (claims alone), check_first_error (first failed claim, else
    clue_first_error, else step --incorrect-step of an incorrect outcome), check_first_error_source, check_status (failed,
    held, nothing_checkable). A claim it cannot read is not parsed, never an error.
    """
    from stepkit.stages.check_steps import CheckStepsStage

    run(CheckStepsStage(from_params(CheckStepsConfig, kw)), inp, out, kw, "check-steps")


def _stats(rows, console, figs, shards):
    """check-steps' part of ``stats``: statuses, claim counts, first-error sources."""
    status = Counter(r.get("check_status") for r in rows)
    source = Counter(r.get("check_first_error_source") for r in rows)
    held = sum(sum(r.get("check_held") or []) for r in rows)
    failed = sum(sum(r.get("check_failed") or []) for r in rows)
    unparsed = sum(sum(r.get("check_not_parsed") or []) for r in rows)
    figs["check_status"] = {str(k): v for k, v in status.items()}
    figs["check_first_error_source"] = {str(k): v for k, v in source.items()}
    figs["check_claims"] = {"held": held, "failed": failed, "not_parsed": unparsed}
    t = Table(title="check-steps", show_header=False)
    t.add_row("status", ", ".join(f"{k}: {v}" for k, v in status.items()))
    t.add_row("claims", f"held {held}, failed {failed}, not parsed {unparsed}")
    t.add_row("first error from", ", ".join(f"{k}: {v}" for k, v in source.items()))
    console.print(t)


def _header(row):
    if row.get("check_status") is None:
        return None
    return (f"check-steps: status {row['check_status']}   first error {row.get('check_first_error')} "
            f"(from {row.get('check_first_error_source')})")


def _step_columns(row):
    return [("claims held/failed/not parsed", "right")] if row.get("check_held") is not None else []


def _step_cells(row, s):
    failed = row["check_failed"][s]
    return [f"{row['check_held'][s]}/{failed}/{row['check_not_parsed'][s]}"], ("red" if failed else None)


def _footer(row, console):
    for s, fails in enumerate(row.get("check_failures") or []):
        for f in fails or []:
            console.print(Text(f"  step {s}: false claim  {f}"))


VIEW = StageView(marker="check_status", stats=_stats, status_column="check_status", header=_header,
                 step_columns=_step_columns, step_cells=_step_cells, footer=_footer)
