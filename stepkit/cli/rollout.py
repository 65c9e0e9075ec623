"""``stepkit rollout``: N sampled solutions per problem (:mod:`stepkit.stages.rollout`), and its view."""

from __future__ import annotations

import dataclasses

import click
from rich.table import Table

from stepkit.cli.common import engine_options, engine_spec, run, runner_options, sampling
from stepkit.options import click_options, from_params, given_on_command_line
from stepkit.stages.rollout import RECIPE_SAMPLING_KEYS, RolloutConfig
from stepkit.views import StageView


@click.command("rollout")
@click.argument("problems", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--recipe", type=click.Path(exists=True, dir_okay=False),
              help="YAML recipe with prompt and sampling settings (flags override it); see recipes/.")
@click_options(RolloutConfig)
@engine_options
@runner_options
def command(problems, out, recipe, **kw):
    """Sample N solutions per problem of PROBLEMS (a problems shard from `ingest gsm8k`) into OUT.

    Each sample becomes a trajectory row (steps, final answer, graded outcome); samples cut off by
    --max-tokens are kept with rollout_finish_reason 'length' and left ungraded.
    """
    from stepkit.errors import ConfigError, StepkitError
    from stepkit.stages.rollout import RolloutStage, load_recipe

    doc = load_recipe(recipe) if recipe else {}
    ctx = click.get_current_context()
    # A flag given on the command line wins over the recipe, the recipe over the flag's default.
    keys = [f.name for f in dataclasses.fields(RolloutConfig)] + list(RECIPE_SAMPLING_KEYS)
    values = {k: (kw[k] if given_on_command_line(ctx, k) or k not in doc else doc[k]) for k in keys}
    try:
        cfg = from_params(RolloutConfig, values)
        prompt = cfg.prompt()  # reads the few-shot file
    except StepkitError as e:
        if doc and _builds({k: kw[k] for k in keys}):  # fine without the recipe's values: name the recipe
            raise ConfigError(f"{recipe}: {e}") from None
        raise
    stage = RolloutStage(cfg, engine_spec(kw), sampling({**kw, **values}, cfg.stop), prompt=prompt,
                         generator=kw["model"])
    run(stage, problems, out, kw, "rollout")


def _builds(values: dict) -> bool:
    """Whether the rollout options ``values`` make a config and a prompt (few-shot file read)."""
    from stepkit.errors import StepkitError

    try:
        from_params(RolloutConfig, values).prompt()
    except StepkitError:
        return False
    return True


def _rollout_tables(rows, console, figs, shards):
    """rollout's part of ``stats``: per problem, samples, solve rate, distinct solutions, truncated."""
    from rich.text import Text

    by_problem: dict[str, list[dict]] = {}
    for r in rows:
        by_problem.setdefault(r["problem_id"], []).append(r)
    t = Table(title="per problem (rollout)")
    for c in ("problem", "samples", "solve rate", "distinct solutions", "mean steps", "truncated"):
        t.add_column(c, justify="left" if c == "problem" else "right")
    per = {}
    for pid, rs in by_problem.items():
        solved = sum(1 for r in rs if r.get("outcome_correct"))
        distinct = len({"\n".join(r.get("steps") or []) for r in rs})
        trunc = sum(1 for r in rs if r.get("rollout_finish_reason") == "length")
        mean_steps = sum(len(r.get("steps") or []) for r in rs) / len(rs)
        per[pid] = {"samples": len(rs), "solve_rate": solved / len(rs), "distinct": distinct,
                    "mean_steps": mean_steps, "truncated": trunc}
        t.add_row(Text(str(pid)), str(len(rs)), f"{solved / len(rs):.2f}", str(distinct), f"{mean_steps:.1f}", str(trunc))
    figs["per_problem"] = per
    console.print(t)


VIEW = StageView(marker="rollout_finish_reason", stats=_rollout_tables)
