"""Identical and empty continuations in mc-label and mcts-label (issue 25, items 1 and 2), checked exactly
with scripted policies, and the cases of ../shared/cases whose fault is of that kind."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import Completion, EngineSpec, SamplingConfig
from stepkit.engines.scripted import KnownValuePolicy, ScriptedEngine
from stepkit.errors import StepkitError
from stepkit.per_row import MIN_DISTINCT_SHARE, ContinuationTally, distinct_share, distinct_warning
from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage
from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage
from tests.conftest import DATA, run_cli
from tests.test_mc_label import RIGHT, WRONG, make_row, prefix_len
from tests.test_mcts_label import problems


def mc_stage(policy, checker, k=4, mode="exhaustive", temperature=1.0):
    engine = ScriptedEngine(policy, "scripted:test")
    stage = MCLabelStage(MCLabelConfig(continuations=k, mode=mode), EngineSpec.of(engine),
                         SamplingConfig(max_tokens=64, temperature=temperature), lambda: checker)
    stage.open()
    return stage


def numbered(prompt, j, n):
    """Every sample its own text (the same answer, right): K distinct continuations per prefix."""
    return f"Sample {j} says so.\nThe answer is 18."


# --- the share itself ----------------------------------------------------------------------------------

def test_distinct_share_is_zero_for_copies_and_one_for_distinct_texts_whatever_k():
    for k in (2, 4, 8):
        copies, distinct = {}, {}
        for _ in range(3):
            assert ContinuationTally.add(copies, ["same"] * k) == 1
            assert ContinuationTally.add(distinct, [f"t{j}" for j in range(k)]) == k
        assert distinct_share(copies) == 0.0 and distinct_share(distinct) == 1.0
    single = {}
    ContinuationTally.add(single, ["alone"])  # one sample cannot repeat: not compared
    assert distinct_share(single) is None and distinct_warning("mc-label", single) is None
    half = {}
    ContinuationTally.add(half, ["a", "a", "b", "c", "d"])  # 3 of the 4 beyond the first are new
    assert distinct_share(half) == pytest.approx(0.75) and distinct_warning("mc-label", half) is None


# --- item 1: identical continuations --------------------------------------------------------------------

def test_mc_label_counts_distinct_continuations_and_warns_when_they_are_copies(checker):
    stage = mc_stage(lambda p, j, n: RIGHT, checker)  # K copies of one text at every prefix
    (row,), counters = stage.process([make_row(3, True)])
    assert row["mc_distinct"] == [1, 1, 0]  # the last step is the graded outcome: no continuation
    assert row["mc_value"] == [1.0, 1.0, 1.0]  # the values are still computed ...
    assert counters["compared_prefixes"] == 3  # v_0, prefixes 1 and 2
    assert counters["distinct_continuations"] == 3 and counters["repeated_continuations"] == 9
    (warning,) = stage.run_warnings(counters)  # ... but the run says they come from copies
    assert warning.startswith("mc-label: distinct share 0% (below 50%)")
    assert "9 repeat" in warning and "ignores per-request seeds" in warning

    fine = mc_stage(numbered, checker)
    (row,), counters = fine.process([make_row(3, True)])
    assert row["mc_distinct"] == [4, 4, 0] and counters["repeated_continuations"] == 0
    assert fine.run_warnings(counters) == []


def test_known_value_policy_two_texts_per_prefix_is_below_the_bound(checker):
    # value 0.5 with K=4: two right copies and two wrong copies: 2 distinct texts of 4, share 1/3
    stage = mc_stage(KnownValuePolicy(lambda p: 0.5, RIGHT, WRONG), checker)
    (row,), counters = stage.process([make_row(2, False)])
    assert row["mc_distinct"] == [2, 0] and row["mc_value"] == [0.5, 0.0]
    assert distinct_share(counters) == pytest.approx(1 / 3) and 1 / 3 < MIN_DISTINCT_SHARE
    assert "distinct share 33%" in stage.run_warnings(counters)[0]


def test_temperature_zero_is_named_as_the_cause(checker):
    stage = mc_stage(lambda p, j, n: RIGHT, checker, temperature=0.0)
    _, counters = stage.process([make_row(2, True)])
    assert "temperature 0" in stage.run_warnings(counters)[0]


def test_first_request_differs_case_is_caught(checker, cases):
    """vllm-prefix-cache-first-request-differs: a deterministic server answers run 1 = A, runs 2..N = B;
    K samples of a prefix are then two texts, and the run's distinct share says so."""
    c = cases["vllm-prefix-cache-first-request-differs"]
    assert "temperature 0" in c["input"]["request"] and c["expected"]["observed"] == "run 1 = A, runs 2..N = B"
    stage = mc_stage(lambda p, j, n: "First.\nThe answer is 18." if j == 0 else RIGHT, checker, k=8)
    (row,), counters = stage.process([make_row(3, True)])
    assert row["mc_distinct"] == [2, 2, 0]
    assert distinct_share(counters) == pytest.approx(1 / 7)
    assert stage.run_warnings(counters)


