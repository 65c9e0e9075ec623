"""SIGTERM to a ``stepkit mc-label`` run of the real vLLM CPU engine (the bundled SmolLM2-135M) on real GSM8K
solutions, once its first part is committed: sent to the stepkit process alone (not its group), so only
stepkit's own shutdown can take the EngineCore child down. No child may remain 30 s later; the rerun
resumes, run as a user runs it (the ``stepkit`` script, no engine start-up notices on stderr), with the
exhaustive rows and the manifest's engine provenance. One test: it loads the engine twice (about 2 minutes
on 2 cores); the other stages' kill and resume run on the scripted engine (tests/faults/)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA
from tests.faults.common import ENV, command, committed, manifest, one_error_line, rows_lost, stepkit, wait_for_parts

pytestmark = pytest.mark.engine


def wait_for_room(max_engines: int = 1, timeout: float = 600) -> None:
    """Wait while more than ``max_engines`` other vLLM engines run on the machine (24 GB hold three badly)."""
    deadline = time.time() + timeout
    while sum("EngineCore" in " ".join(p.info["cmdline"] or []) or p.info["name"].endswith("EngineCore")
              for p in psutil.process_iter(["cmdline", "name"])) > max_engines and time.time() < deadline:
        time.sleep(5)


@pytest.mark.own_engine
def test_sigterm_leaves_no_engine_process_and_the_rerun_resumes(tmp_path, fault_table):
    sols = tmp_path / "solutions.parquet"
    stepkit("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sols, "--limit", "3",
            "--generator", "175b_verification")
    out = tmp_path / "labeled.parquet"
    args = ["mc-label", sols, out, "--model", "smollm2-135m", "-k", "2", "--max-tokens", "48", "--no-progress",
            "--chunk-size", "1", "--chunks-in-flight", "1"]  # (the signal lands between commits)
    wait_for_room()
    env = {**ENV, "VLLM_LOGGING_LEVEL": "ERROR"}  # stepkit's default (tests/conftest.py sets WARNING)
    # as a user runs it: the `stepkit` script (its spawned engine processes import stepkit first, which quiets
    # vLLM's Triton notice; `python -m` children do not)
    script = [os.path.join(os.path.dirname(sys.executable), "stepkit"), *command(*args)[3:]]
    proc = subprocess.Popen(script, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_parts(out, 1, proc, timeout=600)
        children = [p for p in psutil.Process(proc.pid).children(recursive=True)
                    if p.status() != psutil.STATUS_ZOMBIE]
        names = [" ".join(p.cmdline()) or p.name() for p in children]
        assert any("EngineCore" in n for n in names + [p.name() for p in children]), names
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        proc.wait(timeout=60)
        exited = time.monotonic() - t0
        gone, alive = psutil.wait_procs(children, timeout=30)
        seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not alive, f"engine processes survived SIGTERM: {alive}"
    line = one_error_line(proc)
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in line
    assert not (tmp_path / ".labeled.parquet.lock").exists()
    kept = len(committed(out))
    assert 1 <= kept < 3 and not out.exists()
    first = pq.read_table(committed(out)[0]).to_pylist()

    wait_for_room()
    p = subprocess.run(script, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    for noise in ("Triton is installed", "NUMA binding", "FutureWarning", "reduce_op"):  # engine start-up notices
        assert noise not in p.stderr, p.stderr[:2000]
    m = manifest(out)
    assert m["run"]["resumed_chunks"] == kept and m["run"]["chunks_this_run"] == 3 - kept
    assert m["config"]["engine"]["enable_prefix_caching"] is True and m["config"]["sampling"]["max_tokens"] == 48
    assert m["provenance"]["engine"]["engine"] == "vllm" and m["provenance"]["engine"]["vllm_version"]
    rows = pq.read_table(out).to_pylist()
    assert [r["id"] for r in rows] == [f"gsm8k-test-{i}:175b_verification" for i in range(3)]
    assert rows[0] == first[0]  # the committed chunk kept, not regenerated
    for r in rows:  # exhaustive: K continuations for every prefix but the last (the outcome)
        assert r["error"] is None and r["mc_rollouts"] == [2] * (len(r["steps"]) - 1) + [0]
    assert m["counts"]["continuations"] == sum(2 * len(r["steps"]) for r in rows)  # incl. v0
    lost = rows_lost(sols, out)
    assert lost == 0
    fault_table.add("SIGTERM to a real vLLM CPU mc-label run (SmolLM2-135M, 3 GSM8K solutions) after its first "
                    "commit, sent to the stepkit process only",
                    "engine closed as the exception unwound (EngineCore and its worker shut down), lock removed, "
                    f"one line, exit 143; the rerun resumed {kept} chunk(s)", lost,
                    f"{len(children)} children, stepkit exited {exited:.1f} s after the signal, all children gone "
                    f"at {seconds:.1f} s (limit 30 s)")
