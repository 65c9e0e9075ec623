"""Chunks in flight and resume (issue 26, item 1): a stage on the asynchronous path (mc-label --mode binary)
with three chunks in flight, stopped mid-run by SIGTERM, Ctrl-C or a kill (SIGKILL to its process group),
has committed only whole chunks, in order; the rerun resumes them, redoes at most the three that were in
flight, and gives the rows of an uninterrupted run with one chunk at a time."""

from __future__ import annotations

import os
import signal

import pyarrow.parquet as pq
import pytest

from tests.faults.common import MC_LABEL, committed, log_events, manifest, rows_lost, start, stepkit, wait_for_parts

BINARY = [*MC_LABEL, "--mode", "binary"]
WINDOW = 3


@pytest.fixture(scope="module")
def binary_reference(solutions, tmp_path_factory):
    """Binary mc-label of ``solutions``, one chunk in flight, no fault."""
    out = tmp_path_factory.mktemp("ref") / "binary.parquet"
    stepkit("mc-label", solutions, out, *BINARY, "--chunks-in-flight", "1")
    return out


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C", "kill"])
def test_a_run_with_chunks_in_flight_stopped_mid_run_resumes_to_the_same_rows(solutions, binary_reference, tmp_path,
                                                                               how, fault_table):
    out = tmp_path / "lab.parquet"
    proc = start("mc-label", solutions, out, *BINARY, "--chunks-in-flight", str(WINDOW), delay=0.1)
    try:
        wait_for_parts(out, 3, proc)
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        elif how == "Ctrl-C":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGKILL)  # a crash: nothing of the run is cleaned up
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    kept = sorted(int(p.stem.split("-")[1]) for p in committed(out))
    assert kept == list(range(len(kept))) and len(kept) < 12  # committed in order: a prefix of the chunks
    events = log_events(out)
    started = [e["chunk"] for e in events if e["event"] == "chunk_start"]
    commits = [e["chunk"] for e in events if e["event"] == "chunk_commit"]
    assert commits == kept
    # the window was used (a chunk started before the one before it committed) and never exceeded
    assert len(kept) < len(started) <= len(kept) + WINDOW
    if how != "kill":
        assert events[-1]["event"] == "interrupted" and proc.returncode == 128 + (
            signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)

    stepkit("mc-label", solutions, out, *BINARY, "--chunks-in-flight", str(WINDOW))
    m = manifest(out)
    assert m["run"]["resumed_chunks"] == len(kept) and m["run"]["chunks_this_run"] == 12 - len(kept)
    assert pq.read_table(out).to_pylist() == pq.read_table(binary_reference).to_pylist()
    lost = rows_lost(solutions, out)
    assert lost == 0
    fault_table.add(f"{how} during a binary mc-label run with {WINDOW} chunks in flight (scripted engine)",
                    "committed chunks a prefix, in order; the rerun resumed them and redid the ones in flight; rows "
                    "equal an uninterrupted run with one chunk in flight", lost,
                    f"{len(kept)} chunks kept, {len(started) - len(kept)} in flight redone")
