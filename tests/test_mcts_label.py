"""mcts-label (OmegaPRM) with exact policies: the search, its bookkeeping, the three outputs, resume."""

from __future__ import annotations

import asyncio
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine
from stepkit.errors import ConfigError
from stepkit.runner import run_stage
from stepkit.schema import TRAJECTORY_SCHEMA
from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage
from stepkit.stages.mcts_tree import Tree
from tests.conftest import load_cases
from tests.window_cases import OrderFree

C = [f"c{i}" for i in range(1, 7)]  # the correct solution's steps


def world(prefix, k, wrong_at=2):
    """K rollouts of a state: from an all-correct prefix, even samples finish correctly and odd ones go
    wrong ``wrong_at`` steps later; from a prefix with a wrong step, every rollout is wrong."""
    if any(s.startswith("w") for s in prefix):
        return [(("w-more", "ans 0"), "", False, 10)] * k
    n = len(prefix)
    good = tuple(C[n:]) + ("ans 42",)
    bad = tuple(C[n:n + wrong_at]) + tuple(f"w{i}" for i in range(n + wrong_at, 5)) + ("ans 0",)
    return [(good, "", True, 10) if j % 2 == 0 else (bad, "", False, 20) for j in range(k)]


def expected_first_error(row):
    """The first zero-valued step when the tree pins it (the step before it is a node of value > 0, or it
    is step 0 of a searched tree), -1 for a correct path with no zero, else None."""
    vals, nodes = row["mcts_value"], row["mcts_node_id"]
    z = next((s for s, v in enumerate(vals) if v == 0), None)
    if z is None:
        return -1 if row["outcome_correct"] else None
    # (a node whose rollouts were all truncated has no value: it pins nothing)
    return z if z == 0 or (nodes[z - 1] is not None and vals[z - 1] is not None and vals[z - 1] > 0) else None


def run_tree(cfg, sample=world, seeds=()):
    calls = []

    async def counted(prefix, k):
        calls.append((prefix, k))
        return sample(prefix, k)

    tree = Tree(cfg, counted)
    status = asyncio.run(tree.search(list(seeds)))
    return tree, status, calls


def test_search_finds_the_known_first_error():
    tree, status, _ = run_tree(MCTSConfig(continuations=4, search_limit=1))
    assert status == "ok" and tree.selections == 1
    # the selected rollout from the root is c1 c2 w2 w3 w4 ans: the first prefix of value 0 is c1 c2 w2
    assert tree.nodes[("c1", "c2")].mc == 0.5
    assert tree.nodes[("c1", "c2", "w2")].mc == 0.0
    assert ("c1", "c2", "w2", "w3") not in tree.nodes  # binary search: probes 3, then 2, then done


def test_each_new_state_costs_exactly_k_and_no_pair_is_selected_twice(cases):
    case = cases["omegaprm-double-mc-estimation"]
    k = case["input"]["k"]
    cfg = MCTSConfig(continuations=k, search_limit=50)
    tree, _, calls = run_tree(cfg)
    prefixes = [p for p, _ in calls]
    assert len(prefixes) == len(set(prefixes)) == len(tree.nodes)  # one estimate per state
    assert all(n == case["expected"]["rollouts_for_new_state"] for _, n in calls)
    assert tree.continuations == k * len(tree.nodes)
    assert all(len(n.rollouts) == k for n in tree.nodes.values())
    assert sum(n.visits for n in tree.nodes.values()) == tree.selections


def test_selection_uses_current_visits_and_removes_the_pair():
    cfg = MCTSConfig(continuations=4, search_limit=0)
    tree, _, _ = run_tree(cfg)
    root = tree.root
    pool = list(tree.pool)
    assert len(pool) == 2 and all(s is root for s, _ in pool)  # the root's two incorrect rollouts
    r = pool[0][1]
    q = 0.5 ** (1 - 0.5) * 0.9 ** (20 / 500)
    assert tree.score(root, r, total_visits=0) == pytest.approx(q)
    assert tree.score(root, r, total_visits=4) == pytest.approx(q + 0.125 * math.sqrt(4) / (1 + 0))
    picked = tree.select()
    assert picked == pool[0] and picked not in tree.pool and root.visits == 1
    root.visits = 3
    assert tree.score(root, r, total_visits=9) == pytest.approx(q + 0.125 * 3 / 4)


