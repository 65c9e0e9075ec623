"""Agent turns against the real vLLM engine (CPU) with the bundled model: ``judge --template
judge-agent-step`` on the three shortest τ-bench conversations. SmolLM2-135M is a weak judge, so this
checks the contract: every row ends with a score per turn or a recorded parse failure."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA, run_cli

pytestmark = pytest.mark.engine

SHORTEST = ("12-3", "44-3", "38-2")  # fewest prompt + turn + observation tokens (1,558-1,646)


def test_judge_agent_step_real_engine(tmp_path):
    convs = [c for c in json.loads((DATA / "tau-bench" / "gpt-4o-airline.json").read_text())
             if f"{c['task_id']}-{c['trial']}" in SHORTEST]
    src = tmp_path / "three.json"
    src.write_text(json.dumps(convs))
    run_cli("ingest", "messages", src, tmp_path / "three.parquet")
    out = tmp_path / "judged.parquet"
    p = run_cli("judge", tmp_path / "three.parquet", out, "--model", "smollm2-135m", "--template", "judge-agent-step",
                "--max-model-len", 4096, "--max-tokens", 256, "--temperature", 0, "--no-progress")
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
