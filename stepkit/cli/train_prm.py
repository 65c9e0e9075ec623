"""``stepkit train-prm``: the command (the method: :mod:`stepkit.stages.train_prm`)."""

from __future__ import annotations

import click

from stepkit.options import click_options, from_params
from stepkit.stages.train_prm import TrainPRMConfig


@click.command("train-prm")
@click.argument("dataset", metavar="DATASET")
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(TrainPRMConfig)
@click.option("--force", is_flag=True, help="Replace a model or an unfinished run of another configuration in OUT.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar with the loss.")
def command(dataset, out, force, progress, **kw):
    """Train a step-level PRM (token classification) from the stepwise-supervision DATASET into OUT.

    DATASET: a `stepkit export --format trl` folder, a dataset saved on disk, a Parquet/JSON Lines file, or a
    Hub dataset with prompt / completions / labels (trl-lib/math_shepherd, trl-lib/prm800k). OUT is a model
    folder that from_pretrained loads, with a model card; `stepkit prm-label` reads it back. (TRL's
    PRMTrainer, last in TRL 1.13.0, was removed in TRL PR #7133: this is its replacement.)
    """
    from rich.table import Table

    from stepkit.stages.train_prm import train_prm
    from stepkit.views import make_console

    cfg = from_params(TrainPRMConfig, kw)
    doc = train_prm(dataset, out, cfg, force=force, progress=progress, log=lambda m: click.echo(m, err=True))
    if doc["status"] == "up to date":
        click.echo(f"train-prm: {out} is up to date (same dataset and options)", err=True)
        return
    c, tr = doc["counts"], doc["train"]
    t = Table(title=f"train-prm -> {out}", show_header=False)
    t.add_row("base model", doc["base_model"])
    t.add_row("rows / steps", f"{c['rows']} / {c['steps']}")
    t.add_row("labels", f"{doc['labels']}" + (" (last step only)" if doc["train_on_last_step_only"] else ""))
    t.add_row("labels trained / dropped by --max-length", f"{c['labels_trained']} / {c['labels_dropped']}")
    t.add_row("rows left with no label (skipped)", str(c["rows_without_label"]))
    t.add_row("optimizer steps", str(tr["steps"]))
    t.add_row("loss first / last", f"{tr['first_loss']:.4f} / {tr['last_loss']:.4f}" if tr["first_loss"] is not None
              else "-")
    if doc["eval_loss"] is not None:
        t.add_row("evaluation loss", f"{doc['eval_loss']:.4f}")
    t.add_row("seconds", f"{tr['seconds']:.1f}" + (f" ({tr['threads']} torch thread(s))" if tr.get("threads") else ""))
    make_console(stderr=True).print(t)
