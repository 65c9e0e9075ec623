"""mc-label's algorithm, checked exactly with the scripted engine (known value per prefix)."""

from __future__ import annotations

import math
import random

import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import KnownValuePolicy, ScriptedEngine
from stepkit.grading.verdicts import labels_from_first_error
from stepkit.stages.mc_label import FirstErrorSearch, MCLabelConfig, MCLabelStage, PrefixEstimate, label_row

RIGHT, WRONG = "So that is it.\nThe answer is 18.", "So that is it.\nThe answer is 17."


def make_row(n_steps: int, outcome_correct: bool, rid: str = "r0") -> dict:
    return {"id": rid, "problem_id": "p", "prompt": f"Problem {rid}: how many eggs?", "reference_answer": "18",
            "steps": [f"<s{k}> step number {k} of {rid}" for k in range(n_steps)], "step_separator": "\n",
            "final_answer": "18" if outcome_correct else "17", "outcome_correct": outcome_correct,
            "generator": "test", "error": None}


def prefix_len(prompt: str) -> int:
    """How many steps the rendered prompt's assistant prefix holds (steps are tagged <sK>)."""
    return prompt.count("> step number ")


def stage_for(values, k=4, mode="exhaustive", truncated=None, checker=None):
    """A stage whose engine succeeds on prefix i with probability values[i] (exact counts)."""
    policy = KnownValuePolicy(lambda p: values[prefix_len(p)], RIGHT, WRONG, truncated)
    engine = ScriptedEngine(policy, "scripted:known")
    stage = MCLabelStage(MCLabelConfig(continuations=k, mode=mode), EngineSpec.of(engine),
                         SamplingConfig(max_tokens=64), lambda: checker)
    stage.open()
    return stage, engine


def test_exhaustive_exact_counts(checker):
    # v0..v3 from continuations; v4 is the (incorrect) outcome.
    stage, engine = stage_for({0: 0.5, 1: 1.0, 2: 0.25, 3: 0.0}, k=4, checker=checker)
    (row,), counters = stage.process([make_row(4, False)])
    assert row["mc_rollouts"] == [4, 4, 4, 0]
    assert row["mc_successes"] == [4, 1, 0, 0]
    assert row["mc_truncated"] == [0, 0, 0, 0]
    assert row["mc_value"] == [1.0, 0.25, 0.0, 0.0]
    assert row["mc_value_start"] == 0.5
    assert row["mc_label"] == [True, True, False, False]
    assert row["mc_progress"] == [0.5, -0.75, -0.25, 0.0]
    assert row["mc_first_error"] == 2
    assert row["mc_status"] == "ok"
    assert row["mc_estimated"] == [True] * 4
    assert counters["continuations"] == 16 == sum(r.n for r in engine.calls)
    assert counters["successes"] == 2 + 4 + 1


def test_correct_outcome_can_hide_a_process_error(checker):
    # The value drops to 0 after step 1 and recovers: ProcessBench-style first error on a correct answer.
    stage, _ = stage_for({0: 0.5, 1: 0.5, 2: 0.0, 3: 0.75}, checker=checker)
    (row,), _ = stage.process([make_row(4, True)])
    assert row["mc_value"] == [0.5, 0.0, 0.75, 1.0]
    assert row["mc_first_error"] == 1
    assert row["mc_label"] == [True, False, True, True]


def test_truncated_continuations_are_excluded_not_wrong(checker):
    # Prefix 1: 2 of 4 truncated, the other 2 graded; prefix 2: all truncated -> value unknown.
    trunc = {0: 0, 1: 2, 2: 4}
    stage, _ = stage_for({0: 1.0, 1: 1.0, 2: 0.0}, truncated=lambda p: trunc[prefix_len(p)], checker=checker)
    (row,), counters = stage.process([make_row(3, False)])
    assert row["mc_truncated"] == [2, 4, 0]
    assert row["mc_successes"] == [2, 0, 0]
    assert row["mc_value"] == [1.0, None, 0.0]
    assert row["mc_label"] == [True, None, False]
    assert row["mc_estimated"] == [True, False, True]
    assert row["mc_progress"] == [0.0, None, None]
    assert row["mc_first_error"] == 2
    assert counters["truncated"] == 6


def test_no_signal_is_not_step_zero_wrong(checker):
    stage, _ = stage_for({0: 0.0, 1: 0.0, 2: 0.0}, checker=checker)
    (row,), counters = stage.process([make_row(3, False)])
    assert row["mc_status"] == "no_signal"
    assert row["mc_first_error"] is None
    assert row["mc_label"] == [None, None, None]
    assert row["mc_successes"] == [0, 0, 0]
    assert counters["no_signal"] == 1


@pytest.mark.parametrize("n_steps", [1, 2, 3, 5, 8, 13, 16])
def test_binary_search_finds_known_first_error_within_budget(n_steps, checker):
    k = 4
    for first_zero in range(1, n_steps + 1):  # prefix length whose value first reaches 0
        values = {i: (0.75 if i < first_zero else 0.0) for i in range(n_steps)}
        stage, engine = stage_for(values, k=k, mode="binary", checker=checker)
        (row,), counters = stage.process([make_row(n_steps, False)])
        assert row["mc_first_error"] == first_zero - 1
        budget = k * (math.ceil(math.log2(n_steps)) + 1)
        assert counters["continuations"] <= budget, (n_steps, first_zero, counters)
        # Exhaustive mode agrees on the first error when values never recover.
        ex, _ = stage_for(values, k=k, checker=checker)
        (row_ex,), _ = ex.process([make_row(n_steps, False)])
        assert row_ex["mc_first_error"] == row["mc_first_error"]
        assert row["mc_label"] == row_ex["mc_label"]
        # Steps that were not estimated are marked, with null value and progress.
        for s in range(n_steps):
            if not row["mc_estimated"][s]:
                assert row["mc_value"][s] is None and row["mc_progress"][s] is None


