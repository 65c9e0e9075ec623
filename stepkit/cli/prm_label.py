"""``stepkit prm-label``: the command and its ``stats``/``show`` view (the method: :mod:`stepkit.stages.prm_label`)."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table

from stepkit.cli.common import check_calibrate, engine_options, engine_spec, run, runner_options
from stepkit.options import click_options, from_params
from stepkit.shards import read_manifest
from stepkit.stages.prm_label import PRMLabelConfig
from stepkit.views import StageView, finite, mean, number, share, stat


@click.command("prm-label")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(PRMLabelConfig)
@engine_options(samples=False)
@runner_options
def command(inp, out, **kw):
    """Score every step of the trajectories in IN with a process reward model (--model).

    \b
    token-classification  a *ForTokenClassification PRM (stepkit train-prm's): the correct class's
                          probability at the last token of each step + separator (vLLM pooling runner)
    qwen-prm              a two-class reward head at the <extra_0> step tag (Qwen2.5-Math-PRM)
    math-shepherd         a causal LM's P(+) / (P(+) + P(-)) after the ' ки' step tag (scoring call)

    Writes prm_score (per step), prm_label (score >= --threshold) and prm_first_error; `stepkit eval
    processbench OUT --pred prm_first_error` scores them against human labels.
    """
    from stepkit.engines.base import SamplingConfig
    from stepkit.stages.prm_label import PRMLabelStage

    cfg = from_params(PRMLabelConfig, kw)
    check_calibrate(cfg.calibrate, out)
    stage = PRMLabelStage(cfg, engine_spec(kw), SamplingConfig(temperature=0, max_tokens=1, seed=kw["seed"]))
    run(stage, inp, out, kw, "prm-label")


def _tables(rows, console, figs, shards):
    """prm-label's part of ``stats``: mean score by step position, first errors, the layout."""
    by_pos: dict[int, list[float]] = {}
    for r in rows:
        for s, v in enumerate(r.get("prm_score") or []):
            by_pos.setdefault(s, []).append(v)
    t = Table(title="prm_score by step position (null, NaN and infinite values left out)")
    for c in ("step", "n", "mean prm_score", "share below threshold"):
        t.add_column(c, justify="right")
    manifests = [m for m in map(read_manifest, shards) if m and m.get("stage") == "prm-label"]
    thresholds = sorted({(m.get("config") or {}).get("threshold") for m in manifests} - {None})
    th = thresholds[0] if len(thresholds) == 1 else 0.5
    figs["prm_score_by_position"] = {}
    for s in sorted(by_pos):
        v = finite(by_pos[s])
        figs["prm_score_by_position"][s] = {"n": len(by_pos[s]), "values": len(v), "mean": mean(v),
                                            "share_below_threshold": share(lambda x: x < th, v)}
        t.add_row(str(s), str(len(by_pos[s])), stat(mean(v), len(v)), stat(share(lambda x: x < th, v), len(v), 2))
    console.print(t)
    fe = Counter(r.get("prm_first_error") for r in rows if r.get("prm_status") == "ok")
    figs["prm_first_error_histogram"] = {str(k): v for k, v in fe.items()}
    s = Table(title="prm labelling", show_header=False)
    s.add_row("status", ", ".join(f"{k}: {v}" for k, v in Counter(r.get("prm_status") for r in rows).items()))
    for m in manifests[:1]:
        layout = (m.get("config") or {}).get("layout") or {}
        s.add_row("kind", str(layout.get("kind")))
        s.add_row("model", str(((m.get("config") or {}).get("engine") or {}).get("model")))
    s.add_row("threshold", ", ".join(f"{x:.4g}" for x in thresholds) or "-")
    s.add_row("first error none / some", f"{fe.get(-1, 0)} / {sum(v for k, v in fe.items() if k != -1)}")
    s.add_row("tokens read", str(sum(r.get("prm_tokens") or 0 for r in rows)))
    console.print(s)


def _header(row):
    fe = row.get("prm_first_error")
    return f"prm status {row.get('prm_status')}   first error {'-' if fe is None else fe}"


def _step_columns(row):
    return [("prm score", "right"), ("prm label", "right")] if row.get("prm_score") else []


def _step_cells(row, s):
    v, lab = row["prm_score"][s], (row.get("prm_label") or [None] * (s + 1))[s]
    style = "bold red" if row.get("prm_first_error") == s else "green" if lab else "yellow"
    return [number(v, 3, none="-"), "?" if lab is None else "ok" if lab else "WRONG"], style


VIEW = StageView(marker="prm_status", stats=_tables, status_column="prm_status", header=_header,
                 step_columns=_step_columns, step_cells=_step_cells)
