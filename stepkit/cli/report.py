"""``stepkit report``: one self-contained HTML page over labelled shards or an export folder
(the page: :mod:`stepkit.stages.report`)."""

from __future__ import annotations

import click

from stepkit.options import click_options, from_params
from stepkit.stages.report import ReportConfig


@click.command("report")
@click.argument("inputs", metavar="IN...", nargs=-1, required=True, type=click.Path())
@click_options(ReportConfig)
def command(inputs, **kw):
    """Write one HTML page (data and script inline, no network) over the labelled shards, folders of
    shards or export folders IN: a summary per labeller, a searchable table of rows filterable by
    outcome, status, labeller disagreement and filter reason, and each row step by step with every
    labeller's label and value (conversations message by message, mcts-label trees drawn).

    The page carries a random sample of --sample rows (the summary covers every row) unless --all."""
    from stepkit.stages.report import write_report

    cfg = from_params(ReportConfig, kw)
    r = write_report(list(inputs), cfg)
    what = f"all {r['rows']} rows" if r["carried"] == r["rows"] else f"a sample of {r['carried']} of {r['rows']} rows"
    click.echo(f"wrote {r['path']} ({r['bytes'] / 1e6:.2f} MB, {what}; labellers: "
               f"{', '.join(r['labellers']) or 'none'}) in {r['seconds']:.1f} s", err=True)
