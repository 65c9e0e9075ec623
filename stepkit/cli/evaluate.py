"""``stepkit eval``: ProcessBench F1 and labeler agreement (:mod:`stepkit.stages.evaluate`)."""

from __future__ import annotations

import click

from stepkit.cli.common import check_json_path, write_json_report


def warn_mixed_configuration(shard, report: dict, console) -> None:
    """Warn (one line) when the folder's shards were made with different settings, and record it in
    the report (:func:`stepkit.shards.mixed_configuration`): the scores are computed, but they mix
    configurations."""
    from rich.text import Text

    from stepkit.shards import list_shards, mixed_configuration

    mixed = mixed_configuration(list_shards(shard))
    if mixed:
        report["mixed_configuration"] = mixed
        console.print(Text(f"warning: {shard}: {mixed}", style="yellow"), soft_wrap=True)


@click.group("eval")
def command():
    """Score step labels: ProcessBench F1 against human labels, agreement of two labelers."""


@command.command("processbench")
@click.argument("shard", type=click.Path())
@click.option("--pred", required=True,
              help="First-error column (mc_first_error, judge_first_error, ...) or step labels (mc_label, judge_label).")
@click.option("--gold", default="reference_first_error", show_default=True, help="Human first-error column.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, callback=check_json_path,
              help="Also write the figures to this .json file.")
def eval_processbench(shard, pred, gold, json_out):
    """ProcessBench accuracy on erroneous and on correct samples and F1 (their harmonic mean), per split.

    F1 counts a missing prediction (parse failure, no signal, row error) as wrong, as the paper does;
    'F1 answered' leaves those rows out, and 'missing' says how many there were.
    """
    from stepkit.console import make_console
    from stepkit.stages.evaluate import print_processbench, processbench_report

    report = processbench_report(shard, pred, gold)
    console = make_console()
    print_processbench(report, console)
    warn_mixed_configuration(shard, report, console)
    if json_out:
        write_json_report(json_out, report)


@command.command("agreement")
@click.argument("shard", type=click.Path())
@click.option("--a", "col_a", required=True, help="First labeler's first-error (or step-label) column.")
@click.option("--b", "col_b", required=True, help="Second labeler's column.")
@click.option("--cap", type=click.IntRange(1, 1000), default=8, show_default=True, help="Indices >= cap share a matrix bucket.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, callback=check_json_path,
              help="Also write the figures to this .json file.")
def eval_agreement(shard, col_a, col_b, cap, json_out):
    """Agreement matrix of two labelers' first-error predictions (e.g. mc_first_error vs judge_first_error)."""
    from stepkit.console import make_console
    from stepkit.stages.evaluate import agreement_report, print_agreement

    report = agreement_report(shard, col_a, col_b, cap)
    console = make_console()
    print_agreement(report, console)
    warn_mixed_configuration(shard, report, console)
    if json_out:
        write_json_report(json_out, report)


