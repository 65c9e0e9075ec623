"""Agent turns against the real vLLM engine (CPU) with the bundled model, on the shortest τ-bench
conversation with a gold call (one row: the contract, not skill, and a CPU engine scores ~1,600 tokens per turn): ``judge --template judge-agent-step`` (SmolLM2-135M is a weak judge, so this checks the
contract: every row ends with a score per turn or a recorded parse failure) and ``likelihood-label --target
gold-action`` (the log-probability of the final gold call after each turn)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA, run_cli

pytestmark = pytest.mark.engine

SHORTEST = ("44-3",)  # fewest prompt + turn + observation tokens (1,558-1,646) among those with a gold call


@pytest.fixture(scope="module")
def shortest(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("agent-engine")
    convs = [c for c in json.loads((DATA / "tau-bench" / "gpt-4o-airline.json").read_text())
             if f"{c['task_id']}-{c['trial']}" in SHORTEST]
    src = tmp_path / "shortest.json"
    src.write_text(json.dumps(convs))
    run_cli("ingest", "messages", src, tmp_path / "shortest.parquet")
    return tmp_path / "shortest.parquet"


@pytest.mark.other_engine  # a 4,096-token context: after the tests that share the default engine
def test_judge_agent_step_real_engine(shortest, tmp_path):
    """The engine's options are those of test_likelihood_engine's uncached run (one load for both)."""
    out = tmp_path / "judged.parquet"
    p = run_cli("judge", shortest, out, "--model", "smollm2-135m", "--template", "judge-agent-step",
                "--max-model-len", 4096, "--no-prefix-caching", "--max-tokens", 256, "--temperature", 0,
                "--no-progress")
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(SHORTEST)
    for r in rows:
        assert r["error"] is None and r["judge_status"] in ("ok", "parse_failure")
        assert len(r["judge_replies"]) == r["judge_valid_votes"] + r["judge_parse_failures"] >= 1
        if r["judge_status"] == "ok":
            assert len(r["judge_score"]) == len(r["steps"]) == len(r["judge_label"])
            assert all(0 <= s <= 10 for s in r["judge_score"])
            assert r["judge_label"] == [s > 5 for s in r["judge_score"]]
        else:
            assert r["judge_score"] is None and r["judge_label"] is None and r["judge_parse_error"]
    assert "parse failure rows" in p.stderr


def test_likelihood_gold_action_real_engine(shortest, tmp_path):
    out = tmp_path / "lh.parquet"
    run_cli("likelihood-label", shortest, out, "--model", "smollm2-135m", "--target", "gold-action", "--no-progress")
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 1  # (a task with no gold call: tests/test_agent_labels.py, scripted)
    for r in rows:
        assert r["error"] is None and r["reference_actions"]
        assert r["lh_status"] == "ok"
        n = len(r["steps"])
        assert len(r["lh_value"]) == len(r["lh_gain"]) == len(r["lh_label"]) == n
        assert all(v < 0 for v in [r["lh_value_start"], *r["lh_value"]])  # log-probabilities of the gold call
        assert sum(r["lh_gain"]) == pytest.approx(r["lh_value"][-1] - r["lh_value_start"], abs=1e-2)
        assert r["lh_answer_tokens"] > 10 and -1 <= r["lh_first_error"] < n