def test_mcts_label_counts_distinct_rollouts_per_node(tmp_path, checker):
    from stepkit.runner import run_stage

    def two_texts(prompt, j, n):  # every node: half right, half wrong, each half K/2 copies of one text
        return RIGHT.replace("18", "42") if j % 2 == 0 else WRONG

    cfg = MCTSConfig(continuations=4, search_limit=2, tree_out=str(tmp_path / "tree.parquet"))
    st = MCTSLabelStage(cfg, EngineSpec.of(ScriptedEngine(two_texts, "scripted:two")),
                        SamplingConfig(max_tokens=64), lambda: checker)
    (res,) = run_stage(st, problems(tmp_path, n=2), tmp_path / "m.parquet", progress=False)
    nodes = pq.read_table(tmp_path / "tree.parquet").to_pylist()
    assert nodes and all(n["distinct"] == 2 and n["empty"] == 0 for n in nodes)
    assert res.counters["compared_prefixes"] == len(nodes)
    assert res.counters["distinct_continuations"] == 2 * len(nodes)
    assert res.counters["repeated_continuations"] == 2 * len(nodes)
    rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert all(d in (None, 2) for r in rows for d in r["mcts_distinct"])
    assert any(d == 2 for r in rows for d in r["mcts_distinct"])
    assert "distinct share 33%" in st.run_warnings(res.counters)[0]


# --- item 2: empty continuations --------------------------------------------------------------------------

def test_empty_continuations_are_out_of_the_denominator_not_wrong(checker):
    # prefix 1: all 4 empty (the model ended its turn there); prefix 2: 2 empty, 2 right; v_0: 4 right
    empties = {0: 0, 1: 4, 2: 2, 3: 0}

    def policy(prompt, j, n):
        return Completion("", "stop", 0) if j < empties[prefix_len(prompt)] else RIGHT

    stage = mc_stage(policy, checker)
    (row,), counters = stage.process([make_row(4, True)])
    assert row["mc_empty"] == [4, 2, 0, 0]
    assert row["mc_successes"] == [0, 2, 4, 0]
    assert row["mc_value"] == [None, 1.0, 1.0, 1.0]  # was 0.0 and 0.5: an empty continuation graded wrong
    assert row["mc_estimated"] == [False, True, True, True]
    assert row["mc_first_error"] == -1  # was 0: a correct step reported as the first error
    assert row["mc_label"] == [None, True, True, True]
    assert counters["empty"] == 6 and counters["truncated"] == 0
    assert row["mc_distinct"] == [0, 1, 1, 0]  # empty texts are not compared


def test_whitespace_only_is_empty_as_in_rollout(checker):
    assert Completion(" \n\n ", "stop").empty and Completion("", "length").empty
    assert not Completion("", "error", error="x").empty and not Completion(".", "stop").empty
    stage = mc_stage(lambda p, j, n: "\n\n" if j == 0 else RIGHT, checker, mode="binary")
    (row,), counters = stage.process([make_row(3, False)])
    assert counters["empty"] == sum(row["mc_empty"]) + 1  # + v_0's
    assert all(v in (None, 1.0) for v in row["mc_value"][:-1])


