"""The closed loop: which labeller's labels train the better PRM? (Qwen's "Lessons of Developing PRMs",
Math-Shepherd and OmegaPRM compare labellers this way.)

Training data: the GSM8K model solutions of ``../shared/data/gsm8k/example_model_solutions.jsonl`` whose problems
are **not** among ProcessBench gsm8k's (by the problem text, whitespace normalised), a seeded sample of
``--train-rows``. Labellers (all model-free, so every labelling cost here is wall seconds and 0 tokens):

* ``clue``: ``clue recover --from-reference`` + ``clue score --match numeric`` -> ``clue_label``;
* ``outcome``: every step labelled with the solution's graded outcome (the baseline a step labeller must beat);
* ``last-step``: the outcome on the last step only (``train-prm --train-on-last-step-only``: outcome supervision).

* ``likelihood`` (not run by default): ``likelihood-label`` (answer-gain, the bundled model, its default threshold)
  -> ``lh_label`` on the first ``--likelihood-rows`` training rows only (it prefills every step prefix: about
  1,100 prompt tokens/s here), so its PRM sees fewer rows than the others (more epochs of the same steps).

``mc-label`` is not run here: on this shared 2-core machine its labelling alone takes longer than the whole
budget of this run.

Each labeller's export trains one PRM from the bundled SmolLM2-135M with the same budget (``--max-length``,
``--max-steps``, ``--batch-size``, ``--learning-rate``); each PRM scores the held-out half of ProcessBench gsm8k
(``int(sha256(id), 16)`` odd) with ``prm-label`` (vLLM's pooling runner) at the default threshold 0.5, and is scored
by ``eval``'s ProcessBench F1 with a bootstrap 95% interval (1000 draws, seed 0, erroneous and correct rows
each resampled within their own group), the per-step AUC
(steps before the human first error are correct, the first error is wrong, later steps unlabelled), and exact
first-error hits on erroneous rows against the fair floor "outcome + a random step" (expected hits, and the
exact Poisson-binomial P(X >= hits)).

``--heldout-rows N`` scores N held-out rows taken in sha256(id) order, never the file's first N
(``gsm8k.json`` lists every erroneous row before the correct ones, so its first rows have no correct sample).
The line ``floor`` is the fair floor itself on the same rows: its expected accuracies and their F1.

    python bench/closed_loop.py [--data ../shared/data] [--work out/bench/closed-loop] [--json F] [--table F]
        [--train-rows 64] [--max-length 192] [--max-steps 8] [--batch-size 4] [--threads 1]
        [--heldout-rows N] [--lock /tmp/stepkit-engine.lock]

``--lock FILE`` runs each command that loads vLLM under an exclusive ``flock`` of FILE (the lock ``flock(1)``
takes; one engine at a time on a shared machine), and the seconds spent waiting for it are reported apart
(``score_lock_wait_seconds``), not counted as scoring. Training never loads vLLM; it runs with
``train-prm --threads`` (default 1: on this shared 2-core machine two torch threads were 5-14x slower than one).
Scoring cost is split as the prm-label manifest records it: the engine load and the classification.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MODEL = "smollm2-135m"
LABELLERS = ("clue", "outcome", "last-step")  # the default; also: likelihood


def cli(*args, lock: str | None = None, waited: list | None = None) -> float:
    """Run one stepkit command; its wall time in seconds. With ``lock``, the command runs while this process
    holds an exclusive ``flock`` of that file (what ``flock(1)`` takes), and the seconds spent waiting for it
    are appended to ``waited`` instead of being counted."""
    cmd = [sys.executable, "-m", "stepkit.cli", *map(str, args)]
    with open(lock, "a") if lock else open(os.devnull) as held:
        t0 = time.perf_counter()
        if lock:
            fcntl.flock(held, fcntl.LOCK_EX)
            if waited is not None:
                waited.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"stepkit {' '.join(map(str, args))} failed:\n{p.stderr[-3000:]}")
    return seconds


def half_of(row_id: str) -> str:
    return "tune" if int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % 2 == 0 else "heldout"


def heldout_sample(ids: list[str], n: int | None) -> list[int]:
    """Indices of the held-out rows (odd sha256 parity), in sha256(id) order, the first ``n`` of them (all when
    ``n`` is None): a sample that does not follow the file's order (ProcessBench lists erroneous rows first)."""
    held = [i for i, x in enumerate(ids) if half_of(x) == "heldout"]
    held.sort(key=lambda i: hashlib.sha256(ids[i].encode()).hexdigest())
    return sorted(held[:n] if n else held)


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
    # the bootstrap resamples erroneous and correct rows each within its own group (a stratified bootstrap), so
    # every draw has both and an F1, also on a small sample
    rng = random.Random(seed)
    groups = [[i for i, g in enumerate(gold) if g >= 0], [i for i, g in enumerate(gold) if g < 0]]
    draws = []
    for _ in range(1000 if all(groups) else 0):
        idx = [grp[rng.randrange(len(grp))] for grp in groups for _ in grp]
        draws.append(processbench_f1([gold[i] for i in idx], [pred[i] for i in idx])["f1"])
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
    return {"rows": len(rows), "rows_erroneous": len(err), "rows_unscored": sum(p is None for p in pred),
            "f1": f["f1"], "f1_ci95": [draws[24], draws[974]] if len(draws) == 1000 else None,
            "acc_erroneous": f["acc_erroneous"], "acc_correct": f["acc_correct"], "step_auc": auc(pos, neg),
            "exact_hits": hits, "chance_hits": sum(chance), "p_value": poisson_binomial_tail(chance, hits)}


