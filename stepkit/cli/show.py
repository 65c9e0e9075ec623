"""``stepkit show``: one trajectory, each step with every stage's labels (each stage's ``VIEW``)."""

from __future__ import annotations

import click


@click.command("show")
@click.argument("shard", type=click.Path())
@click.option("--id", "row_id", default=None, help="Row id (default: the first row).")
@click.option("--index", type=click.IntRange(0), default=None, help="Row index instead of an id.")
@click.option("--status", default=None,
              help="Only rows with this value in some stage's status column: mc_status (ok, no_signal, "
                   "ungraded), mcts_status (ok, all_correct, all_wrong, no_signal, ungraded), judge_status (ok, "
                   "parse_failure), clue_status (ok, no_reference, parse_failure, no_answer, clue_error, "
                   "no_clues), lh_status (ok, no_answer), prm_status (ok), check_status (failed, held, "
                   "nothing_checkable), or filter_reason (the reason a filter dropped the row, e.g. unlabelled).")
@click.option("--clip", type=click.IntRange(0), default=300, show_default=True,
              help="Conversations: characters shown of a tool result, system message or call's arguments (0: all).")
def command(shard, row_id, index, status, clip):
    """Show one trajectory: each step with its MC counts, value and label, colored, and the judge's verdict.

    A conversation (from `ingest messages`) is shown message by message: roles, tool calls, tool results
    and each turn's labels."""
    from stepkit.cli import stage_views
    from stepkit.views import print_row

    print_row(shard, row_id, index, status, stage_views(), clip=clip)
