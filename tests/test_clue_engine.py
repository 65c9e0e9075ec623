"""stepkit clue against the real vLLM engine (CPU) with the bundled model, on real GSM8K problems.

SmolLM2-135M is a weak clue recoverer and verifier, so these tests check the contract, not skill: every
problem ends with a clue list or a recorded parse failure, every LLM-checked clue with a verdict or a
recorded failure, never anything in between. The module runs one engine per command (two commands).
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from stepkit.shards import read_manifest
from tests.conftest import DATA
from tests.conftest import run_cli as run

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("clue")
    probs, traj = d / "probs.parquet", d / "traj.parquet"
    run("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", probs, "--limit", 3)
    run("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", traj, "--limit", 3,
        "--generator", "175b_verification")
    return d, probs, traj


def test_clue_recover_and_llm_score_real_engine(shards):
    d, probs, traj = shards
    clues = d / "clues.parquet"
    run("clue", "recover", probs, clues, "--model", "smollm2-135m", "--retries", 1, "--max-tokens", 384,
        "--no-progress")
    rows = pq.read_table(clues).to_pylist()
    assert len(rows) == 3
    for r in rows:
        assert r["error"] is None and r["clue_status"] in ("ok", "parse_failure")
        assert 1 <= len(r["clue_replies"]) <= 2
        if r["clue_status"] == "ok":
            assert r["clue_texts"] and len(r["clue_values"]) == len(r["clue_texts"]) == len(r["clue_depends"])
            assert all(d < k for k, deps in enumerate(r["clue_depends"]) for d in deps)
        else:
            assert r["clue_texts"] is None and r["clue_parse_failures"] == len(r["clue_replies"]) and r["clue_parse_error"]
    m = read_manifest(clues)
    assert m["provenance"]["engine"]["engine"] == "vllm" and m["config"]["prompt_template"]["hash"]

    # Score with the LLM verdicts; reference clues so every problem has clues to check.
    ref = d / "refclues.parquet"
    run("clue", "recover", traj, ref, "--from-reference", "--no-progress")
    out = d / "scored.parquet"
    run("clue", "score", traj, out, "--clues", ref, "--match", "llm", "--model", "smollm2-135m", "--retries", 1,
        "--max-tokens", 256, "--no-progress")
    scored = pq.read_table(out).to_pylist()
    refs = {r["problem_id"]: r for r in pq.read_table(ref).to_pylist()}
    assert len(scored) == 3
    for r in scored:
        assert r["error"] is None and r["clue_status"] == "ok"
        n_clues = len(refs[r["problem_id"]]["clue_texts"])
        assert len(r["clue_verdicts"]) == n_clues
        failed = sum(v is None for v in r["clue_verdicts"])
        # a verdict or a recorded failure per clue: each failed clue used 1 + retries replies
        assert r["clue_verdict_failures"] >= failed * 2
        assert all(v is None or -1 <= v < len(r["steps"]) for v in r["clue_verdicts"])
        assert len(r["clue_score"]) == len(r["steps"]) == len(r["clue_label"])
