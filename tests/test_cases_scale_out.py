"""Cases with stage scale_out: results that come back in another order than their requests are matched
by the id they carry, at every boundary where stepkit gets results back from elsewhere (a join helper,
the runner's one-to-one stages, vLLM's outputs, the Ray executor's tasks: tests/test_ray.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from stepkit.engines.vllm_engine import in_sent_order
from stepkit.errors import StepkitError
from stepkit.matching import match_by_id
from stepkit.runner import run_stage
from tests.conftest import DATA, run_cli
from tests.toy_stage import ToyConfig, ToyStage


def _counts(requests, results, correct):
    return {f"{q['question']} step {q['prefix_steps']}": int(correct[r]) for q, r in zip(requests, results)}


def test_rollout_results_out_of_order_are_joined_by_id(cases):
    """rollout-results-out-of-order: results returned as q2/step1, q1/step2, q1/step3 for requests sent as
    q1/step2, q1/step3, q2/step1 are joined by id, giving the expected counts; a positional join would
    give the counts the case warns of."""
    c = cases["rollout-results-out-of-order"]
    requests, returned = c["input"]["requests"], c["input"]["returned_order"]
    correct = c["input"]["rollout_correct_by_id"]
    joined = match_by_id([q["id"] for q in requests], returned, lambda rid: rid, "rollout result")
    assert _counts(requests, joined, correct) == c["expected"]["correct_counts"]
    assert _counts(requests, returned, correct) == c["expected"]["positional_join_would_give"]  # the fault


@pytest.mark.parametrize("returned,message", [
    (["q2/step1/r0", "q1/step2/r0", None], "a result carries no id"),
    (["q2/step1/r0", "q1/step2/r0", "q9/step1/r0"], "a result carries id 'q9/step1/r0', which no request has"),
    (["q2/step1/r0", "q1/step2/r0", "q1/step2/r0"], "two results carry id 'q1/step2/r0'"),
    (["q2/step1/r0", "q1/step2/r0"], "no result for id 'q1/step3/r0'"),
])
def test_a_missing_unknown_or_duplicated_id_is_an_error(cases, returned, message):
    """The case's checks: every returned row carries an id; a missing, unknown or duplicated one is an error."""
    ids = [q["id"] for q in cases["rollout-results-out-of-order"]["input"]["requests"]]
    with pytest.raises(StepkitError, match=f"^rollout result: {message}"):
        match_by_id(ids, returned, lambda rid: rid, "rollout result")
    with pytest.raises(StepkitError, match="request id 'a' is not unique"):
        match_by_id(["a", "a"], ["a", "a"], lambda rid: rid)


class Shuffled(ToyStage):
    """A one-to-one stage that hands its rows back in reverse order (as one gathering results as they
    finish would), or with one row's id changed."""

    def __init__(self, cfg, damage=None):
        super().__init__(cfg)
        self.damage = damage

    def process(self, rows):
        out, counters, side = super().process(rows)
        out = out[::-1]
        if self.damage:
            out[0] = {**out[0], "id": self.damage}
        return out, counters, side


def test_the_runner_matches_a_one_to_one_stages_rows_by_id(cases, tmp_path):
    sol = tmp_path / "sol.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sol, "--limit", "1")
    cfg = ToyConfig(steps_out=str(tmp_path / "s.parquet"))
    run_stage(ToyStage(cfg), sol, tmp_path / "ref.parquet", progress=False, chunk_size=4)
    cfg2 = ToyConfig(steps_out=str(tmp_path / "s2.parquet"))
    run_stage(Shuffled(cfg2), sol, tmp_path / "o.parquet", progress=False, chunk_size=4)
    assert pq.read_table(tmp_path / "o.parquet").to_pylist() == pq.read_table(tmp_path / "ref.parquet").to_pylist()
    cfg3 = ToyConfig(steps_out=str(tmp_path / "s3.parquet"))
    with pytest.raises(StepkitError, match=r"^toy-steps: internal error, chunk 0: output row: a result carries id "
                                           r"'elsewhere', which no request has$"):
        run_stage(Shuffled(cfg3, damage="elsewhere"), sol, tmp_path / "bad.parquet", progress=False, chunk_size=4)


def _out(rid, prompt):
    return SimpleNamespace(request_id=rid, prompt=prompt)


def test_vllm_outputs_are_matched_to_prompts_by_request_id():
    """vllm#394: outputs in finishing order go back to their prompts by request id (the ids of one call are
    consecutive, from wherever the engine's counter stood); one for another prompt is refused."""
    sent = ["p0", "p1", "p2"]
    finished = [_out("12", "p2"), _out("10", "p0"), _out("11", "p1")]
    assert [o.prompt for o in in_sent_order(finished, sent, lambda o: o.prompt)] == sent
    with pytest.raises(StepkitError, match="two results carry id 11"):
        in_sent_order([_out("11", "p1"), _out("10", "p0"), _out("11", "p1")], sent, lambda o: o.prompt)
    with pytest.raises(StepkitError, match="for prompt 1 of a call, the output of another prompt"):
        in_sent_order([_out("10", "p0"), _out("11", "p2"), _out("12", "p1")], sent, lambda o: o.prompt)
    with pytest.raises(StepkitError, match="no result for id 12"):
        in_sent_order([_out("10", "p0"), _out("11", "p1")], sent, lambda o: o.prompt)
    other_ids = [_out("a", "p0"), _out("b", "p1"), _out("c", "p2")]  # another id scheme: still checked per prompt
    assert in_sent_order(other_ids, sent, lambda o: o.prompt) == other_ids
    with pytest.raises(StepkitError, match="another prompt"):
        in_sent_order(other_ids[::-1], sent, lambda o: o.prompt)
