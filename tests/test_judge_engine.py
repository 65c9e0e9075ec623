"""judge against the real vLLM engine (CPU) with the bundled model, on real ProcessBench rows.

SmolLM2-135M is a weak critic, so these tests check the contract, not skill: every row ends with either a
verdict per step or a recorded parse failure, never anything in between.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from stepkit.grading.verdicts import first_error_of
from stepkit.shards import read_manifest
from tests.conftest import DATA
from tests.conftest import run_cli as run

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    out = tmp_path_factory.mktemp("pbj") / "pb.parquet"
    run("ingest", "processbench", DATA / "processbench" / "gsm8k.json", out, "--limit", 5)
    return out


def check(rows, votes, retries):
    assert len(rows) == 5
    for r in rows:
        m = len(r["steps"])
        assert r["error"] is None
        assert r["judge_status"] in ("ok", "parse_failure")
        assert len(r["judge_replies"]) == r["judge_valid_votes"] + r["judge_parse_failures"]
        assert votes <= len(r["judge_replies"]) <= votes * (1 + retries)
        if r["judge_status"] == "ok":
            assert 1 <= r["judge_valid_votes"] <= votes
            assert len(r["judge_label"]) == m == len(r["judge_correct_votes"])
            assert -1 <= r["judge_first_error"] < m and first_error_of(r["judge_label"]) == r["judge_first_error"]
            assert len(r["judge_votes"]) == r["judge_valid_votes"]
        else:
            assert r["judge_label"] is None and r["judge_first_error"] is None and r["judge_valid_votes"] == 0
            assert r["judge_parse_failures"] == len(r["judge_replies"]) > 0 and r["judge_parse_error"]


def test_judge_first_error_real_engine(pb, tmp_path):
    out = tmp_path / "judged.parquet"
    p = run("judge", pb, out, "--model", "smollm2-135m", "--votes", 2, "--retries", 1, "--max-tokens", 384,
            "--no-progress")
    rows = pq.read_table(out).to_pylist()
    check(rows, votes=2, retries=1)
    m = read_manifest(out)
    assert m["provenance"]["engine"]["engine"] == "vllm" and m["config"]["mode"] == "first-error"
    assert m["counts"]["replies"] == sum(len(r["judge_replies"]) for r in rows)
    assert "parse failure rows" in p.stderr  # the summary table reports parse failures
    ev = run("eval", "processbench", out, "--pred", "judge_first_error")
    assert "gsm8k" in ev.stdout


def test_judge_per_step_real_engine(pb, tmp_path):
    out = tmp_path / "judged.parquet"
    run("judge", pb, out, "--model", "smollm2-135m", "--mode", "per-step", "--votes", 1, "--retries", 1,
        "--max-tokens", 256, "--no-progress")
    check(pq.read_table(out).to_pylist(), votes=1, retries=1)