@pytest.mark.parametrize("mode", ["exhaustive", "binary"])
def test_mostly_empty_run_is_refused_with_one_line(checker, mode):
    stage = mc_stage(lambda p, j, n: "" if j else RIGHT, checker, mode=mode)  # 3 of 4 empty
    _, counters = stage.process([make_row(3, False)])
    refused = stage.refusal(counters)  # (what the runner asks as the chunk is about to commit)
    assert isinstance(refused, StepkitError)
    msg = str(refused)
    assert "\n" not in msg and msg.startswith("mc-label: ") and "(75%) stopped at once with no text" in msg
    assert "chat template closes the assistant turn" in msg and "ends its turn at the prefix" in msg


def test_mcts_label_empty_rollouts_are_ungraded_not_wrong(tmp_path, checker):
    from stepkit.runner import run_stage

    def half_empty(prompt, j, n):  # every state: half empty, half right
        return "" if j % 2 else "So.\nThe answer is 42."

    cfg = MCTSConfig(continuations=4, search_limit=2, tree_out=str(tmp_path / "tree.parquet"))
    st = MCTSLabelStage(cfg, EngineSpec.of(ScriptedEngine(half_empty, "scripted:half")),
                        SamplingConfig(max_tokens=64), lambda: checker)
    (res,) = run_stage(st, problems(tmp_path, n=1), tmp_path / "m.parquet", progress=False)
    (root,) = pq.read_table(tmp_path / "tree.parquet").to_pylist()
    assert root["empty"] == 2 and root["truncated"] == 0 and root["value_own"] == 1.0  # was 0.5: searched
    rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert {r["mcts_status"] for r in rows} == {"all_correct"}
    assert res.counters["empty"] == 2 and res.counters["problems_all_correct"] == 1

    cfg = MCTSConfig(continuations=4, search_limit=2)
    all_empty = MCTSLabelStage(cfg, EngineSpec.of(ScriptedEngine(lambda p, j, n: "", "scripted:e")),
                               SamplingConfig(max_tokens=64), lambda: checker)
    with pytest.raises(StepkitError, match=r"^mcts-label: 4 of 4 continuations \(100%\) stopped at once"):
        run_stage(all_empty, problems(tmp_path, n=1), tmp_path / "e.parquet", progress=False)


def test_a_template_that_closes_the_turn_is_refused(checker, cases):
    """continue-final-message-trailing-whitespace (and its later fixes, an empty final message): when the
    rendered prompt has an end-of-turn token after the assistant prefix, a model has nothing to add and
    stops at once. The stage must not grade those as wrong continuations: it refuses the run, naming the
    chat template."""
    c = cases["continue-final-message-trailing-whitespace"]
    assert c["expected"]["no_end_of_turn_token_after_prefix"] is True

    class ClosingTemplate(ScriptedEngine):
        def render_chat(self, messages):  # a template that closes the assistant turn it opens
            return super().render_chat(messages) + "<|end|>\n"

    def model(prompt, j, n):  # a real model: after an end-of-turn token its turn is over
        return "" if "<|end|>" in prompt.rsplit("<|assistant|>", 1)[1] else RIGHT

    engine = ClosingTemplate(model, "scripted:closing")
    stage = MCLabelStage(MCLabelConfig(continuations=2), EngineSpec.of(engine), SamplingConfig(max_tokens=64),
                         lambda: checker)
    stage.open()
    _, counters = stage.process([make_row(3, True)])
    assert "chat template closes the assistant turn" in str(stage.refusal(counters))
    good = mc_stage(model, checker, k=2)  # the same model with stepkit's rendering: nothing empty
    (row,), counters = good.process([make_row(3, True)])
    assert counters["empty"] == 0 and row["mc_value"] == [1.0, 1.0, 1.0] and good.refusal(counters) is None


# --- the commands: manifest, one warning per run, refusal, stats ------------------------------------------

@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    """Two shards of scripted rollouts of real GSM8K test problems (2 problems x 2 samples each)."""
    d = tmp_path_factory.mktemp("cont")
    (d / "traj").mkdir()
    for i in range(2):
        run_cli("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", d / f"p{i}.parquet", "--skip", 2 * i, "--limit", 2)
        run_cli("rollout", d / f"p{i}.parquet", d / "traj" / f"shard-{i}.parquet", "--engine", "scripted",
                "--model", "scripted:echo", "--samples", 2, "--no-progress")
    return d