def test_budget_is_never_exceeded_even_inside_a_binary_search():
    for budget in range(4, 40):
        tree, status, _ = run_tree(MCTSConfig(continuations=4, search_limit=100, rollout_budget=budget))
        assert tree.continuations <= budget and status == "ok"
    tree, _, _ = run_tree(MCTSConfig(continuations=4, search_limit=100, rollout_budget=10))
    assert tree.budget_stop and tree.continuations == 8  # root + one probe; the next probe would need 12
    with pytest.raises(ConfigError, match="rollout-budget"):
        MCTSConfig(continuations=8, rollout_budget=7)


def test_root_of_all_correct_or_all_wrong_is_not_searched_and_the_filter():
    _, status, calls = run_tree(MCTSConfig(continuations=4), sample=lambda p, k: [(("ans 42",), "", True, 5)] * k)
    assert status == "all_correct" and len(calls) == 1
    _, status, calls = run_tree(MCTSConfig(continuations=4), sample=lambda p, k: [(("ans 1",), "", False, 5)] * k)
    assert status == "all_wrong"
    _, status, _ = run_tree(MCTSConfig(continuations=4), sample=lambda p, k: [(("x",), "", None, 5)] * k)
    assert status == "no_signal"
    tree, status, calls = run_tree(MCTSConfig(continuations=4, filter_rollouts=2),
                                   sample=lambda p, k: [(("ans 42",), "", True, 5)] * k)
    assert status == "all_correct" and calls == [((), 2)] and tree.continuations == 2


def test_subtree_values_are_hand_computed_means():
    tree, _, _ = run_tree(MCTSConfig(continuations=4, search_limit=1, value="subtree"))
    # The root's 4 rollouts all start c1 c2 (2 right, 2 wrong: c1 c2 w2 ...); the search probed
    # (c1 c2 w2) (4 wrong) and then (c1 c2) (2 right, 2 wrong).
    assert tree.subtree_value(tree.nodes[("c1", "c2")]) == pytest.approx(4 / 12)  # everything passes through it
    assert tree.subtree_value(tree.nodes[("c1", "c2", "w2")]) == pytest.approx(0 / 6)  # its 4 + the root's 2 wrong
    assert tree.subtree_value(tree.root) == pytest.approx(4 / 12)
    assert tree.value(tree.nodes[("c1", "c2")]) == pytest.approx(4 / 12)  # --value subtree
    assert Tree(MCTSConfig(), None).value(tree.nodes[("c1", "c2")]) == pytest.approx(0.5)  # --value own


# --- the stage, through the runner, with the scripted engine --------------------------------------------

def policy(prompt, j, n):
    """``world`` as text: the steps after the assistant marker are the prefix."""
    prefix = [s for s in prompt.split("<|assistant|>\n", 1)[1].split("\n") if s]
    steps = world(tuple(prefix), j + 1)[j][0]
    return "\n".join(steps).replace("ans ", "The answer is ") + "."


def problems(tmp_path, n=3):
    rows = [{"problem_id": f"p{i}", "source": "test", "prompt": f"Problem {i}: what is 6*7?",
             "reference_answer": "42", "reference_steps": None} for i in range(n)]
    from stepkit.schema import PROBLEM_SCHEMA

    path = tmp_path / "problems.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=PROBLEM_SCHEMA), path)
    return path


