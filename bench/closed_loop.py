"""The closed loop: which labeller's labels train the better PRM? (Qwen's "Lessons of Developing PRMs",
Math-Shepherd and OmegaPRM compare labellers this way.)

Training data: the GSM8K model solutions of ``../shared/data/gsm8k/example_model_solutions.jsonl`` whose problems
are **not** among ProcessBench gsm8k's (by the problem text, whitespace normalised), a seeded sample of
``--train-rows``. Labellers (all model-free, so every labelling cost here is wall seconds and 0 tokens):

* ``clue``: ``clue recover --from-reference`` + ``clue score --match numeric`` -> ``clue_label``;
* ``outcome``: every step labelled with the solution's graded outcome (the baseline a step labeller must beat);
* ``last-step``: the outcome on the last step only (``train-prm --train-on-last-step-only``: outcome supervision).

``likelihood-label`` and ``mc-label`` are not run by default (``--labellers`` names the ones to run): on this
shared 2-core machine their labelling alone takes longer than the whole budget of this run.

Each labeller's export trains one PRM from the bundled SmolLM2-135M with the same budget (``--max-length``,
``--max-steps``, ``--batch-size``, ``--learning-rate``); each PRM scores the held-out half of ProcessBench gsm8k
(``int(sha256(id), 16)`` odd) with ``prm-label`` (vLLM's pooling runner) at the default threshold 0.5, and is scored
by ``eval``'s ProcessBench F1 with a bootstrap 95% interval (rows resampled, 1000 draws, seed 0), the per-step AUC
(steps before the human first error are correct, the first error is wrong, later steps unlabelled), and exact
first-error hits on erroneous rows against the fair floor "outcome + a random step" (expected hits, and the
exact Poisson-binomial P(X >= hits)).

    python bench/closed_loop.py [--data ../shared/data] [--work out/bench/closed-loop] [--json F]
        [--train-rows 64] [--max-length 192] [--max-steps 8] [--batch-size 4] [--lock /tmp/stepkit-engine.lock]

``--lock FILE`` runs each command that loads vLLM under ``flock FILE`` (one engine at a time on a shared
machine); training never loads vLLM.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MODEL = "smollm2-135m"
LABELLERS = ("clue", "outcome", "last-step")


def cli(*args, lock: str | None = None) -> float:
    """Run one stepkit command (under ``flock lock`` when given); its wall time in seconds."""
    cmd = [sys.executable, "-m", "stepkit.cli", *map(str, args)]
    t0 = time.perf_counter()
    p = subprocess.run((["flock", lock] if lock else []) + cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"stepkit {' '.join(map(str, args))} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def half_of(row_id: str) -> str:
    return "tune" if int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % 2 == 0 else "heldout"


def norm(text: str) -> str:
    return " ".join(text.split())


def auc(pos: list[float], neg: list[float]) -> float | None:
    """P(score of a correct step > score of a wrong one), ties half (Mann-Whitney)."""
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def poisson_binomial_tail(ps: list[float], k: int) -> float:
    """P(X >= k) for X a sum of independent Bernoulli(p_i) (exact, by dynamic programming)."""
    dist = [1.0]
    for p in ps:
        dist = [(dist[j] if j < len(dist) else 0) * (1 - p) + (dist[j - 1] * p if j else 0) for j in range(len(dist) + 1)]
    return sum(dist[k:])


def score(path: Path, seed: int = 0) -> dict:
    from stepkit.metrics import processbench_f1

    rows = [r for r in pq.read_table(path).to_pylist() if r["reference_first_error"] is not None]
    gold = [r["reference_first_error"] for r in rows]
    pred = [r["prm_first_error"] for r in rows]
    f = processbench_f1(gold, pred)
    rng = random.Random(seed)
    draws = []
    for _ in range(1000):
        idx = [rng.randrange(len(rows)) for _ in rows]
        x = processbench_f1([gold[i] for i in idx], [pred[i] for i in idx])["f1"]
        if x is not None:
            draws.append(x)
    draws.sort()
    pos, neg = [], []
    for r in rows:
        for k, s in enumerate(r["prm_score"] or []):
            if r["reference_first_error"] == -1 or k < r["reference_first_error"]:
                pos.append(s)
            elif k == r["reference_first_error"]:
                neg.append(s)
    err = [r for r in rows if r["reference_first_error"] >= 0]
    hits = sum(r["prm_first_error"] == r["reference_first_error"] for r in err)
    chance = [0.0 if r["outcome_correct"] else 1 / len(r["steps"]) for r in err]
    return {"rows": len(rows), "f1": f["f1"], "f1_ci95": [draws[24], draws[974]] if len(draws) == 1000 else None,
            "acc_erroneous": f["acc_erroneous"], "acc_correct": f["acc_correct"], "step_auc": auc(pos, neg),
            "exact_hits": hits, "chance_hits": sum(chance), "p_value": poisson_binomial_tail(chance, hits)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--work", default="out/bench/closed-loop")
    ap.add_argument("--json", default=None)
    ap.add_argument("--labellers", default=",".join(LABELLERS))
    ap.add_argument("--train-rows", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--learning-rate", type=float, default=2e-5)
    ap.add_argument("--heldout-rows", type=int, default=None, help="score only the first N held-out rows")
    ap.add_argument("--lock", default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    data, work = Path(a.data), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)

    pb = work / "pb.parquet"
    cli("ingest", "processbench", data / "processbench" / "gsm8k.json", pb)
    t = pq.read_table(pb)
    keep = [half_of(i) == "heldout" for i in t.column("id").to_pylist()]
    held = t.filter(pa.array(keep))
    if a.heldout_rows:
        held = held.slice(0, a.heldout_rows)
    pq.write_table(held, work / "pb-heldout.parquet")
    seen = {norm(p) for p in t.column("prompt").to_pylist()}

    sol = work / "solutions.parquet"
    cli("ingest", "gsm8k-solutions", data / "gsm8k" / "example_model_solutions.jsonl", sol)
    s = pq.read_table(sol)
    rows = [r for r in s.to_pylist() if norm(r["prompt"]) not in seen]
    problems = len({r["problem_id"] for r in rows})
    random.Random(a.seed).shuffle(rows)
    train = rows[:a.train_rows]
    pq.write_table(pa.Table.from_pylist(train, schema=s.schema), work / "train.parquet")
    print(f"training pool: {len(rows)} solutions of {problems} problems not in ProcessBench gsm8k; "
          f"{len(train)} sampled; held-out ProcessBench rows: {held.num_rows}", flush=True)

    report = {"settings": vars(a), "pool": {"solutions": len(rows), "problems": problems}, "labellers": {}}
    for name in a.labellers.split(","):
        t0 = time.perf_counter()
        ds = work / f"ds-{name}"
        if name == "clue":
            cli("clue", "recover", work / "train.parquet", work / "clues.parquet", "--from-reference", "--no-progress",
                "--force")
            cli("clue", "score", work / "train.parquet", work / "clue.parquet", "--clues", work / "clues.parquet",
                "--match", "numeric", "--no-progress", "--force")
            cli("export", work / "clue.parquet", ds, "--format", "trl", "--labels", "clue_label", "--force")
        elif name in ("outcome", "last-step"):
            tt = pq.read_table(work / "train.parquet")
            lab = [[bool(o)] * len(st) for o, st in zip(tt.column("outcome_correct").to_pylist(),
                                                       tt.column("steps").to_pylist())]
            pq.write_table(tt.append_column("outcome_label", pa.array(lab, pa.list_(pa.bool_()))),
                           work / "outcome.parquet")
            cli("export", work / "outcome.parquet", ds, "--format", "trl", "--labels", "outcome_label", "--force")
        else:
            raise SystemExit(f"unknown labeller {name} (this bench runs {', '.join(LABELLERS)})")
        label_s = time.perf_counter() - t0
        prm = work / f"prm-{name}"
        train_s = cli("train-prm", ds, prm, "--base-model", MODEL, "--max-length", a.max_length, "--max-steps",
                      a.max_steps, "--batch-size", a.batch_size, "--learning-rate", a.learning_rate, "--seed", a.seed,
                      "--no-progress", "--force", *(["--train-on-last-step-only"] if name == "last-step" else []))
        doc = json.loads((prm / "stepkit-prm.json").read_text())
        scored = work / f"scored-{name}.parquet"
        score_s = cli("prm-label", work / "pb-heldout.parquet", scored, "--model", prm, "--no-progress", "--force",
                      lock=a.lock)
        res = {"label_seconds": round(label_s, 1), "label_tokens": 0, "train_seconds": round(train_s, 1),
               "train_steps": doc["train"]["steps"], "labels_trained": doc["counts"]["labels_trained"],
               "labels_dropped": doc["counts"]["labels_dropped"], "score_seconds": round(score_s, 1),
               **score(scored, a.seed)}
        report["labellers"][name] = res
        print(f"{name:10s} label {res['label_seconds']:6.1f}s  train {res['train_seconds']:6.1f}s "
              f"({res['train_steps']} steps, {res['labels_trained']} labels)  F1 {100 * res['f1']:.1f} "
              f"[{100 * res['f1_ci95'][0]:.1f}, {100 * res['f1_ci95'][1]:.1f}]  step AUC "
              f"{res['step_auc'] if res['step_auc'] is None else round(res['step_auc'], 3)}  exact hits "
              f"{res['exact_hits']} vs {res['chance_hits']:.1f} by chance (P = {res['p_value']:.2f})", flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
