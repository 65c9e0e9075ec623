"""``stepkit clue``: answer-backtracked clues and clue-anchored step scores (:mod:`stepkit.stages.clue`),
and their view."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table
from rich.text import Text

from stepkit.cli.common import engine_options, engine_spec, run, runner_options, sampling
from stepkit.options import click_options, from_params
from stepkit.stages.clue import ClueRecoverConfig, ClueScoreConfig
from stepkit.views import StageView, finite, mean, number, stat


@click.group("clue")
def command():
    """Answer-backtracked clues (ABSeeker): recover them per problem, then score each step by them."""


def _optional_model(cmd):
    """``--model`` is only needed when a model runs (not with --from-reference / --match numeric)."""
    for p in cmd.params:
        if p.name == "model":
            p.required = False
            p.help = (p.help or "") + " Not needed with --from-reference/--from-actions (recover) or --match numeric (score)."
    return cmd


def _spec(kw):
    if not kw.get("model"):
        return None
    return engine_spec(kw)


@command.command("recover")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(ClueRecoverConfig)
@engine_options(temperature=0.7, max_tokens=768)
@runner_options
def recover(inp, out, **kw):
    """One clue list per problem of IN (a problems or trajectories shard), worked backward from
    reference_answer by --model, or with --from-reference from the reference solution's <<a=b>>
    annotations (no model), or with --from-actions from an agent task's gold tool calls (no model).

    Writes clue_texts, clue_values, clue_depends, clue_kinds (call / value, --from-actions), clue_status (ok,
    parse_failure, no_reference, no_answer), clue_parse_failures, clue_parse_error (the last failure's reason),
    clue_replies; a reply that does not parse is a parse failure, never an empty list.
    """
    from stepkit.prompts import load_template
    from stepkit.stages.clue import ClueRecoverStage

    cfg = from_params(ClueRecoverConfig, kw)
    rule = "--from-reference" if cfg.from_reference else "--from-actions" if cfg.from_actions else None
    if rule and kw.get("model"):
        raise click.UsageError(f"{rule} uses no model: leave out --model")
    if not rule and not kw.get("model"):
        raise click.UsageError("give --model (the recovery model), or --from-reference (math), or --from-actions "
                               "(agent conversations)")
    tmpl = load_template(cfg.template) if cfg.template else None
    spec = None if rule else engine_spec(kw)
    run(ClueRecoverStage(cfg, spec, sampling(kw) if spec else None, tmpl), inp, out, kw, "clue recover")


@command.command("score")
@click.argument("traj", metavar="TRAJ", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(ClueScoreConfig)
@engine_options(temperature=0.7, max_tokens=512)
@runner_options
def score(traj, out, **kw):
    """Score every step of the trajectories in TRAJ by the clues of its problem (--clues, from `clue
    recover`): clue_hits, clue_false_claims, clue_score, clue_label, clue_coverage, clue_first_error,
    clue_verdicts, clue_verdict_failures, clue_status (ok; no_reference, parse_failure, no_answer, clue_error,
    no_clues: no labels).

    Numeric clues are matched by value with the answer checker; --match llm/both asks --model for a
    verdict per clue (a reply with no usable verdict is a recorded failure, never a verdict).
    """
    from stepkit.prompts import load_template
    from stepkit.stages.clue import ClueScoreStage

    cfg = from_params(ClueScoreConfig, kw)
    if cfg.match == "numeric" and kw.get("model"):
        raise click.UsageError("--match numeric uses no model: leave out --model, or pass --match llm/both")
    if cfg.match != "numeric" and not kw.get("model"):
        raise click.UsageError(f"--match {cfg.match} needs --model (the verdict model)")
    tmpl = load_template(cfg.template) if cfg.template else None
    spec = _spec(kw)
    run(ClueScoreStage(cfg, spec, sampling(kw) if spec else None, template=tmpl), traj, out, kw, "clue score")


_optional_model(recover)
_optional_model(score)


def _stats(rows, console, figs, shards):
    """clue's part of ``stats``: clue lists (recover) or hits, scores, coverage by outcome (score)."""
    status = Counter(r.get("clue_status") for r in rows)
    t = Table(title="clue", show_header=False)
    t.add_row("status", ", ".join(f"{k}: {v}" for k, v in status.items()))
    figs["clue_status"] = {str(k): v for k, v in status.items()}
    if any("clue_texts" in r for r in rows):
        lens = [len(r["clue_texts"]) for r in rows if r.get("clue_texts")]
        figs["clue_mean_clues"] = mean(lens)
        t.add_row("clues per problem", f"mean {stat(figs['clue_mean_clues'], len(lens), 1, 'problems with clues')}, "
                                       f"max {max(lens, default=0)}")
        t.add_row("numeric clues", str(sum(v is not None for r in rows for v in r.get("clue_values") or [])))
        t.add_row("parse failures", str(sum(r.get("clue_parse_failures") or 0 for r in rows)))
    if any("clue_hits" in r for r in rows):
        scored = [r for r in rows if r.get("clue_status") == "ok"]
        for name, keep in (("all", lambda r: True), ("correct outcome", lambda r: r.get("outcome_correct") is True),
                           ("incorrect outcome", lambda r: r.get("outcome_correct") is False)):
            sel = [r for r in scored if keep(r)]
            covs = finite(r["clue_coverage"] for r in sel)
            figs[f"clue_coverage_{name.split()[0]}"] = cov = mean(covs)
            t.add_row(f"coverage ({name})", stat(cov, len(covs), what="rows with a coverage") if cov is None
                      else f"{cov:.3f} ({len(covs)} rows)")
        fe = Counter(r["clue_first_error"] for r in scored)
        figs["clue_first_error_histogram"] = {str(k): v for k, v in fe.items()}
        t.add_row("first error", ", ".join(f"{'none (-1)' if k == -1 else k}: {fe[k]}" for k in sorted(fe)))
        steps = finite(s for r in scored for s in r["clue_score"] or [])
        figs["clue_mean_step_score"] = mean(steps)
        t.add_row("mean step score", stat(figs["clue_mean_step_score"], len(steps), what="step scores"))
        t.add_row("false arithmetic claims", str(sum(sum(r["clue_false_claims"]) for r in scored)))
        t.add_row("LLM verdict failures", str(sum(r.get("clue_verdict_failures") or 0 for r in scored)))
    console.print(t)


def _header(row):
    if row.get("clue_status") is None:
        return None
    if "clue_hits" in row:
        cov = row.get("clue_coverage")
        return (f"clue: status {row['clue_status']}   coverage {'-' if cov is None else f'{cov:.2f}'}   first error "
                f"{'-' if row.get('clue_first_error') is None else row['clue_first_error']}")
    return f"clue: status {row['clue_status']}   {len(row.get('clue_texts') or [])} clues"


def _step_columns(row):
    return [("clue hits", "left"), ("clue score", "right")] if row.get("clue_hits") is not None else []


def _step_cells(row, s):
    hits = ", ".join(str(k) for k in row["clue_hits"][s]) or "-"
    false = row["clue_false_claims"][s]
    cell = number(row['clue_score'][s], none="-") + (f" ({false} false claim{'s' if false > 1 else ''})" if false else "")
    return [hits, cell], (None if row["clue_label"][s] else "red")


def _footer(row, console):
    if row.get("clue_texts"):
        console.print(Text("clues:", style="bold"))
        for k, (text, value, deps) in enumerate(zip(row["clue_texts"], row["clue_values"], row["clue_depends"])):
            console.print(Text(f"  {k}: {text}" + (f"   = {value}" if value is not None else "")
                               + (f"   (uses {', '.join(map(str, deps))})" if deps else "")))
    elif row.get("clue_verdicts") is not None:
        console.print(Text("clue verdicts (step that establishes each clue, -1 none): "
                           + ", ".join("-" if v is None else str(v) for v in row["clue_verdicts"])))


VIEW = StageView(marker="clue_status", stats=_stats, status_column="clue_status", header=_header,
                 step_columns=_step_columns, step_cells=_step_cells, footer=_footer)