def stage(tmp_path, checker, **kw):
    cfg = MCTSConfig(**{"continuations": 4, "search_limit": 3, "tree_out": str(tmp_path / "tree.parquet"),
                        "pairs_out": str(tmp_path / "pairs.parquet"), "pair_margin": 0.4, **kw})
    return MCTSLabelStage(cfg, EngineSpec.of(ScriptedEngine(policy, "scripted:world")),
                          SamplingConfig(max_tokens=64), lambda: checker)


def test_outputs_are_consistent_with_each_other(tmp_path, checker):
    out = tmp_path / "m.parquet"
    (res,) = run_stage(stage(tmp_path, checker), problems(tmp_path), out, progress=False)
    rows = pq.read_table(out).to_pylist()
    nodes = {n["node_id"]: n for n in pq.read_table(tmp_path / "tree.parquet").to_pylist()}
    pairs = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    assert {r["problem_id"] for r in rows} == {"p0", "p1", "p2"} and all(r["mcts_status"] == "ok" for r in rows)
    searched = 0
    for r in rows:
        assert len({len(r[c]) for c in ("steps", "mcts_value", "mcts_node_id", "mcts_label")}) == 1
        for s, nid in enumerate(r["mcts_node_id"]):
            if nid is not None:  # every path's node ids exist in the tree, with the same counts and value
                n = nodes[nid]
                assert n["depth"] == s + 1 and n["rollouts"] == r["mcts_rollouts"][s]
                if s < len(r["steps"]) - 1:
                    assert r["mcts_value"][s] == pytest.approx(n["value_own"])
        assert r["mcts_first_error"] == expected_first_error(r)
        zero = [s for s, v in enumerate(r["mcts_value"][:-1]) if v == 0]
        if zero:  # a searched path: its first zero-valued node is exactly its first wrong step
            searched += 1
            assert r["steps"][zero[0]].startswith("w") and not any(t.startswith("w") for t in r["steps"][:zero[0]])
    assert searched >= 3
    m = json.loads((tmp_path / "m.manifest.json").read_text())
    assert m["counts"]["continuations"] == sum(n["rollouts"] for n in nodes.values())  # counts add up
    assert m["counts"]["nodes"] == len(nodes) and m["side_outputs"]["tree"]["rows"] == len(nodes)
    for n in nodes.values():
        assert n["parent_id"] is None or nodes[n["parent_id"]]["depth"] < n["depth"]
    assert pairs, "siblings of differing value make pairs"
    for p in pairs:
        assert p["chosen_value"] == pytest.approx(nodes[p["chosen_node_id"]]["value_own"])
        assert p["rejected_value"] == pytest.approx(nodes[p["rejected_node_id"]]["value_own"])
        assert p["chosen_value"] - p["rejected_value"] >= 0.4


def test_seed_rows_keep_their_id_and_columns(tmp_path, checker):
    seed = {"id": "pb-7", "problem_id": "p0", "source": "processbench/gsm8k/7", "prompt": "What is 6*7?",
            "reference_answer": "42", "steps": ["c1", "w1", "The answer is 0."], "step_separator": "\n",
            "final_answer": "0", "outcome_correct": False, "generator": "human", "error": None}
    schema = TRAJECTORY_SCHEMA.append(pa.field("reference_first_error", pa.int32()))
    src = tmp_path / "seeds.parquet"
    pq.write_table(pa.Table.from_pylist([{**seed, "reference_first_error": 1}], schema=schema), src)
    out = tmp_path / "m.parquet"
    run_stage(stage(tmp_path, checker, search_limit=10), src, out, progress=False)
    rows = pq.read_table(out).to_pylist()
    first = rows[0]
    assert first["id"] == "pb-7" and first["reference_first_error"] == 1 and first["source"] == seed["source"]
    # the seed joins the root's rollouts (MC 2/5) and, being incorrect, the pool; its search probes (c1 w1)
    # (value 0) and (c1) (value 0.5): the first error is step 1, as the reference says
    assert first["mcts_value"] == [0.5, 0.0, 0.0] and first["mcts_first_error"] == 1
    assert first["mcts_status"] == "ok" and first["mcts_label"] == [True, False, False]
    assert all(r["id"].startswith("p0:m") for r in rows[1:])


