"""``stepkit models``: prepare and list the bundled models (:mod:`stepkit.models`)."""

from __future__ import annotations

import click


@click.group("models")
def command():
    """Bundled models (real weights shipped in a package; no downloads)."""


@command.command("prepare")
@click.argument("name", default="smollm2-135m")
@click.option("--force", is_flag=True, help="Convert again even if prepared.")
def models_prepare(name, force):
    """Convert a bundled model once into a cache folder vLLM loads (idempotent)."""
    from stepkit.models import prepare_model

    path = prepare_model(name, force=force, log=lambda m: click.echo(m, err=True))
    click.echo(str(path))


@command.command("list")
def models_list():
    """List bundled models and whether they are prepared."""
    from stepkit.models import list_models

    for m in list_models():
        click.echo(f"{m['name']}\t{'prepared' if m['prepared'] else 'not prepared'}\t{m['path']}\t{m['description']}")


