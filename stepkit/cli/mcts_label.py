"""``stepkit mcts-label``: OmegaPRM tree search (:mod:`stepkit.stages.mcts_label`), and its view."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table

from stepkit.cli.common import engine_options, engine_spec, run, runner_options, sampling
from stepkit.cli.mc_label import add_continuation_rows, continuation_tally
from stepkit.options import click_options, from_params
from stepkit.per_row import ContinuationTally
from stepkit.shards import read_manifest
from stepkit.stages.mcts_label import MCTSConfig
from stepkit.views import StageView, number


@click.command("mcts-label")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(MCTSConfig)
@engine_options
@runner_options
def command(inp, out, **kw):
    """OmegaPRM tree search per problem of IN (a problems shard, or trajectories that seed the trees).

    Writes one trajectory row per distinct complete rollout with mcts_value, mcts_label, mcts_node_id,
    mcts_first_error ...; --tree-out the nodes, --pairs-out step preference pairs (MCTS-DPO style).
    """
    from stepkit.prompts import DEFAULT_STOP
    from stepkit.stages.mcts_label import MCTSLabelStage

    cfg = from_params(MCTSConfig, kw)
    stage = MCTSLabelStage(cfg, engine_spec(kw), sampling(kw, DEFAULT_STOP + cfg.stop), generator=kw["model"])
    run(stage, inp, out, kw, "mcts-label")


def _stats(rows, console, figs, shards):
    """mcts-label's part of ``stats``: statuses, labelled steps, first errors."""
    status = Counter(r.get("mcts_status") for r in rows)
    labelled = sum(sum(v is not None for v in (r.get("mcts_value") or [])[:-1]) for r in rows)
    fe = Counter(r.get("mcts_first_error") for r in rows if r.get("mcts_status") == "ok")
    figs.update(mcts_status=dict(status), mcts_labelled_steps=labelled,
                mcts_first_error_histogram={str(k): v for k, v in fe.items()})
    t = Table(title="tree search (mcts-label)", show_header=False)
    t.add_row("status", ", ".join(f"{k}: {v}" for k, v in status.items()))
    t.add_row("steps with a node value (last steps excluded)", str(labelled))
    t.add_row("first error (searched rows)",
              ", ".join(f"{'none (-1)' if k == -1 else k}: {fe[k]}" for k in sorted(fe, key=lambda x: (x is None, x or 0))))
    counts = [m.get("counts", {}) for m in map(read_manifest, shards) if m and m.get("stage") == "mcts-label"]
    if counts:  # the manifests count every node once (and the question filter's rollouts)
        tally = {k: sum(c.get(k, 0) for c in counts) for k in ("continuations", "truncated", "empty",
                                                                *ContinuationTally.NAMES)}
    else:  # a node appears on every path through it: count each node once
        nodes = {}
        for r in rows:
            for s, n in enumerate(r.get("mcts_node_id") or []):
                if n is not None:
                    nodes[n] = {c: [(r.get("mcts_" + c) or [None] * (s + 1))[s]]
                                for c in ("rollouts", "truncated", "empty", "distinct")}
        tally = continuation_tally(nodes.values(), "")
    add_continuation_rows(t, figs, tally, "continuations")
    console.print(t)


def _header(row):
    return (f"tree search: status {row.get('mcts_status')}   first error "
            f"{'-' if row.get('mcts_first_error') is None else row['mcts_first_error']}")


def _step_columns(row):
    return [(c, "right") for c in ("node", "succ/roll", "visits", "value")] if row.get("mcts_value") else []


def _step_cells(row, s):
    v = row["mcts_value"][s]
    node = row["mcts_node_id"][s]
    counts = "-" if row["mcts_rollouts"][s] is None else f"{row['mcts_successes'][s]}/{row['mcts_rollouts'][s]}"
    return [node.rsplit("/", 1)[-1] if node else "-", counts, "-" if row["mcts_visits"][s] is None else
            row["mcts_visits"][s], number(v, none="-")], None


VIEW = StageView(marker="mcts_status", stats=_stats, status_column="mcts_status", header=_header,
                 step_columns=_step_columns, step_cells=_step_cells)
