"""``stepkit judge``: LLM-as-judge step labels (:mod:`stepkit.stages.judge`), and its view."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table
from rich.text import Text

from stepkit.cli.common import engine_options, engine_spec, run, runner_options, sampling
from stepkit.options import click_options, from_params
from stepkit.stages.judge import JudgeConfig
from stepkit.views import StageView


@click.command("judge")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(JudgeConfig)
@engine_options(temperature=0.7, max_tokens=1024)
@runner_options
def command(inp, out, **kw):
    """LLM-as-judge step labels for the trajectories in IN (ProcessBench critic prompt, majority vote).

    The judge model (--model/--engine) is chosen independently of the policy that wrote the steps.
    Writes judge_label, judge_first_error, judge_votes, judge_correct_votes, judge_tie, judge_status,
    judge_replies ...; a reply with no usable verdict is a parse failure, never a verdict. Agent
    conversations (ingest messages): --template judge-agent-step scores each turn 0-10 (judge_score).
    """
    from stepkit.prompts import load_template
    from stepkit.stages.judge import JudgeStage

    cfg = from_params(JudgeConfig, kw)
    if cfg.votes > 1 and kw["temperature"] == 0:
        raise click.UsageError("--votes > 1 needs --temperature > 0 (greedy replies would all be the same)")
    tmpl = load_template(cfg.template) if cfg.template else None
    mode = cfg.mode or "first-error"
    if tmpl is not None and tmpl.mode is None:
        raise click.UsageError(f"--template {cfg.template} has no 'mode' key; a judge template says which mode it "
                               f"is for (add 'mode: {mode}' and its slots {{problem}}, {{steps}}, ...)")
    if tmpl is not None and cfg.mode is not None and tmpl.mode != cfg.mode:
        raise click.UsageError(f"--template {cfg.template} is for mode {tmpl.mode!r}; pass --mode "
                               f"{tmpl.mode} (or no --mode) or a template with 'mode: {cfg.mode}'")
    stage = JudgeStage(cfg, engine_spec(kw), sampling(kw, cfg.stop), tmpl)
    run(stage, inp, out, kw, "judge")


def _judge_table(rows, console, figs, shards):
    """judge's part of ``stats``: status, first errors, replies and parse failures, ties."""
    status = Counter(r.get("judge_status") for r in rows)
    fe = Counter(r.get("judge_first_error") for r in rows if r.get("judge_status") == "ok")
    figs["judge_status"] = dict(status)
    figs["judge_first_error_histogram"] = {str(k): v for k, v in fe.items()}
    t = Table(title="judge", show_header=False)
    t.add_row("status", ", ".join(f"{k}: {v}" for k, v in status.items()))
    t.add_row("first error", ", ".join(f"{'none (-1)' if k == -1 else k}: {fe[k]}" for k in sorted(fe)))
    t.add_row("replies / parse failures", f"{sum(len(r.get('judge_replies') or []) for r in rows)} / "
                                          f"{sum(r.get('judge_parse_failures') or 0 for r in rows)}")
    t.add_row("rows with a tied vote", str(sum(bool(r.get("judge_tie")) for r in rows)))
    console.print(t)


def _header(row):
    if row.get("judge_status") is None:
        return None
    return (f"judge: status {row['judge_status']}   first error "
            f"{'-' if row.get('judge_first_error') is None else row['judge_first_error']}   "
            f"valid votes {row.get('judge_valid_votes')}   parse failures {row.get('judge_parse_failures')}"
            + ("   tie" if row.get("judge_tie") else ""))


def _step_columns(row):
    return [("judge", "right")] if row.get("judge_label") else []


def _step_cells(row, s):
    ok = row["judge_label"][s]
    score = f", score {row['judge_score'][s]:.1f}" if row.get("judge_score") else ""
    return [f"{'ok' if ok else 'WRONG'} ({row['judge_correct_votes'][s]}/{row['judge_valid_votes']} say ok{score})"], None


def _footer(row, console):
    if row.get("judge_replies"):
        reply = row["judge_replies"][-1]
        console.print(Text(f"last judge reply ({len(row['judge_replies'])} in all):", style="bold"))
        console.print(Text(reply if len(reply) <= 1500 else reply[:700] + " [...] " + reply[-700:], style="dim"))


VIEW = StageView(marker="judge_status", stats=_judge_table, status_column="judge_status", header=_header,
                 step_columns=_step_columns, step_cells=_step_cells, footer=_footer)
