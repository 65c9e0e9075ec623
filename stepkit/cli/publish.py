"""``stepkit publish``: the command (the steps: :mod:`stepkit.stages.publish`)."""

from __future__ import annotations

import click

from stepkit.options import click_options, from_params
from stepkit.stages.publish import PublishConfig


@click.command("publish")
@click.argument("folder", metavar="FOLDER", type=click.Path())
@click_options(PublishConfig)
def command(folder, **kw):
    """Publish the export FOLDER (stepkit export) as a Hub dataset: card, figures, one commit.

    The card (README.md) is rendered from data_cards/prm-dataset.md with the features of the files and
    the lineage of the manifests; report.html (stepkit report over FOLDER) is added and linked from the
    card (--no-report: not); datasets.load_dataset(FOLDER) is checked before anything is uploaded.
    Token: HF_TOKEN. Endpoint: --endpoint or HF_ENDPOINT. --dry-run uploads nothing.
    """
    from rich.table import Table

    from stepkit.console import make_console
    from stepkit.stages.publish import publish

    cfg = from_params(PublishConfig, kw)
    report = publish(folder, cfg, log=lambda line: click.echo(line, err=True))
    t = Table(title=f"publish {folder} -> {cfg.repo_id or '(dry run)'}")
    t.add_column("file")
    t.add_column("bytes", justify="right")
    for path, size in report["files"]:
        t.add_row(path, str(size))
    console = make_console(stderr=True)
    console.print(t)
    rows = ", ".join(f"{s}: {n} rows" for s, n in report["splits"].items())
    if cfg.dry_run:
        console.print(f"dry run: {folder} loads with datasets ({rows}); README.md, images/"
                      f"{' and report.html' if report['report'] else ''} written there; "
                      f"nothing uploaded" + (f" (would go to {cfg.repo_id})" if cfg.repo_id else ""))
    else:
        subset = "" if cfg.config == "default" else f" subset {cfg.config}"
        console.print(f"published {cfg.repo_id}{subset} ({rows}), commit {report['commit']}")
