"""Label quality and cost of ``likelihood-label`` (answer-gain) on ProcessBench, bundled model, CPU.

Pipeline (all through the CLI):

1. ``ingest processbench`` gsm8k (400 rows) and math (the rows with a gold answer);
2. gsm8k split by the parity of sha256(id) (the same stated split as ``bench/clue_processbench.py``): the
   *tune* half is labelled with the default threshold, the threshold is calibrated on it
   (``--calibrate``), and the *held-out* half is labelled with that threshold; its F1 is the figure to quote;
3. cost (run first): on the first ``--cost-rows`` held-out rows, ``likelihood-label`` against ``mc-label -k 4
   --max-tokens 192`` (the demo's settings), one after the other in this run; prompt tokens scored per
   second next to generated tokens per second;
4. math: ``--math-rows`` rows with a gold answer (seeded sample), with the threshold from gsm8k.

    python bench/likelihood_processbench.py [--data ../shared/data] [--work out/bench/likelihood] [--json F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

MODEL = "smollm2-135m"


def cli(*args) -> float:
    """Run one stepkit command; its wall time in seconds."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "stepkit.cli", *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"stepkit {' '.join(map(str, args))} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def half_of(row_id: str) -> str:
    """``tune`` or ``heldout``: the stated split by the parity of sha256(id)."""
    return "tune" if int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % 2 == 0 else "heldout"


def f1_of(path: Path, split: str) -> dict:
    from stepkit.stages.evaluate import processbench_report

    s = processbench_report(path, "lh_first_error")["splits"][split]
    return {k: s[k] for k in ("rows", "n_erroneous", "n_correct", "acc_erroneous", "acc_correct", "f1", "missing")}


def manifest(path: Path) -> dict:
    from stepkit.shards import read_manifest

    return read_manifest(path) or {}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--work", default="out/bench/likelihood")
    ap.add_argument("--cost-rows", type=int, default=100)
    ap.add_argument("--math-rows", type=int, default=100)
    ap.add_argument("--limit", type=int, default=None, help="gsm8k rows per half (a quick smoke run)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = Path(a.data) / "processbench"
    common = ("--model", MODEL, "--no-progress", "--force")
    report: dict = {"model": MODEL}

    pb = work / "gsm8k.parquet"
    cli("ingest", "processbench", data / "gsm8k.json", pb)
    table = pq.read_table(pb)
    halves = {}
    for half in ("tune", "heldout"):
        keep = [half_of(i) == half for i in table.column("id").to_pylist()]
        part = table.filter(keep)
        if a.limit:
            part = part.slice(0, a.limit)
        halves[half] = work / f"gsm8k-{half}.parquet"
        pq.write_table(part, halves[half])

    # cost first (on a quiet machine): the same rows through both labellers, one after the other
    cost_in = work / "cost-rows.parquet"
    pq.write_table(pq.read_table(halves["heldout"]).slice(0, a.cost_rows), cost_in)
    lh_cost, mc_cost = work / "cost-lh.parquet", work / "cost-mc.parquet"
    secs_lh = cli("likelihood-label", cost_in, lh_cost, *common)
    secs_mc = cli("mc-label", cost_in, mc_cost, *common, "--continuations", "4", "--max-tokens", "192")
    lh_m, mc_m = manifest(lh_cost), manifest(mc_cost)
    scored = lh_m["run"]["tokens_this_run"]
    generated = mc_m["run"]["tokens_this_run"]
    report["cost"] = {
        "rows": pq.read_metadata(cost_in).num_rows,
        "likelihood_seconds": round(secs_lh, 1), "mc_label_k4_seconds": round(secs_mc, 1),
        "ratio": round(secs_lh / secs_mc, 3),
        "likelihood_prompt_tokens_scored": scored,
        "likelihood_prompt_tokens_per_s": round(scored / lh_m["run"]["seconds_this_run"], 1),
        "mc_label_generated_tokens": generated,
        "mc_label_generated_tokens_per_s": round(generated / mc_m["run"]["seconds_this_run"], 1),
    }
    c = report["cost"]
    print(f"cost on {c['rows']} rows: likelihood-label {c['likelihood_seconds']} s vs mc-label K=4 "
          f"{c['mc_label_k4_seconds']} s (ratio {c['ratio']}); {c['likelihood_prompt_tokens_per_s']} prompt tok/s "
          f"scored vs {c['mc_label_generated_tokens_per_s']} generated tok/s", flush=True)

    tune_out, held_out = work / "lh-tune.parquet", work / "lh-heldout.parquet"
    secs_tune = cli("likelihood-label", halves["tune"], tune_out, *common)
    secs_held = cli("likelihood-label", halves["heldout"], held_out, *common, "--calibrate", tune_out)
    cal = manifest(held_out)["provenance"]["calibration"]
    report["gsm8k"] = {"split": "sha256(id) parity", "threshold": cal["threshold"],
                       "tune": {**f1_of(tune_out, "gsm8k"), "f1_calibrated": cal["f1"], "seconds": round(secs_tune, 1)},
                       "heldout": {**f1_of(held_out, "gsm8k"), "seconds": round(secs_held, 1)}}
    h = report["gsm8k"]["heldout"]
    h["baselines"] = baselines(held_out)
    print(f"gsm8k threshold {cal['threshold']:.4f} (tune F1 {100 * cal['f1']:.1f}); held-out F1 "
          f"{100 * h['f1']:.1f} (acc erroneous {100 * h['acc_erroneous']:.1f}, correct {100 * h['acc_correct']:.1f}, "
          f"missing {h['missing']} of {h['rows']})", flush=True)

    # math: rows with a gold answer, threshold from gsm8k
    if a.math_rows:
        pm = work / "math.parquet"
        cli("ingest", "processbench", data / "math.json", pm)
        import random

        mt = pq.read_table(pm)
        with_gold = [i for i, v in enumerate(mt.column("reference_answer").to_pylist()) if v]
        pick = sorted(random.Random(0).sample(with_gold, min(a.math_rows, len(with_gold))))
        math_in, math_out = work / "math-sample.parquet", work / "lh-math.parquet"
        pq.write_table(mt.take(pick), math_in)
        secs = cli("likelihood-label", math_in, math_out, *common, "--threshold", cal["threshold"])
        report["math"] = {"rows_with_gold": len(with_gold), "sample_seed": 0, **f1_of(math_out, "math"),
                          "seconds": round(secs, 1)}
        m = report["math"]
        print(f"math ({m['rows']} of {len(with_gold)} rows with gold, seed 0): F1 {100 * m['f1']:.1f} with the gsm8k "
              f"threshold", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))
    return report


def baselines(path: Path) -> dict:
    """F1 of rules that use the outcome alone, for comparison: an incorrect row's error at step 0, at its last
    step, or at a random step (mean over 200 seeds)."""
    import random
    import statistics

    from stepkit.metrics import processbench_f1

    rows = pq.read_table(path).to_pylist()
    gold = [r["reference_first_error"] for r in rows]

    def f1(pick):
        return processbench_f1(gold, [-1 if r["outcome_correct"] else pick(r) for r in rows])["f1"]

    rand = [f1(lambda r, g=random.Random(seed): g.randrange(len(r["steps"]))) for seed in range(200)]
    return {"outcome_step0": f1(lambda r: 0), "outcome_last_step": f1(lambda r: len(r["steps"]) - 1),
            "outcome_random_step_mean": statistics.mean(rand), "outcome_random_step_max": max(rand)}


if __name__ == "__main__":
    main()
