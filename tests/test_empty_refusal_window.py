"""The empty refusal (more than half of the continuations empty, ``stepkit.per_row.empty_refusal``) with several
chunks in flight: each chunk's decision depends on this run's chunks up to it, in commit order, whatever the window
(``Stage.refusal``, called by the runner as a chunk commits). Before, the check read a count on the stage that
also held the later chunks in flight: a clean chunk 0 followed by empty chunks was refused uncommitted, and a
75%-empty chunk 0 committed (the run succeeded).
"""

from __future__ import annotations

import pytest

from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine, echo_policy
from stepkit.errors import StepkitError
from stepkit.shards import read_rows
from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage

CHUNK = 16


def policy_emptying(path, chunks: set[int], first_k: int):
    """Echo, except samples j < first_k of every prompt of a row in ``chunks`` (chunks of CHUNK rows) are
    empty (a problem shared with rows of other chunks is left alone)."""
    rows = read_rows(path)
    chosen = {r["prompt"] for i, r in enumerate(rows) if i // CHUNK in chunks}
    chosen -= {r["prompt"] for i, r in enumerate(rows) if i // CHUNK not in chunks}

    def policy(prompt, j, n):
        if j < first_k and any(p in prompt for p in chosen):
            return ""
        return echo_policy(prompt, j, n)

    return policy


def run(path, out, policy, window):
    """One run, with a fresh answer checker (gold answers not yet validated, as in a CLI run)."""
    from stepkit.grading.verify import AnswerChecker

    with AnswerChecker() as checker:
        return _run(path, out, policy, checker, window)


def _run(path, out, policy, checker, window):
    from stepkit.runner import run_stage

    stage = MCLabelStage(MCLabelConfig(continuations=4), EngineSpec.of(ScriptedEngine(policy, "scripted:x")),
                         SamplingConfig(temperature=0.8, max_tokens=64), lambda: checker)
    kw = {} if window is None else {"chunks_in_flight": window}
    return run_stage(stage, path, out, chunk_size=CHUNK, progress=False, max_error_rate=1.0, **kw)


@pytest.mark.parametrize("window", [1, None], ids=["one-chunk", "default-window"])
def test_a_clean_first_chunk_is_committed_before_the_refusal(solutions_160, tmp_path, window):
    out = tmp_path / "out.parquet"
    with pytest.raises(StepkitError, match="stopped at once with no text"):
        run(solutions_160, out, policy_emptying(solutions_160, set(range(1, 10)), 4), window)
    assert (tmp_path / "out.parquet.parts" / "part-00000.parquet").exists()  # chunk 0 had no empty continuation


@pytest.mark.parametrize("window", [1, None], ids=["one-chunk", "default-window"])
def test_a_mostly_empty_first_chunk_is_refused(solutions_160, tmp_path, window):
    with pytest.raises(StepkitError, match=r"180 of 240 continuations \(75%\) stopped at once with no text"):
        run(solutions_160, tmp_path / "out.parquet", policy_emptying(solutions_160, {0}, 3), window)
    assert not (tmp_path / "out.parquet").exists()