def test_bad_gold_and_engine_errors_keep_an_error_row(tmp_path, checker):
    src = problems(tmp_path, 2)
    t = pq.read_table(src)
    t = t.set_column(t.schema.get_field_index("reference_answer"), "reference_answer", pa.array([None, "42"]))
    pq.write_table(t, src)
    out = tmp_path / "m.parquet"
    run_stage(stage(tmp_path, checker), src, out, progress=False, max_error_rate=1.0)
    rows = pq.read_table(out).to_pylist()
    assert rows[0]["error"].startswith("mcts-label: no reference_answer") and rows[0]["steps"] == []
    assert all(r["error"] is None for r in rows[1:])


def test_a_problems_rows_are_never_split_across_chunks(tmp_path, checker):
    rows = [{"id": f"p{i // 3}-{i}", "problem_id": f"p{i // 3}", "source": None, "prompt": "What is 6*7?",
             "reference_answer": "42", "steps": ["c1", "The answer is 42."], "step_separator": "\n",
             "final_answer": "42", "outcome_correct": True, "generator": "g", "error": None} for i in range(9)]
    src = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), src)
    (res,) = run_stage(stage(tmp_path, checker), src, tmp_path / "m.parquet", chunk_size=2, progress=False)
    assert res.chunks == 3  # 3 problems of 3 rows: a chunk of 2 rows grows to the problem's end
    shuffled = tmp_path / "s.parquet"
    pq.write_table(pa.Table.from_pylist(rows[:2] + rows[3:5] + rows[2:3] + rows[5:], schema=TRAJECTORY_SCHEMA),
                   shuffled)
    from stepkit.errors import InputError

    with pytest.raises(InputError, match="row 4, column 'problem_id': rows of problem_id 'p0' are not contiguous"):
        run_stage(stage(tmp_path, checker), shuffled, tmp_path / "m2.parquet", progress=False)


def test_every_mcts_case_is_a_test():
    assert {c["id"] for c in load_cases().values() if c["stage"] == "mcts"} == {"omegaprm-double-mc-estimation"}


def test_cli_on_processbench_rows_then_eval_stats_and_show(tmp_path):
    from tests.conftest import DATA, run_cli

    pb = tmp_path / "pb.parquet"
    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", pb, "--sample", "4")
    out = tmp_path / "m.parquet"
    run_cli("mcts-label", pb, out, "--engine", "scripted", "--model", "scripted:echo", "-k", "4", "--no-progress",
            "--tree-out", tmp_path / "t.parquet")
    ev = run_cli("eval", "processbench", out, "--pred", "mcts_first_error")
    assert "F1" in ev.stdout
    assert "tree search (mcts-label)" in run_cli("stats", out).stdout
    assert "tree search: status" in run_cli("show", out).stdout
    p = run_cli("mcts-label", pb, tmp_path / "m2.parquet", "--engine", "scripted", "--model", "scripted:echo",
                "--rollout-budget", "3", check=False)
    assert p.returncode == 1 and "--rollout-budget 3 leaves no room" in p.stderr


OutOfOrder = OrderFree  # answers submitted requests out of order (tests/window_cases.py)


def test_async_searches_give_the_same_rows_whatever_order_answers_come_in(tmp_path, checker):
    from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage

    src = problems(tmp_path)
    outs = []
    for i, cls in enumerate((ScriptedEngine, OutOfOrder)):
        st = MCTSLabelStage(MCTSConfig(continuations=4, search_limit=3), EngineSpec.of(cls(policy, "scripted:world")),
                            SamplingConfig(max_tokens=64), lambda: checker)
        run_stage(st, src, tmp_path / f"m{i}.parquet", progress=False)
        outs.append(pq.read_table(tmp_path / f"m{i}.parquet").to_pylist())
    assert outs[0] == outs[1]
    seeds = tmp_path / "seeds.parquet"
    pq.write_table(pq.read_table(tmp_path / "m0.parquet").select(TRAJECTORY_SCHEMA.names), seeds)
    labels = []
    for i, cls in enumerate((ScriptedEngine, OutOfOrder)):
        st = MCLabelStage(MCLabelConfig(continuations=4, mode="binary"), EngineSpec.of(cls(policy, "scripted:world")),
                          SamplingConfig(max_tokens=64), lambda: checker)
        run_stage(st, seeds, tmp_path / f"b{i}.parquet", progress=False)
        labels.append(pq.read_table(tmp_path / f"b{i}.parquet").to_pylist())
    assert labels[0] == labels[1] and any(r["mc_first_error"] not in (None, -1) for r in labels[0])


