"""The closed loop: which labeller's labels train the better PRM? (Qwen's "Lessons of Developing PRMs",
Math-Shepherd and OmegaPRM compare labellers this way.)

Training data: the GSM8K model solutions of ``../shared/data/gsm8k/example_model_solutions.jsonl`` whose problems
are **not** among ProcessBench gsm8k's (by the problem text, whitespace normalised), a seeded sample of
``--train-rows``. Labellers (``--labellers``, default the model-free three; the engine ones load the bundled
model under ``--lock``):

* ``clue``: ``clue recover --from-reference`` + ``clue score --match numeric`` -> ``clue_label``;
* ``outcome``: every step labelled with the solution's graded outcome (the baseline a step labeller must beat);
* ``last-step``: the outcome on the last step only (``train-prm --train-on-last-step-only``: outcome supervision);
* ``mc``: ``mc-label`` (exhaustive, the bundled model, ``--mc-k`` continuations of ``--mc-max-tokens`` per step
  prefix) -> ``mc_label`` on the first ``--mc-rows`` training rows only (it generates: its cost is generated
  tokens); rows where no continuation reached the gold answer (``no_signal``) have no labels and are dropped by
  the export (counted in ``mc_status``);
* ``likelihood``: ``likelihood-label`` (answer-gain, the bundled model, its default threshold) -> ``lh_label`` on
  the first ``--likelihood-rows`` training rows (it prefills every step prefix).

A labeller on fewer rows gets the same training budget (more epochs of the same steps). Each labeller's
``positive labels`` is the share of its step labels that are true (what its PRM learns to call correct).

Each labeller's export trains one PRM from the bundled SmolLM2-135M with the same budget (``--max-length``,
``--max-steps``, ``--batch-size``, ``--learning-rate``). One ``prm-label`` run per PRM (vLLM's pooling runner, one
engine load) scores both halves of ProcessBench gsm8k: the **tune** half (``int(sha256(id), 16)`` even, all 207
rows or ``--tune-rows``) and the **held-out** half (odd). Every figure is measured on the held-out half only, twice:
at the default threshold 0.5, and at the threshold tuned on the tune half (the F1-best one, chosen by
``prm-label --calibrate``'s own selection, :func:`stepkit.stages.prm_label.calibrate_threshold`; nothing is tuned
on the held-out half). A PRM trained on mostly positive labels puts every score on one side of 0.5, so the
untuned figure says little. The tune half's share of the scoring (by tokens read) is printed as the
calibration's extra cost. The figures: ``eval``'s ProcessBench F1 with a bootstrap 95% interval (1000 draws,
seed 0, erroneous and correct rows each resampled within their own group), the per-step AUC (threshold-free;
steps before the human first error are correct, the first error is wrong, later steps unlabelled), and exact
first-error hits on erroneous rows against the fair floor "outcome + a random step" (expected hits, and the
exact Poisson-binomial P(X >= hits)).

``--jobs 2`` runs two labellers at once: one trains (torch, one thread) while the other holds the engine, so the
seconds of a probe include contention with the other; the lock keeps one engine at a time.

``--heldout-rows N`` scores N held-out rows taken in sha256(id) order, never the file's first N
(``gsm8k.json`` lists every erroneous row before the correct ones, so its first rows have no correct sample).
The line ``floor`` is the fair floor itself on the same rows: its expected accuracies and their F1.

    python bench/closed_loop.py [--data ../shared/data] [--work out/bench/closed-loop] [--json F] [--table F]
        [--labellers clue,outcome,last-step,mc,likelihood] [--train-rows 64] [--max-length 192] [--max-steps 8]
        [--batch-size 4] [--threads 1] [--heldout-rows N] [--tune-rows N] [--mc-rows 32] [--mc-k 4]
        [--mc-max-tokens 192] [--likelihood-rows 64] [--jobs 1] [--lock /tmp/stepkit-engine.lock]

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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MODEL = "smollm2-135m"
LABELLERS = ("mc", "clue", "outcome", "last-step", "likelihood")
DEFAULT = ("clue", "outcome", "last-step")  # the model-free ones (minutes); mc and likelihood load the engine


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


def tune_sample(ids: list[str], n: int | None) -> list[int]:
    """Indices of the tune rows (even sha256 parity), in sha256(id) order, the first ``n`` (all when None)."""
    tune = [i for i, x in enumerate(ids) if half_of(x) == "tune"]
    tune.sort(key=lambda i: hashlib.sha256(ids[i].encode()).hexdigest())
    return sorted(tune[:n] if n else tune)


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


def rows_of(src) -> list[dict]:
    """The rows of a shard path, or ``src`` itself when it is a list of row dicts."""
    return src if isinstance(src, list) else pq.read_table(src).to_pylist()


def rethreshold(rows: list[dict], threshold: float) -> list[dict]:
    """The rows with ``prm_first_error`` and ``prm_label`` re-read from ``prm_score`` at ``threshold`` (what
    ``prm-label --threshold`` writes; rows without scores are kept as they are)."""
    from stepkit.stages.prm_label import first_error

    return [{**r, "prm_first_error": first_error(r["prm_score"], threshold),
             "prm_label": [v >= threshold for v in r["prm_score"]]} if r.get("prm_score") is not None else r
            for r in rows]


def tune_threshold(tune_rows: list[dict]) -> dict:
    """The F1-best threshold on the tune half's scored rows: ``prm-label --calibrate``'s own selection
    (:func:`stepkit.stages.prm_label.calibrate_threshold` on ``reference_first_error``)."""
    from stepkit.stages.prm_label import calibrate_threshold

    return calibrate_threshold([r for r in tune_rows if r.get("reference_first_error") is not None],
                               "reference_first_error")


def score(path, seed: int = 0) -> dict:
    """The held-out figures of scored rows (a shard path or a list of row dicts)."""
    from stepkit.metrics import processbench_f1

    rows = [r for r in rows_of(path) if r["reference_first_error"] is not None]
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


def floor(path) -> dict:
    """The fair floor on the rows of ``path``: predict -1 for a correct outcome, else a uniformly random step.
    Its expected accuracy on erroneous rows is the mean chance of an exact hit; on correct rows, the share whose
    outcome is correct; F1 of those two (the F1 of the expected accuracies, not the expected F1)."""
    rows = [r for r in rows_of(path) if r["reference_first_error"] is not None]
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


def positive_share(rows: list[dict], col: str, last_only: bool = False) -> dict:
    """Of the step labels a labeller wrote in ``col`` (list<bool>; nulls and rows without labels skipped; with
    ``last_only`` the last step's only), how many there are and the share that is True."""
    labels = []
    for r in rows:
        got = r.get(col)
        if got is None:
            continue
        labels += [bool(v) for v in (got[-1:] if last_only else got) if v is not None]
    return {"labels": len(labels), "rows_labelled": sum(r.get(col) is not None for r in rows),
            "positive": sum(labels) / len(labels) if labels else None}


def _line(name: str, cost: str, thr: str, r: dict) -> str:
    ci = "" if not r["f1_ci95"] else f" [{pct(r['f1_ci95'][0])}, {pct(r['f1_ci95'][1])}]"
    return (f"| {name} | {cost} | {thr} | {pct(r['f1'])}{ci} | {pct(r['acc_erroneous'])} / {pct(r['acc_correct'])} "
            f"| {auc_text(r['step_auc'])} | {r['exact_hits']} vs {r['chance_hits']:.1f} (P = {r['p_value']:.3f}) |")


def table(report: dict) -> str:
    """The comparison as a Markdown table: per labeller one line at the threshold 0.5 (with the costs) and, when
    measured, one at the threshold tuned on the tune half (its tune-half F1 in brackets); then the fair floor."""
    head = ("| labeller | positive labels | label s | label tokens | train s (steps, labels trained) "
            "| score s (load + classify) | threshold | held-out F1 [95% CI] | acc err / cor | step AUC "
            "| exact hits vs chance (P) |")
    lines = [head, "|" + "---|" * 11]
    for name, r in report["labellers"].items():
        share = r.get("label_positive")
        cost = (f"{pct(share)}% of {r.get('label_count', '-')} | {r['label_seconds']} | {r['label_tokens']} | "
                f"{r['train_seconds']} ({r['train_steps']}, {r['labels_trained']}) | {r['score_seconds']} "
                f"({r['score_load_seconds']} + {r['score_classify_seconds']})")
        lines.append(_line(name, cost, "0.5", r))
        c = r.get("calibrated")
        if c:
            lines.append(_line(f"{name}, tuned", "″ | ″ | ″ | ″ | ″", f"{c['threshold']:.4f} (tune F1 "
                               f"{pct(c['tune_f1'])})", c))
    f = report.get("floor")
    if f:
        lines.append(f"| floor: outcome + random step | - | - | - | - | - | - | {pct(f['f1'])} | "
                     f"{pct(f['acc_erroneous'])} / {pct(f['acc_correct'])} | - | {f['chance_hits']:.1f} expected |")
    return "\n".join(lines)


def label(name: str, a, work: Path) -> tuple[Path, dict]:
    """Build labeller ``name``'s export from the training rows: its folder and the labelling figures."""
    t0 = time.perf_counter()
    waited: list[float] = []
    tokens, extra = 0, {}
    ds = work / f"ds-{name}"
    if name == "clue":
        cli("clue", "recover", work / "train.parquet", work / "clues.parquet", "--from-reference", "--no-progress",
            "--force")
        cli("clue", "score", work / "train.parquet", work / "clue.parquet", "--clues", work / "clues.parquet",
            "--match", "numeric", "--no-progress", "--force")
        shard, col = work / "clue.parquet", "clue_label"
    elif name in ("likelihood", "mc"):
        n = a.likelihood_rows if name == "likelihood" else a.mc_rows
        sub, shard = work / f"train-{name}.parquet", work / f"{name}.parquet"
        pq.write_table(pq.read_table(work / "train.parquet").slice(0, n), sub)
        if name == "likelihood":
            cli("likelihood-label", sub, shard, "--model", MODEL, "--no-progress", "--force", lock=a.lock,
                waited=waited)
            col = "lh_label"
        else:
            cli("mc-label", sub, shard, "--model", MODEL, "--continuations", a.mc_k, "--max-tokens",
                a.mc_max_tokens, "--seed", a.seed, "--no-progress", "--force", lock=a.lock, waited=waited)
            col = "mc_label"
            st = pq.read_table(shard, columns=["mc_status"]).column("mc_status").to_pylist()
            extra = {"mc_status": {k: st.count(k) for k in sorted(set(map(str, st)))}, "mc_k": a.mc_k,
                     "mc_max_tokens": a.mc_max_tokens}
        tokens = manifest_of(shard)["run"]["tokens_this_run"]
    elif name in ("outcome", "last-step"):
        tt = pq.read_table(work / "train.parquet")
        lab = [[bool(o)] * len(st) for o, st in zip(tt.column("outcome_correct").to_pylist(),
                                                   tt.column("steps").to_pylist())]
        shard, col = work / f"{name}.parquet", "outcome_label"
        pq.write_table(tt.append_column(col, pa.array(lab, pa.list_(pa.bool_()))), shard)
    else:
        raise SystemExit(f"unknown labeller {name} (this bench runs {', '.join(LABELLERS)})")
    cli("export", shard, ds, "--format", "trl", "--labels", col, "--force")
    share = positive_share(pq.read_table(shard).to_pylist(), col, last_only=name == "last-step")
    return ds, {"label_seconds": round(time.perf_counter() - t0 - sum(waited), 1), "label_tokens": tokens,
                "label_lock_wait_seconds": round(sum(waited), 1), "label_rows": share["rows_labelled"],
                "label_count": share["labels"], "label_positive": share["positive"], **extra}


def probe(name: str, a, work: Path) -> dict:
    """One labeller through the loop: label, export, train-prm, prm-label on both halves of ProcessBench gsm8k,
    the threshold tuned on the tune half, both thresholds' figures on the held-out half."""
    ds, res = label(name, a, work)
    prm = work / f"prm-{name}"
    train_s = cli("train-prm", ds, prm, "--base-model", MODEL, "--max-length", a.max_length, "--max-steps",
                  a.max_steps, "--batch-size", a.batch_size, "--learning-rate", a.learning_rate, "--seed", a.seed,
                  "--threads", a.threads, "--no-progress", "--force",
                  *(["--train-on-last-step-only"] if name == "last-step" else []))
    doc = json.loads((prm / "stepkit-prm.json").read_text())
    scored = work / f"scored-{name}.parquet"
    score_wait: list[float] = []
    score_s = cli("prm-label", work / "pb-scored.parquet", scored, "--model", prm, "--no-progress", "--force",
                  lock=a.lock, waited=score_wait)
    run = manifest_of(scored)["run"]
    rows = pq.read_table(scored).to_pylist()
    tune = [r for r in rows if half_of(r["id"]) == "tune"]
    held = [r for r in rows if half_of(r["id"]) == "heldout"]
    tune_tokens = sum(r["prm_tokens"] or 0 for r in tune)
    cal = tune_threshold(tune)
    res.update({
        "train_seconds": round(train_s, 1), "train_loop_seconds": doc["train"]["seconds"],
        "train_threads": doc["train"].get("threads"), "train_steps": doc["train"]["steps"],
        "train_rows": doc["counts"]["rows"], "labels_trained": doc["counts"]["labels_trained"],
        "labels_dropped": doc["counts"]["labels_dropped"], "first_loss": doc["train"]["first_loss"],
        "last_loss": doc["train"]["last_loss"], "score_seconds": round(score_s, 1),
        "score_lock_wait_seconds": round(sum(score_wait), 1), "score_load_seconds": run["load_seconds"],
        "score_classify_seconds": run["seconds_this_run"], "score_tokens": run["tokens_this_run"],
        "score_rows": {"tune": len(tune), "heldout": len(held)}, "score_tune_tokens": tune_tokens,
        # the calibration's extra scoring: the tune half's share of the classification (by tokens read)
        "score_tune_seconds_est": round(run["seconds_this_run"] * tune_tokens / max(1, run["tokens_this_run"]), 1),
        **score(held, a.seed),
        "calibrated": {"threshold": cal["threshold"], "tune_f1": cal["f1"], "tune_rows": cal["rows"],
                       **score(rethreshold(held, cal["threshold"]), a.seed)}})
    c = res["calibrated"]
    print(f"{name:10s} labels {res['label_count']} ({pct(res['label_positive'])}% positive) in "
          f"{res['label_seconds']}s, {res['label_tokens']} tokens; train {res['train_seconds']}s "
          f"({res['train_steps']} steps, {res['labels_trained']} labels, loss {res['first_loss']:.3f} -> "
          f"{res['last_loss']:.3f}); score {res['score_seconds']}s (load {res['score_load_seconds']}s, classify "
          f"{res['score_classify_seconds']}s of which the tune half ~{res['score_tune_seconds_est']}s, lock wait "
          f"{res['score_lock_wait_seconds']}s); threshold 0.5: F1 {pct(res['f1'])}, hits {res['exact_hits']} vs "
          f"{res['chance_hits']:.1f} (P = {res['p_value']:.3f}); tuned {c['threshold']:.4f} (tune F1 "
          f"{pct(c['tune_f1'])}): F1 {pct(c['f1'])}, hits {c['exact_hits']} (P = {c['p_value']:.3f}); step AUC "
          f"{auc_text(res['step_auc'])}", flush=True)
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--work", default="out/bench/closed-loop")
    ap.add_argument("--json", default=None)
    ap.add_argument("--labellers", default=",".join(DEFAULT))
    ap.add_argument("--train-rows", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--learning-rate", type=float, default=2e-5)
    ap.add_argument("--heldout-rows", type=int, default=None,
                    help="score N held-out rows (the first N in sha256(id) order)")
    ap.add_argument("--tune-rows", type=int, default=None,
                    help="tune the threshold on N tune-half rows (the first N in sha256(id) order) [default: all]")
    ap.add_argument("--threads", type=int, default=1, help="train-prm --threads")
    ap.add_argument("--likelihood-rows", type=int, default=64, help="likelihood: label the first N training rows")
    ap.add_argument("--mc-rows", type=int, default=32, help="mc: label the first N training rows")
    ap.add_argument("--mc-k", type=int, default=4, help="mc: continuations per step prefix")
    ap.add_argument("--mc-max-tokens", type=int, default=192, help="mc: tokens per continuation")
    ap.add_argument("--jobs", type=int, default=1,
                    help="labellers run at once (training of one overlaps another's engine work; the lock keeps "
                         "one engine at a time)")
    ap.add_argument("--table", default=None, help="also write the printed table (Markdown) to this file")
    ap.add_argument("--lock", default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    data, work = Path(a.data), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    names = a.labellers.split(",")
    for name in names:
        if name not in LABELLERS:
            raise SystemExit(f"unknown labeller {name} (this bench runs {', '.join(LABELLERS)})")

    t_start = time.perf_counter()
    pb = work / "pb.parquet"
    cli("ingest", "processbench", data / "processbench" / "gsm8k.json", pb)
    t = pq.read_table(pb)
    ids = t.column("id").to_pylist()
    held_idx = heldout_sample(ids, a.heldout_rows)
    tune_idx = tune_sample(ids, a.tune_rows)
    held = t.take(pa.array(held_idx, pa.int64()))
    pq.write_table(held, work / "pb-heldout.parquet")
    # one prm-label run per PRM reads both halves (one engine load); the halves are split again by sha256 parity
    pq.write_table(t.take(pa.array(sorted(tune_idx + held_idx), pa.int64())), work / "pb-scored.parquet")
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
          f"{len(train)} sampled; ProcessBench rows scored: {held.num_rows} held-out, {len(tune_idx)} tune",
          flush=True)

    report = {"settings": vars(a), "pool": {"solutions": len(rows), "problems": problems},
              "heldout": {"rows": held.num_rows}, "tune": {"rows": len(tune_idx)},
              "floor": floor(work / "pb-heldout.parquet"), "labellers": {}}
    done = threading.Lock()

    def one(name: str) -> None:
        res = probe(name, a, work)
        with done:
            report["labellers"][name] = res
            report["labellers"] = {n: report["labellers"][n] for n in names if n in report["labellers"]}
            report["wall_seconds"] = round(time.perf_counter() - t_start, 1)
            write(report, a)  # after every labeller: a run stopped later keeps what it measured

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for f in [pool.submit(one, n) for n in names]:
            f.result()
    text = table(report)
    print(f"\nProcessBench gsm8k rows scored: {held.num_rows} held-out (reported), {len(tune_idx)} tune (threshold "
          f"only); budget per PRM: {a.train_rows} training solutions (likelihood {a.likelihood_rows}, mc "
          f"{a.mc_rows}: K {a.mc_k}, {a.mc_max_tokens} tokens), --max-length {a.max_length}, --max-steps "
          f"{a.max_steps}, --batch-size {a.batch_size}, --learning-rate {a.learning_rate}, --threads {a.threads}, "
          f"{a.jobs} labeller(s) at once; wall {report.get('wall_seconds')} s\n\n{text}", flush=True)
    return report


def write(report: dict, a) -> None:
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2))
    if a.table:
        Path(a.table).parent.mkdir(parents=True, exist_ok=True)
        Path(a.table).write_text(table(report) + "\n")


def manifest_of(shard: Path) -> dict:
    from stepkit.shards import read_manifest

    return read_manifest(shard) or {}


if __name__ == "__main__":
    main()
