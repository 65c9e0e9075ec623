"""mcts-label killed (SIGKILL to its process group: a crash, nothing cleaned up) after its first committed chunk,
then run again: the committed problems are kept whole, not searched again, and the rows and the search tree
(its side output, ``--tree-out``) equal those of an uninterrupted run. The scripted engine, in a process of its
own, on the 3 problems of the suite's real GSM8K solutions; resume with the real engine's process shutdown is
tests/faults/test_engine_signal.py."""

from __future__ import annotations

import os
import signal

import pyarrow.parquet as pq

from tests.faults.common import committed, manifest, start, stepkit, wait_for_parts

# one problem per chunk and one chunk in flight, so the kill lands between commits (the default window holds
# all three problems at once; resume with chunks in flight: tests/faults/test_window_resume.py)
MCTS = ["--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--search-limit", "2", "--rollout-budget", "12",
        "--no-progress", "--chunk-size", "1", "--chunks-in-flight", "1"]


def test_mcts_label_killed_after_a_committed_chunk_resumes_to_an_uninterrupted_run(solutions, tmp_path, fault_table):
    whole = tmp_path / "whole"
    whole.mkdir()
    stepkit("mcts-label", solutions, whole / "m.parquet", *MCTS, "--tree-out", whole / "tree.parquet")

    out, tree = tmp_path / "m.parquet", tmp_path / "tree.parquet"
    proc = start("mcts-label", solutions, out, *MCTS, "--tree-out", tree, delay=0.2)
    try:
        wait_for_parts(out, 1, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    kept = committed(out)
    assert 1 <= len(kept) < 3 and not out.exists()
    first = pq.read_table(kept[0]).to_pylist()

    stepkit("mcts-label", solutions, out, *MCTS, "--tree-out", tree)
    rows = pq.read_table(out).to_pylist()
    assert rows[:len(first)] == first  # the committed problem was kept whole, not searched again
    assert rows == pq.read_table(whole / "m.parquet").to_pylist()
    nodes = pq.read_table(tree).to_pylist()
    assert nodes == pq.read_table(whole / "tree.parquet").to_pylist()
    m = manifest(out)
    assert m["run"]["resumed_chunks"] == len(kept) and m["side_outputs"]["tree"]["rows"] == len(nodes)
    assert len({n["problem_id"] for n in nodes}) == 3
    fault_table.add("SIGKILL to an mcts-label run (scripted engine, --tree-out) after its first commit",
                    "the rerun kept the committed problems whole; rows and tree equal an uninterrupted run", 0,
                    f"{len(kept)} chunk(s) resumed, {len(nodes)} tree nodes")