def floor(path: Path) -> dict:
    """The fair floor on the rows of ``path``: predict -1 for a correct outcome, else a uniformly random step.
    Its expected accuracy on erroneous rows is the mean chance of an exact hit; on correct rows, the share whose
    outcome is correct; F1 of those two (the F1 of the expected accuracies, not the expected F1)."""
    rows = [r for r in pq.read_table(path).to_pylist() if r["reference_first_error"] is not None]
    err = [r for r in rows if r["reference_first_error"] >= 0]
    cor = [r for r in rows if r["reference_first_error"] < 0]
    chance = [0.0 if r["outcome_correct"] else 1 / len(r["steps"]) for r in err]
    acc_e = sum(chance) / len(err) if err else None
    acc_c = sum(bool(r["outcome_correct"]) for r in cor) / len(cor) if cor else None
    f1 = None if acc_e is None or acc_c is None else 0.0 if acc_e + acc_c == 0 else 2 * acc_e * acc_c / (acc_e + acc_c)
    return {"rows": len(rows), "rows_erroneous": len(err), "f1": f1, "acc_erroneous": acc_e, "acc_correct": acc_c,
            "chance_hits": sum(chance)}


def auc_text(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def table(report: dict) -> str:
    """The comparison as a Markdown table (one line per labeller, then the fair floor)."""
    head = ("| labeller | label s | label tokens | train s (steps, labels trained) | score s (load + classify) "
            "| ProcessBench F1 [95% CI] | acc err / cor | step AUC | exact hits vs chance (P) |")
    lines = [head, "|" + "---|" * 9]
    for name, r in report["labellers"].items():
        ci = "" if not r["f1_ci95"] else f" [{pct(r['f1_ci95'][0])}, {pct(r['f1_ci95'][1])}]"
        lines.append(
            f"| {name} | {r['label_seconds']} | {r['label_tokens']} | {r['train_seconds']} ({r['train_steps']}, "
            f"{r['labels_trained']}) | {r['score_seconds']} ({r['score_load_seconds']} + "
            f"{r['score_classify_seconds']}) | {pct(r['f1'])}{ci} | {pct(r['acc_erroneous'])} / "
            f"{pct(r['acc_correct'])} | {auc_text(r['step_auc'])} | "
            f"{r['exact_hits']} vs {r['chance_hits']:.1f} (P = {r['p_value']:.3f}) |")
    f = report.get("floor")
    if f:
        lines.append(f"| floor: outcome + random step | - | - | - | - | {pct(f['f1'])} | {pct(f['acc_erroneous'])} / "
                     f"{pct(f['acc_correct'])} | - | {f['chance_hits']:.1f} expected |")
    return "\n".join(lines)


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
    ap.add_argument("--heldout-rows", type=int, default=None,
                    help="score N held-out rows (the first N in sha256(id) order)")
    ap.add_argument("--threads", type=int, default=1, help="train-prm --threads")
    ap.add_argument("--likelihood-rows", type=int, default=64, help="likelihood: label the first N training rows")
    ap.add_argument("--table", default=None, help="also write the printed table (Markdown) to this file")
    ap.add_argument("--lock", default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    data, work = Path(a.data), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)

    pb = work / "pb.parquet"
    cli("ingest", "processbench", data / "processbench" / "gsm8k.json", pb)
    t = pq.read_table(pb)
    held = t.take(pa.array(heldout_sample(t.column("id").to_pylist(), a.heldout_rows), pa.int64()))
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

    report = {"settings": vars(a), "pool": {"solutions": len(rows), "problems": problems},
              "heldout": {"rows": held.num_rows}, "floor": floor(work / "pb-heldout.parquet"), "labellers": {}}
    for name in a.labellers.split(","):
        t0 = time.perf_counter()
        waited: list[float] = []
        label_tokens = 0
        ds = work / f"ds-{name}"
        if name == "clue":
            cli("clue", "recover", work / "train.parquet", work / "clues.parquet", "--from-reference", "--no-progress",
                "--force")
            cli("clue", "score", work / "train.parquet", work / "clue.parquet", "--clues", work / "clues.parquet",
                "--match", "numeric", "--no-progress", "--force")
            cli("export", work / "clue.parquet", ds, "--format", "trl", "--labels", "clue_label", "--force")
        elif name == "likelihood":
            sub = work / "train-likelihood.parquet"
            pq.write_table(pq.read_table(work / "train.parquet").slice(0, a.likelihood_rows), sub)
            cli("likelihood-label", sub, work / "likelihood.parquet", "--model", MODEL, "--no-progress", "--force",
                lock=a.lock, waited=waited)
            cli("export", work / "likelihood.parquet", ds, "--format", "trl", "--labels", "lh_label", "--force")
            label_tokens = manifest_of(work / "likelihood.parquet")["run"]["tokens_this_run"]
        elif name in ("outcome", "last-step"):
            tt = pq.read_table(work / "train.parquet")
            lab = [[bool(o)] * len(st) for o, st in zip(tt.column("outcome_correct").to_pylist(),
                                                       tt.column("steps").to_pylist())]
            pq.write_table(tt.append_column("outcome_label", pa.array(lab, pa.list_(pa.bool_()))),
                           work / "outcome.parquet")
            cli("export", work / "outcome.parquet", ds, "--format", "trl", "--labels", "outcome_label", "--force")
        else:
            raise SystemExit(f"unknown labeller {name} (this bench runs {', '.join(LABELLERS)}, likelihood)")
        label_s = time.perf_counter() - t0 - sum(waited)
        prm = work / f"prm-{name}"
        train_s = cli("train-prm", ds, prm, "--base-model", MODEL, "--max-length", a.max_length, "--max-steps",
                      a.max_steps, "--batch-size", a.batch_size, "--learning-rate", a.learning_rate, "--seed", a.seed,
                      "--threads", a.threads, "--no-progress", "--force",
                      *(["--train-on-last-step-only"] if name == "last-step" else []))
        doc = json.loads((prm / "stepkit-prm.json").read_text())
        scored = work / f"scored-{name}.parquet"
        score_wait: list[float] = []
        score_s = cli("prm-label", work / "pb-heldout.parquet", scored, "--model", prm, "--no-progress", "--force",
                      lock=a.lock, waited=score_wait)
        run = manifest_of(scored)["run"]
        res = {"label_seconds": round(label_s, 1), "label_tokens": label_tokens,
               "label_lock_wait_seconds": round(sum(waited), 1), "train_seconds": round(train_s, 1),
               "train_loop_seconds": doc["train"]["seconds"], "train_threads": doc["train"].get("threads"),
               "train_steps": doc["train"]["steps"], "train_rows": doc["counts"]["rows"],
               "labels_trained": doc["counts"]["labels_trained"], "labels_dropped": doc["counts"]["labels_dropped"],
               "first_loss": doc["train"]["first_loss"], "last_loss": doc["train"]["last_loss"],
               "score_seconds": round(score_s, 1), "score_lock_wait_seconds": round(sum(score_wait), 1),
               "score_load_seconds": run["load_seconds"], "score_classify_seconds": run["seconds_this_run"],
               "score_tokens": run["tokens_this_run"], **score(scored, a.seed)}
        report["labellers"][name] = res
        print(f"{name:10s} label {res['label_seconds']:6.1f}s  train {res['train_seconds']:6.1f}s "
              f"({res['train_steps']} steps, {res['labels_trained']} labels, loss {res['first_loss']:.3f} -> "
              f"{res['last_loss']:.3f})  score {res['score_seconds']:.1f}s (load {res['score_load_seconds']}s, "
              f"classify {res['score_classify_seconds']}s, lock wait {res['score_lock_wait_seconds']}s)  "
              f"F1 {pct(res['f1'])}  step AUC {res['step_auc']}  exact hits {res['exact_hits']} vs "
              f"{res['chance_hits']:.1f} (P = {res['p_value']:.3f})", flush=True)
        if a.json:  # after every labeller: a run stopped later keeps what it measured
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(report, indent=2))
    text = table(report)
    print(f"\nheld-out rows scored: {held.num_rows}; budget per PRM: {a.train_rows} training solutions, "
          f"--max-length {a.max_length}, --max-steps {a.max_steps}, --batch-size {a.batch_size}, "
          f"--learning-rate {a.learning_rate}, --threads {a.threads}\n\n{text}", flush=True)
    if a.table:
        Path(a.table).parent.mkdir(parents=True, exist_ok=True)
        Path(a.table).write_text(text + "\n")
    return report


def manifest_of(shard: Path) -> dict:
    from stepkit.shards import read_manifest

    return read_manifest(shard) or {}


if __name__ == "__main__":
    main()
