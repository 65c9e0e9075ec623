"""bench/closed_loop.py's pieces that need neither an engine nor training: which ProcessBench rows it scores,
the fair floor, the exact tail probability, the table, and the engine lock's wait kept apart from the cost.
(The benchmark itself is run by `make bench`; its measured table is in bench/results/.)"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA, ROOT

spec = importlib.util.spec_from_file_location("closed_loop", ROOT / "bench" / "closed_loop.py")
loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loop)


@pytest.fixture(scope="module")
def pb():
    return json.loads((DATA / "processbench" / "gsm8k.json").read_text())


def test_heldout_sample_mixes_correct_and_erroneous_rows(pb):
    """gsm8k.json lists every erroneous row before the correct ones: the file's first held-out rows are all
    erroneous (F1 undefined), so a sample of N follows sha256(id) order instead."""
    ids = [r["id"] for r in pb]
    odd = [i for i, x in enumerate(ids) if int(hashlib.sha256(x.encode()).hexdigest(), 16) % 2]
    assert len(odd) == 193 and all(pb[i]["label"] >= 0 for i in odd[:64])  # the trap
    every = loop.heldout_sample(ids, None)
    assert every == odd
    some = loop.heldout_sample(ids, 64)
    assert len(some) == 64 and set(some) <= set(odd) and some == sorted(some)
    correct = sum(pb[i]["label"] == -1 for i in some)
    assert 16 <= correct <= 48  # about the half's share (87 of 193)
    assert loop.heldout_sample(ids, 64) == some  # reproducible
    assert set(loop.heldout_sample(ids, 32)) <= set(some)  # a smaller sample is a prefix of a larger one


def test_poisson_binomial_tail_is_exact():
    assert loop.poisson_binomial_tail([0.5, 0.5], 1) == pytest.approx(0.75)
    assert loop.poisson_binomial_tail([0.5, 0.25], 2) == pytest.approx(0.125)
    assert loop.poisson_binomial_tail([0.2, 0.3, 0.4], 0) == pytest.approx(1.0)
    assert loop.poisson_binomial_tail([], 1) == 0


def _scored(tmp_path, rows):
    path = tmp_path / "scored.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


ROWS = [  # gold first error, outcome, steps, prediction, scores
    {"reference_first_error": 1, "outcome_correct": False, "steps": ["a", "b", "c", "d"], "prm_first_error": 1,
     "prm_score": [0.9, 0.2, 0.4, 0.3]},
    {"reference_first_error": 0, "outcome_correct": True, "steps": ["a", "b"], "prm_first_error": -1,
     "prm_score": [0.8, 0.7]},
    {"reference_first_error": -1, "outcome_correct": True, "steps": ["a", "b"], "prm_first_error": -1,
     "prm_score": [0.9, 0.6]},
    {"reference_first_error": -1, "outcome_correct": False, "steps": ["a"], "prm_first_error": 0,
     "prm_score": [0.1]},
]


def test_floor_and_score_on_known_rows(tmp_path):
    path = _scored(tmp_path, ROWS)
    f = loop.floor(path)
    # erroneous rows: 1/4 (wrong outcome, 4 steps) and 0 (correct outcome: the floor says -1); correct rows: 1 of 2
    assert f["acc_erroneous"] == pytest.approx(0.125) and f["acc_correct"] == 0.5
    assert f["f1"] == pytest.approx(2 * 0.125 * 0.5 / 0.625) and f["chance_hits"] == pytest.approx(0.25)
    s = loop.score(path)
    assert s["rows"] == 4 and s["rows_erroneous"] == 2 and s["exact_hits"] == 1
    assert s["acc_erroneous"] == 0.5 and s["acc_correct"] == 0.5 and s["f1"] == 0.5
    assert s["chance_hits"] == pytest.approx(0.25) and s["p_value"] == pytest.approx(0.25)
    # correct steps: 0.9 (row 0 before its error), 0.9, 0.6, 0.1 (correct rows); wrong: 0.2 (row 0), 0.8 (row 1)
    pos, neg = [0.9, 0.9, 0.6, 0.1], [0.2, 0.8]
    assert s["step_auc"] == pytest.approx(loop.auc(pos, neg)) == pytest.approx(5 / 8)
    lo, hi = s["f1_ci95"]
    assert 0 <= lo <= hi <= 1


def test_table_has_lines_per_labeller_and_threshold_and_the_floor(tmp_path):
    path = _scored(tmp_path, ROWS)
    res = {"label_seconds": 1.0, "label_tokens": 0, "label_count": 8, "label_positive": 0.75, "train_seconds": 2.0,
           "train_steps": 3, "labels_trained": 4, "score_seconds": 5.0, "score_load_seconds": 3.0,
           "score_classify_seconds": 1.5, **loop.score(path)}
    tuned = {"threshold": 0.25, "tune_f1": 0.8, **loop.score(loop.rethreshold(loop.rows_of(path), 0.25))}
    text = loop.table({"labellers": {"clue": {**res, "calibrated": tuned}, "outcome": {**res, "step_auc": None}},
                       "floor": loop.floor(path)})
    lines = text.splitlines()
    assert len(lines) == 6
    assert lines[2].startswith("| clue | 75.0% of 8 | 1.0 | 0 | 2.0 (3, 4) | 5.0 (3.0 + 1.5) | 0.5 | 50.0 [")
    assert "| 0.625 |" in lines[2] and "1 vs 0.2 (P = 0.250)" in lines[2]
    assert lines[3].startswith("| clue, tuned | ") and "| 0.2500 (tune F1 80.0) |" in lines[3]
    assert "| - |" in lines[4] and not lines[4].startswith("| outcome, tuned")
    assert lines[5].startswith("| floor: outcome + random step |") and "| 20.0 | 12.5 / 50.0 |" in lines[5]


def test_the_threshold_is_tuned_on_the_tune_rows_and_only_applied_to_the_heldout_rows():
    """The tune half picks the threshold (prm-label --calibrate's selection); the held-out rows are only
    re-read at it. A PRM whose scores are all above 0.5 predicts no error at 0.5; tuned, it finds them."""
    tune = [  # erroneous rows score ~0.6 at their first error, correct rows stay ~0.9
        {"id": "t1", "reference_first_error": 1, "prm_status": "ok", "prm_score": [0.9, 0.6, 0.9]},
        {"id": "t2", "reference_first_error": 0, "prm_status": "ok", "prm_score": [0.62, 0.9]},
        {"id": "t3", "reference_first_error": -1, "prm_status": "ok", "prm_score": [0.91, 0.88]},
        {"id": "t4", "reference_first_error": -1, "prm_status": "ok", "prm_score": [0.9, 0.92, 0.87]},
    ]
    cal = loop.tune_threshold(tune)
    assert 0.62 < cal["threshold"] < 0.87 and cal["f1"] == 1.0 and cal["rows"] == 4
    held = [
        {"reference_first_error": 2, "outcome_correct": False, "steps": ["a", "b", "c"], "prm_first_error": -1,
         "prm_score": [0.95, 0.9, 0.61], "prm_label": [True] * 3},
        {"reference_first_error": -1, "outcome_correct": True, "steps": ["a", "b"], "prm_first_error": -1,
         "prm_score": [0.9, 0.95], "prm_label": [True] * 2},
        {"reference_first_error": 0, "outcome_correct": False, "steps": ["a"], "prm_first_error": None,
         "prm_score": None, "prm_label": None},  # unscored: kept as it is
    ]
    at_half = loop.score(held)
    assert at_half["exact_hits"] == 0 and at_half["acc_correct"] == 1.0
    moved = loop.rethreshold(held, cal["threshold"])
    assert [r["prm_first_error"] for r in moved] == [2, -1, None] and moved[0]["prm_label"] == [True, True, False]
    assert loop.score(moved)["exact_hits"] == 1 and held[0]["prm_first_error"] == -1  # the input is not changed


def test_positive_share_counts_the_labels_a_labeller_wrote():
    rows = [{"x": [True, False, True]}, {"x": None}, {"x": [None, True]}]
    assert loop.positive_share(rows, "x") == {"labels": 4, "rows_labelled": 2, "positive": 0.75}
    assert loop.positive_share(rows, "x", last_only=True) == {"labels": 2, "rows_labelled": 2, "positive": 1.0}
    assert loop.positive_share([{"x": None}], "x")["positive"] is None


def test_tune_and_heldout_samples_are_the_two_halves(pb):
    ids = [r["id"] for r in pb]
    tune, held = loop.tune_sample(ids, None), loop.heldout_sample(ids, None)
    assert not set(tune) & set(held) and len(tune) + len(held) == len(ids) == 400
    assert all(loop.half_of(ids[i]) == "tune" for i in tune)


def test_the_lock_wait_is_reported_apart_from_the_command(tmp_path):
    """cli(lock=...) takes the same exclusive flock as flock(1): while another holder has it, the command waits,
    and that wait is not in the seconds returned."""
    lock = tmp_path / "engine.lock"
    held = open(lock, "a")
    fcntl.flock(held, fcntl.LOCK_EX)
    threading.Timer(1.0, lambda: held.close()).start()
    waited = []
    t0 = time.perf_counter()
    seconds = loop.cli("--help", lock=str(lock), waited=waited)
    total = time.perf_counter() - t0
    assert waited and waited[0] >= 0.9 and seconds < total - 0.9
