"""``stepkit stats``: the summary of a shard, with each stage's own figures (its ``VIEW``)."""

from __future__ import annotations

import click


@click.command("stats")
@click.argument("shard", type=click.Path())
def command(shard):
    """Summary of a shard: rows, steps, outcome accuracy, value by step position, first errors, errors."""
    from stepkit.cli import stage_views
    from stepkit.views import print_stats

    print_stats(shard, stage_views())
