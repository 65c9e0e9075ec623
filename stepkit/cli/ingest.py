"""``stepkit ingest``: source files into problem or trajectory shards (:mod:`stepkit.stages.ingest`)."""

from __future__ import annotations

import dataclasses

import click

from stepkit.options import click_options, from_params, given_on_command_line
from stepkit.stages.ingest import FORMATS, IngestOptions, option_conflicts


@click.command("ingest")
@click.argument("fmt", metavar="FORMAT", type=click.Choice(list(FORMATS)))
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click_options(IngestOptions)
def command(fmt, file, out, **kw):
    """Convert FILE (format FORMAT) into a Parquet shard OUT.

    \b
    Formats:
      gsm8k            GSM8K problems (question, answer with #### N)      -> problems shard
      gsm8k-solutions  GSM8K example model solutions, one row/generator    -> trajectories
      processbench     ProcessBench gsm8k.json / math.json (human labels) -> trajectories
      jsonl, parquet   any rows, mapped with the --*-col options            -> trajectories
      messages         tool-calling conversations (OpenAI messages, tau-bench) -> trajectories, a step
                       per assistant turn (--outcome-col, --gold-col, --success-threshold)

    An option that does not apply to FORMAT (--generator with gsm8k, --id-col with processbench, --seed
    without --sample) is a usage error, never silently ignored.
    """
    from stepkit.console import make_console
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.stages.ingest import ingest

    opts = from_params(IngestOptions, kw)
    ctx = click.get_current_context()
    given = [f.name for f in dataclasses.fields(IngestOptions) if given_on_command_line(ctx, f.name)]
    conflicts = option_conflicts(fmt, opts, given)
    if conflicts:
        raise click.UsageError("; ".join(conflicts))
    with AnswerChecker() as checker:
        manifest = ingest(fmt, file, out, opts, checker, checker_settings())
    counts = ", ".join(f"{k} = {v}" for k, v in manifest["counts"].items())
    make_console(stderr=True).print(f"[green]wrote[/green] {out} ({counts})", markup=True, highlight=False)