@pytest.mark.parametrize("v0", [0.5, 0.0])
def test_binary_mode_correct_outcome_needs_no_search(checker, v0):
    stage, engine = stage_for({i: (v0 if i == 0 else 0.5) for i in range(6)}, mode="binary", checker=checker)
    (row,), counters = stage.process([make_row(6, True)])
    assert counters["continuations"] == 4  # v0 only
    assert row["mc_status"] == "ok"  # labels follow from the search assumption, whatever v0 is
    assert row["mc_first_error"] == -1
    assert row["mc_label"] == [True] * 6
    assert row["mc_estimated"] == [False] * 5 + [True]


def test_invariants_on_random_values(checker):
    rng = random.Random(7)
    rows, tables = [], {}
    for r in range(40):
        n = rng.randint(1, 7)
        tables[f"r{r}"] = {i: rng.choice([0.0, 0.25, 0.5, 1.0]) for i in range(n)}
        rows.append(make_row(n, rng.random() < 0.5, f"r{r}"))

    def value(prompt):
        rid = prompt.split("Problem ")[1].split(":")[0]
        return tables[rid][prefix_len(prompt)]

    for mode in ("exhaustive", "binary"):
        engine = ScriptedEngine(KnownValuePolicy(value, RIGHT, WRONG))
        stage = MCLabelStage(MCLabelConfig(continuations=4, mode=mode), EngineSpec.of(engine), SamplingConfig(),
                             lambda: checker)
        stage.open()
        out, _ = stage.process(rows)
        for row in out:
            m = len(row["steps"])
            for col in ("mc_rollouts", "mc_successes", "mc_truncated", "mc_value", "mc_label", "mc_estimated",
                        "mc_progress"):
                assert len(row[col]) == m, col
            assert all(0 <= s <= r for s, r in zip(row["mc_successes"], row["mc_rollouts"]))
            assert row["mc_value"][-1] == (1.0 if row["outcome_correct"] else 0.0)
            if row["mc_status"] == "ok":
                fe = row["mc_first_error"]
                assert -1 <= fe < m
                if not row["outcome_correct"]:
                    assert fe >= 0, "an incorrect outcome always has a first error"
                    assert row["mc_label"][fe] is False
            else:
                assert row["mc_status"] == "no_signal" and row["mc_first_error"] is None


def test_rows_that_cannot_be_labelled_keep_an_error(checker):
    stage, _ = stage_for({0: 1.0, 1: 1.0}, checker=checker)
    bad = make_row(2, False, "bad")
    bad["reference_answer"] = None
    out, counters = stage.process([make_row(2, False), bad])
    assert out[0]["error"] is None and out[0]["mc_status"] == "ok"
    assert out[1]["error"].startswith("mc-label: no reference_answer")
    assert out[1]["mc_value"] is None


def test_label_row_pure():
    est = {0: PrefixEstimate(4, 2, 0), 1: PrefixEstimate(4, 0, 0)}
    r = label_row(2, False, est, "exhaustive")
    assert r["mc_first_error"] == 0 and r["mc_value"] == [0.0, 0.0]


def test_search_counts_probes():
    s = FirstErrorSearch(16, False)
    probes = []
    while (p := s.next_probe()) is not None:
        probes.append(p)
        s.observe(p, 0.0 if p >= 11 else 0.5)
    assert s.hi == 11 and len(probes) <= 4


def test_unusable_reference_is_a_row_error_before_generation(checker):
    stage, engine = stage_for({0: 1.0, 1: 1.0}, checker=checker)
    bad = make_row(2, False, "bad")
    bad["reference_answer"] = "}"
    out, _ = stage.process([make_row(2, False), bad])
    assert out[1]["error"].startswith("mc-label: unusable reference_answer:")
    assert out[0]["error"] is None and out[0]["mc_status"] == "ok"
    assert all("Problem bad:" not in r.prompt for r in engine.calls)  # nothing generated for it


# --- hardening: binary label inference is linear in the number of steps (D23) ---------------------------

def test_binary_labels_are_inferred_once_per_row_on_a_long_solution(checker, monkeypatch):
    """20,001 steps, first zero after step 12,344: the search finds it and the labels of every unestimated
    step are inferred. The counter is what reveals the complexity (no timing): the M-long list of inferred
    labels is built once per row, where the quadratic version built it once per unestimated step (M * M)."""
    import stepkit.stages.mc_label as mc

    built = []

    def counting(first_error, n_steps):
        built.append(n_steps)
        return labels_from_first_error(first_error, n_steps)

    monkeypatch.setattr(mc, "labels_from_first_error", counting)
    n, first_zero = 20_001, 12_345
    stage, engine = stage_for({i: (0.5 if i < first_zero else 0.0) for i in range(n)}, k=2, mode="binary",
                              checker=checker)
    (row,), counters = stage.process([make_row(n, False)])
    assert row["mc_status"] == "ok" and row["mc_first_error"] == first_zero - 1
    assert row["mc_label"] == [True] * (first_zero - 1) + [False] * (n - first_zero + 1)
    probes = len(engine.calls) - 1  # besides v_0
    assert probes <= math.ceil(math.log2(n)) and sum(row["mc_estimated"]) == probes + 1
    assert sum(built) <= n, f"built {sum(built)} inferred labels for {n} steps"