def test_cli_warns_once_per_run_and_stats_shows_the_share(rollouts, tmp_path):
    out = tmp_path / "labeled"
    r = run_cli("mc-label", rollouts / "traj", out, "--engine", "scripted", "--model", "scripted:echo", "-k", 3,
                "--no-progress")
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: mc-label: distinct share")]
    assert len(warnings) == 1 and "distinct share 0%" in warnings[0]  # two shards, one warning
    m = json.loads((out / "shard-0.manifest.json").read_text())
    assert m["counts"]["repeated_continuations"] == 2 * m["counts"]["compared_prefixes"]  # K=3: 2 copies each
    rows = pq.read_table(out / "shard-0.parquet").to_pylist()
    assert all(r["mc_distinct"][:-1] == [1] * (len(r["steps"]) - 1) for r in rows)
    s = run_cli("stats", out)
    assert "distinct share" in s.stdout and "0.00 (below 0.5: repeated samples)" in s.stdout
    assert "empty: no text" in s.stdout

    trees = tmp_path / "trees"
    r = run_cli("mcts-label", rollouts / "traj", trees, "--engine", "scripted", "--model", "scripted:echo", "-k", 3,
                "--search-limit", 2, "--no-progress")
    assert r.stderr.count("warning: mcts-label: distinct share 0%") == 1
    s = run_cli("stats", trees)
    assert "0.00 (below 0.5: repeated samples)" in s.stdout


def test_cli_refuses_a_run_of_empty_continuations(rollouts, tmp_path):
    for stage in ("mc-label", "mcts-label"):
        r = run_cli(stage, rollouts / "traj" / "shard-0.parquet", tmp_path / f"{stage}.parquet", "--engine",
                    "scripted", "--model", "scripted:empty", "-k", 2, "--no-progress", check=False)
        assert r.returncode == 1, r.stderr
        (line,) = [x for x in r.stderr.splitlines() if x.strip()]
        assert line.startswith(f"error: {stage}: ") and "stopped at once with no text" in line
        assert "chat template closes the assistant turn" in line
        assert not (tmp_path / f"{stage}.parquet").exists()


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \n \n", "\t", ".", "The answer is 4."])
def test_empty_is_what_rollout_calls_an_empty_completion(text):
    """One definition: a completion is empty exactly when rollout would split it into no step (its row
    error "empty completion")."""
    from stepkit.grading.steps import split_steps

    for split in ("newline", "blank", "auto", "step"):
        assert Completion(text, "stop").empty == (split_steps(text, split)[0] == [])


def test_cli_rollout_and_labellers_agree_on_empty(rollouts, tmp_path):
    r = run_cli("rollout", rollouts / "p0.parquet", tmp_path / "r.parquet", "--engine", "scripted", "--model",
                "scripted:empty", "--samples", 2, "--no-progress", "--max-error-rate", 1)
    rows = pq.read_table(tmp_path / "r.parquet").to_pylist()
    assert r.returncode == 0 and {x["error"] for x in rows} == {"rollout: empty completion"}


def test_filter_status_message_tells_a_typo_from_other_values(rollouts, tmp_path):
    out = tmp_path / "lab.parquet"
    run_cli("mc-label", rollouts / "traj" / "shard-0.parquet", out, "--engine", "scripted", "--model", "scripted:echo",
            "-k", 2, "--no-progress")
    cases = {"okk": "okk is not a value mc_status declares (ok, no_signal, ungraded): a typo would drop every row",
             "ungraded": "this is no typo (mc_status declares: \"ok; no_signal: no continuation succeeded (labels "
                         "say nothing); ungraded: no graded outcome\"): the rows hold other values",
             "ok": "every row is no_signal, which mc_status uses for a row with no labels, so the stage that wrote "
                   "mc_status could label no row"}
    for value, expected in cases.items():
        r = run_cli("filter", out, tmp_path / f"f-{value}.parquet", "--rule", f"status:mc_status={value}",
                    "--flag-only", check=False)
        (line,) = r.stderr.strip().splitlines()
        assert r.returncode == 1 and "(present: no_signal (4 rows))" in line and expected in line, line