# --- found by a breaking session -------------------------------------------------------------------------

def one_seed(tmp_path, steps=("c1", "w1", "The answer is 0."), correct=False, **extra):
    seed = {"id": "s-1", "problem_id": "p0", "source": None, "prompt": "What is 6*7?", "reference_answer": "42",
            "steps": list(steps), "step_separator": "\n", "final_answer": None, "outcome_correct": correct,
            "generator": "human", "error": None, **extra}
    src = tmp_path / "seed.parquet"
    pq.write_table(pa.Table.from_pylist([seed], schema=TRAJECTORY_SCHEMA), src)
    return src


def test_an_unsearched_incorrect_path_has_no_first_error(tmp_path, checker):
    """With no selection (search limit 0) or no budget for a probe, the last step's 0 is the outcome, not
    a located first error."""
    for kw in ({"search_limit": 0}, {"rollout_budget": 4}):
        out = tmp_path / f"m{len(kw)}{list(kw)[0]}.parquet"
        run_stage(stage(tmp_path, checker, tree_out=None, pairs_out=None, **kw), one_seed(tmp_path), out,
                  progress=False)
        rows = pq.read_table(out).to_pylist()
        assert rows[0]["mcts_status"] == "ok" and rows[0]["mcts_first_error"] is None, kw
        assert all(r["mcts_first_error"] is None for r in rows if not r["outcome_correct"]), kw
        m = json.loads(out.with_name(out.stem + ".manifest.json").read_text())
        assert m["counts"]["selections"] == 0 and m["counts"]["problems_ok"] == 1


def test_the_filter_sees_the_seeds_and_counts_problems_by_status(tmp_path, checker):
    class AllRight(ScriptedEngine):
        pass

    right = AllRight(lambda p, j, n: "c1\nThe answer is 42.", "scripted:right")
    cfg = MCTSConfig(continuations=4, filter_rollouts=2)
    out = tmp_path / "m.parquet"
    run_stage(MCTSLabelStage(cfg, EngineSpec.of(right), SamplingConfig(max_tokens=64), lambda: checker),
              one_seed(tmp_path), out, progress=False)
    (row,) = [r for r in pq.read_table(out).to_pylist() if r["id"] == "s-1"]
    # a wrong seed: the filter let the problem in (never "all_correct"); continuing (c1 w1) is always right
    # here, so the search pins the error on the last step
    assert row["mcts_status"] == "ok" and row["mcts_first_error"] == 2
    src = problems(tmp_path, 2)
    run_stage(MCTSLabelStage(cfg, EngineSpec.of(right), SamplingConfig(max_tokens=64), lambda: checker), src,
              tmp_path / "p.parquet", progress=False)
    m = json.loads((tmp_path / "p.manifest.json").read_text())
    assert m["counts"]["problems_all_correct"] == 2 and m["counts"]["filter_continuations"] == 4


