"""``stepkit likelihood-label``: the command and its ``stats``/``show`` view (the method:
:mod:`stepkit.stages.likelihood`)."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table

from stepkit.cli.common import check_calibrate, engine_options, engine_spec, run, runner_options
from stepkit.options import click_options, from_params
from stepkit.shards import read_manifest
from stepkit.stages.likelihood import LikelihoodConfig
from stepkit.views import StageView, finite, mean, number, share, stat

PREFIX_CACHE_NOTE = ("vLLM skips the prefix cache for prompt-log-prob requests unless asked; the offline vllm "
                     "engine reads it and scores each row's full text first, so a shorter prefix costs only its "
                     "tail. Through --engine openai (a server's default) a row of M steps costs M + 1 full "
                     "prefills (answer-gain)")


@click.command("likelihood-label")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click_options(LikelihoodConfig)
@engine_options(samples=False)
@runner_options
def command(inp, out, **kw):
    """Step rewards from log-probabilities of the trajectories in IN: one prefill per prefix, no sampling.

    answer-gain: lh_value[i] = log P(reference answer | problem + steps[:i+1]), lh_gain its change per step;
    implicit-prm: lh_reward[i] = beta x log-ratio of --model and --reference-model over step i, lh_q its
    running sum. Writes lh_first_error and lh_label from --threshold (or --calibrate SHARD).
    """
    from stepkit.engines.base import SamplingConfig
    from stepkit.stages.likelihood import LikelihoodStage

    cfg = from_params(LikelihoodConfig, kw)
    check_calibrate(cfg.calibrate, out)
    stage = LikelihoodStage(cfg, engine_spec(kw), SamplingConfig(temperature=0, max_tokens=1, seed=kw["seed"]))
    run(stage, inp, out, kw, "likelihood-label")


def _tables(rows, console, figs, shards):
    """likelihood-label's part of ``stats``: signal by step position, first errors, cost."""
    status = Counter(r.get("lh_status") for r in rows)
    figs["lh_status"] = dict(status)
    for cols in (("lh_value", "lh_gain"), ("lh_reward", "lh_q")):  # answer-gain, implicit-prm (a folder may mix)
        by_pos: dict[int, tuple[list, list]] = {}
        for r in rows:
            for s, pair in enumerate(zip(r.get(cols[0]) or [], r.get(cols[1]) or [])):
                for side, v in zip(by_pos.setdefault(s, ([], [])), pair):
                    side.append(v)
        if not by_pos:
            continue
        t = Table(title=f"{cols[0]} and {cols[1]} by step position (nats; null, NaN and infinite values left out)")
        for c in ("step", "n", f"mean {cols[0]}", f"mean {cols[1]}", f"share {cols[1]} < 0"):
            t.add_column(c, justify="right")
        figs[f"{cols[0]}_by_position"] = {}
        for s in sorted(by_pos):
            a, b = map(finite, by_pos[s])
            figs[f"{cols[0]}_by_position"][s] = {"n": len(by_pos[s][0]), cols[0]: mean(a), f"{cols[0]}_values": len(a),
                                                 cols[1]: mean(b), f"{cols[1]}_values": len(b)}
            t.add_row(str(s), str(len(by_pos[s][0])), stat(mean(a), len(a), 2), stat(mean(b), len(b), 2),
                      stat(share(lambda x: x < 0, b), len(b), 2))
        console.print(t)
    fe = Counter(r.get("lh_first_error") for r in rows if r.get("lh_status") == "ok")
    figs["lh_first_error_histogram"] = {str(k): v for k, v in fe.items()}
    methods = sorted({m for m in (("implicit-prm" if r.get("lh_q") else "answer-gain") for r in rows
                                  if r.get("lh_status") == "ok")})
    h = Table(title="first error (lh_first_error)")
    h.add_column("step")
    h.add_column("rows", justify="right")
    for k in sorted(fe):
        h.add_row("none (-1)" if k == -1 else str(k), str(fe[k]))
    console.print(h)
    manifests = [m for m in map(read_manifest, shards) if m and m.get("stage") == "likelihood-label"]
    scored = sum(r.get("lh_scored_tokens") or 0 for r in rows)
    texts = sum((m.get("counts") or {}).get("texts", 0) for m in manifests)
    cached = sum((m.get("counts") or {}).get("cached_tokens", 0) for m in manifests)
    seconds = sum((m.get("run") or {}).get("seconds_this_run", 0) for m in manifests)
    run_tokens = sum((m.get("run") or {}).get("tokens_this_run", 0) for m in manifests)
    s = Table(title="likelihood labelling", show_header=False)
    s.add_row("status", ", ".join(f"{k}: {v}" for k, v in status.items()))
    s.add_row("method", " + ".join(methods) or "-")
    thresholds = sorted({m.get("config", {}).get("threshold") for m in manifests} - {None})
    if thresholds:
        s.add_row("threshold (nats)", ", ".join(f"{x:.4g}" for x in thresholds))
    for m in manifests[:1]:
        cal = (m.get("provenance") or {}).get("calibration")
        if cal:
            s.add_row("calibrated on", f"{cal['shard']} ({cal['rows']} rows, F1 {100 * cal['f1']:.1f})")
    s.add_row("prompt tokens scored", str(scored))
    if manifests:
        s.add_row("of them read from the prefix cache", f"{cached} ({100 * cached / scored:.0f}%)" if scored else "0")
    if texts:
        s.add_row("texts scored (prefills)", str(texts))
    if seconds and run_tokens:
        s.add_row("prompt tokens scored per second (last run)", f"{run_tokens / seconds:.0f}")
    s.add_row("cost", PREFIX_CACHE_NOTE)
    figs["lh_scored_tokens"] = scored
    console.print(s)
    if any(((m.get("config") or {}).get("engine") or {}).get("model") == "smollm2-135m" for m in manifests):
        figs["lh_bundled_model_note"] = BUNDLED_MODEL_NOTE
        console.print(BUNDLED_MODEL_NOTE, markup=False, highlight=False)


BUNDLED_MODEL_NOTE = ("note: labelled with the bundled SmolLM2-135M, whose likelihood labels carried no step "
                      "information on ProcessBench gsm8k: 23 exact first-error hits on erroneous held-out rows "
                      "where the outcome plus a random step gives 20.6 (P = 0.31; README, likelihood-label)")


def _header(row):
    start = "" if row.get("lh_value_start") is None else f"value before any step = {number(row['lh_value_start'], none='-')}   "
    fe = row.get("lh_first_error")
    return f"{start}status {row.get('lh_status')}   first error {'-' if fe is None else fe}"


def _step_columns(row):
    if row.get("lh_q"):
        return [(c, "right") for c in ("lh reward", "lh q", "lh label")]
    if row.get("lh_value"):
        return [(c, "right") for c in ("lh value", "lh gain", "lh label")]
    return []


def _step_cells(row, s):
    a, b = (row["lh_reward"], row["lh_q"]) if row.get("lh_q") else (row["lh_value"], row["lh_gain"])
    lab = row["lh_label"][s] if row.get("lh_label") else None
    style = "bold red" if row.get("lh_first_error") == s else "green" if b[s] >= 0 else "yellow"
    return [number(a[s], none="-"), number(b[s], none="-"), "?" if lab is None else "ok" if lab else "WRONG"], style


VIEW = StageView(marker="lh_status", stats=_tables, status_column="lh_status", header=_header,
                 step_columns=_step_columns, step_cells=_step_cells)
