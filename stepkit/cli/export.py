"""``stepkit export``: the command (the formats: :mod:`stepkit.stages.export`)."""

from __future__ import annotations

import click

from stepkit.options import click_options, from_params
from stepkit.stages.export import ExportConfig

SOFT_WARNING = ("warning: TRL's PRMTrainer (trl <= 1.13.0, trl.experimental.prm; later trl has none) converts each "
                "label with int(), so soft labels such as 0.75 train as 0 there; use these labels with a trainer that "
                "reads floats, or export hard labels (--threshold X)")


@click.command("export")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(ExportConfig)
@click.option("--force", is_flag=True, help="Replace an earlier export in OUT.")
def command(inp, out, force, **kw):
    """Write the labelled rows of IN as a dataset folder OUT in the Hub layout (OUT/data/*.parquet).

    \b
    --format trl           prompt, completions, labels (TRL stepwise supervision)
    --format math-shepherd input / label with ' ки' step tags and +/-, task
    --format processbench  id, generator, problem, steps, final_answer_correct, label (first error)
    --format messages      messages (OpenAI chat, tool calls), labels (one per assistant turn), from
                           `stepkit ingest messages` rows
    --format pairs         prompt, chosen, rejected (DPO) from an mcts-label --pairs-out shard
    """
    from rich.table import Table

    from stepkit.console import make_console
    from stepkit.stages.export import export

    cfg = from_params(ExportConfig, kw)
    m = export(inp, out, cfg, force=force)
    if m.get("status") == "up to date":
        click.echo(f"export: {out} is up to date (same inputs and options)", err=True)
        return
    if cfg.format == "trl" and cfg.soft:
        click.echo(SOFT_WARNING, err=True)
    t = Table(title=f"export {cfg.format} -> {out}", show_header=False)
    t.add_row("labels", m["label_rule"])
    sep = m.get("step_separator") or {}
    if sep.get("value") is not None:
        where = {"option": "--step-separator", "rows": "the rows' own", "format": "the format's"}[sep["from"]]
        t.add_row("step separator", f"{sep['value']!r} ({where})")
        if sep.get("rows_joined_otherwise"):
            click.echo(f"note: {sep['rows_joined_otherwise']} row(s) whose own step separator differs are joined with "
                       f"{sep['value']!r}", err=True)
    for s, info in m["splits"].items():
        t.add_row(f"split {s}", f"{info['rows']} rows in {len(info['files'])} file(s)")
    c = m["counts"]
    t.add_row("rows in / out", f"{c['rows_in']} / {c['rows_out']}")
    t.add_row("dropped: null labels", str(c["null_labels"]))
    t.add_row("left out: flagged by filter --flag-only", str(c.get("filtered", 0)))
    tl = m.get("token_lengths")
    if tl:
        t.add_row(f"tokens per row ({tl['tokenizer']})", f"min {tl['min']}, median {tl['median']}, p95 {tl['p95']}, "
                                                         f"max {tl['max']}")
        if tl["max_length"] is not None:
            cut = tl["labels_cut"]
            t.add_row(f"over --max-length {tl['max_length']}", f"{tl['rows_over']} row(s); labels a trainer with this "
                      f"limit drops: {cut['true']} correct, {cut['false']} wrong; rows dropped: {tl['rows_dropped']}")
    if c.get("step_markers_renumbered"):
        t.add_row("steps whose own 'Step N:' marker was replaced by the export's number",
                  str(c["step_markers_renumbered"]))
    if c.get("steps_rejoined"):
        t.add_row("steps that held the separator, rejoined with a space", str(c["steps_rejoined"]))
    if c.get("converter_drops_first_step"):
        click.echo(f"warning: {c['converter_drops_first_step']} problem(s) open with words TRL's Math-Shepherd converter "
                   "takes for an annotation error of the released rows: it drops their first label", err=True)
    if c.get("pairs_not_preferred"):
        t.add_row("pairs whose chosen value is not above the rejected", str(c["pairs_not_preferred"]))
    if cfg.format == "messages":
        t.add_row("messages / tool calls", f"{c.get('messages', 0)} / {c.get('tool_calls', 0)}")
        if c.get("message_fields_dropped"):
            keys = ", ".join(m.get("dropped_message_keys", {}))
            click.echo(f"warning: {c['message_fields_dropped']} message field(s) not in the messages format were "
                       f"left out: {keys}", err=True)
    if cfg.format in ("trl", "messages"):
        t.add_row("assistant turns" if cfg.format == "messages" else "steps", str(c["steps"]))
        t.add_row("mean soft label" if cfg.soft else "labels true / false",
                  str(c.get("mean_label", "-")) if cfg.soft else f"{c['labels_true']} / {c['labels_false']}")
    make_console(stderr=True).print(t)
