"""mcts-label against the real vLLM engine with the bundled model: 3 real GSM8K problems seeded with real
model solutions (one right, one wrong each, so the root's MC is strictly between 0 and 1 and the tree
is searched); the three outputs agree. (Killed and resumed: tests/faults/test_mcts_resume.py, scripted.)"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.grading.verify import checker_settings
from stepkit.prompts import DEFAULT_STOP
from stepkit.runner import run_stage
from stepkit.shards import read_rows
from stepkit.stages.ingest import IngestOptions, ingest
from stepkit.stages.mcts_label import MCTSConfig, MCTSLabelStage
from tests.conftest import DATA
from tests.test_mcts_label import expected_first_error

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def seeds(tmp_path_factory, checker):
    """Problems with one correct and one incorrect real solution (GSM8K example model solutions)."""
    tmp = tmp_path_factory.mktemp("seeds")
    allsol = tmp / "all.parquet"
    ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", allsol,
           IngestOptions(limit=40, generators=("175b_verification", "6b_finetuning")), checker, checker_settings())
    rows = read_rows(allsol)
    mixed = [p for p in dict.fromkeys(r["problem_id"] for r in rows)
             if {r["outcome_correct"] for r in rows if r["problem_id"] == p} == {True, False}][:3]
    assert len(mixed) == 3
    import pyarrow as pa

    t = pq.read_table(allsol)
    keep = [i for i, r in enumerate(rows) if r["problem_id"] in mixed]
    out = tmp / "seeds.parquet"
    pq.write_table(t.take(pa.array(keep)), out)
    return out


@pytest.fixture
def engine(vllm_engine):
    return vllm_engine  # the session's (tests/shared_engines.py)


class KeepOpen(MCTSLabelStage):
    def close(self):
        pass


def test_tree_pairs_and_paths_agree(engine, checker, seeds, tmp_path):
    cfg = MCTSConfig(continuations=4, search_limit=3, rollout_budget=40, pair_margin=0.25,
                     tree_out=str(tmp_path / "tree.parquet"), pairs_out=str(tmp_path / "pairs.parquet"))
    stage = KeepOpen(cfg, EngineSpec.of(engine), SamplingConfig(temperature=0.8, max_tokens=96, stop=DEFAULT_STOP),
                     lambda: checker)
    out = tmp_path / "m.parquet"
    (res,) = run_stage(stage, seeds, out, progress=False)
    rows = pq.read_table(out).to_pylist()
    nodes = {n["node_id"]: n for n in pq.read_table(tmp_path / "tree.parquet").to_pylist()}
    pairs = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    seed_ids = set(pq.read_table(seeds, columns=["id"]).column("id").to_pylist())
    assert seed_ids <= {r["id"] for r in rows}  # every seed row kept, with its id
    assert {r["mcts_status"] for r in rows if r["id"] in seed_ids} == {"ok"}  # each tree was searched
    for r in rows:
        assert r["error"] is None
        assert len({len(r[c]) for c in ("steps", "mcts_value", "mcts_rollouts", "mcts_node_id")}) == 1
        for s, nid in enumerate(r["mcts_node_id"]):
            if nid is not None:
                n = nodes[nid]
                assert n["depth"] == s + 1 and n["rollouts"] == r["mcts_rollouts"][s]
                assert 0 <= n["successes"] <= n["rollouts"] and n["truncated"] <= n["rollouts"]
        if r["mcts_status"] == "ok":
            assert r["mcts_first_error"] == expected_first_error(r)
    m = json.loads((tmp_path / "m.manifest.json").read_text())
    roots = [n for n in nodes.values() if n["parent_id"] is None]
    assert len(roots) == 3
    seeds_per_root = 2
    assert m["counts"]["continuations"] == sum(n["rollouts"] for n in nodes.values()) - seeds_per_root * 3
    assert m["counts"]["continuations"] <= 40 * 3  # the per-problem budget held
    for p in pairs:
        assert p["chosen_value"] == pytest.approx(nodes[p["chosen_node_id"]]["value_own"])
        assert p["rejected_value"] == pytest.approx(nodes[p["rejected_node_id"]]["value_own"])
        assert nodes[p["chosen_node_id"]]["parent_id"] == nodes[p["rejected_node_id"]]["parent_id"] == p["node_id"]