def test_seed_shards_need_ids_and_outcomes_and_one_gold_per_problem(tmp_path, checker):
    from stepkit.errors import InputError

    src = one_seed(tmp_path)
    t = pq.read_table(src)
    pq.write_table(t.drop(["outcome_correct"]), tmp_path / "no-outcome.parquet")
    with pytest.raises(InputError, match="column 'outcome_correct': missing column"):
        run_stage(stage(tmp_path, checker), tmp_path / "no-outcome.parquet", tmp_path / "o.parquet", progress=False)
    rows = t.to_pylist()
    rows.append({**rows[0], "id": "s-2", "reference_answer": "41"})
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), tmp_path / "two.parquet")
    with pytest.raises(InputError, match="row 1, column 'reference_answer': problem 'p0' has two reference answers"):
        run_stage(stage(tmp_path, checker), tmp_path / "two.parquet", tmp_path / "o.parquet", progress=False)
    dup = problems(tmp_path, 2)
    pt = pq.read_table(dup)
    pq.write_table(pa.Table.from_pylist([{**r, "problem_id": "p0"} for r in pt.to_pylist()], schema=pt.schema), dup)
    with pytest.raises(InputError, match="column 'problem_id': duplicate value 'p0'"):
        run_stage(stage(tmp_path, checker), dup, tmp_path / "o.parquet", progress=False)


def test_own_output_as_input_gets_new_ids_that_do_not_collide(tmp_path, checker):
    first = tmp_path / "m.parquet"
    run_stage(stage(tmp_path, checker, tree_out=None, pairs_out=None), problems(tmp_path, 1), first, progress=False)
    again = tmp_path / "again.parquet"
    pq.write_table(pq.read_table(first).select(TRAJECTORY_SCHEMA.names), again)
    run_stage(stage(tmp_path, checker, tree_out=None, pairs_out=None), again, tmp_path / "m2.parquet", progress=False)
    ids = pq.read_table(tmp_path / "m2.parquet", columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids))


def test_side_output_paths_that_would_clash_with_outs_own_files(tmp_path):
    from tests.conftest import run_cli

    src = problems(tmp_path, 1)
    for bad in ("m.manifest.json", "m.parquet.parts/t.parquet"):
        p = run_cli("mcts-label", src, tmp_path / "m.parquet", "--engine", "scripted", "--model", "scripted:echo",
                    "--tree-out", tmp_path / bad, check=False)
        assert p.returncode == 1 and "Traceback" not in p.stderr and "OUT's own files" in p.stderr, p.stderr
        assert not (tmp_path / "m.parquet.parts").exists() and not (tmp_path / "m.manifest.json").is_dir()
    p = run_cli("mcts-label", src, tmp_path / "m.parquet", "--engine", "scripted", "--model", "scripted:echo",
                "--tree-out", "", check=False)
    assert p.returncode == 1 and "--tree-out needs a path" in p.stderr


class Recording(Tree):
    """A tree that records every selection and every state it samples, answering out of order."""

    def __init__(self, cfg):
        super().__init__(cfg, self.slow)
        self.calls, self.picked = [], []

    async def slow(self, prefix, k):
        self.calls.append(prefix)
        await asyncio.sleep(0.001 * (len(prefix) % 3))
        return world(prefix, k)

    def select(self):
        p = super().select()
        if p is not None:
            self.picked.append(p)
        return p


def test_parallel_selections_keep_every_rule():
    """Several selections of one problem side by side, answers arriving out of order: still one estimate
    per state, no pair selected twice, visits counted, the budget and the limit never exceeded."""
    for budget in (None, 12, 20, 33, 60):
        for b in (2, 3, 5):
            cfg = MCTSConfig(continuations=4, search_limit=12, rollout_budget=budget, parallel_selections=b)
            tree = Recording(cfg)
            assert asyncio.run(tree.search([])) == "ok"
            assert len(tree.calls) == len(set(tree.calls)) == len(tree.nodes)
            assert all(len(n.rollouts) == 4 for n in tree.nodes.values())
            assert tree.continuations == 4 * len(tree.nodes) and (budget is None or tree.continuations <= budget)
            assert len({id(r) for _, r in tree.picked}) == len(tree.picked) == tree.selections <= 12
            assert sum(n.visits for n in tree.nodes.values()) == tree.selections
