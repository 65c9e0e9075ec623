"""SIGTERM and Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during generation: the
child processes are gone within 30 s, the lock is released, and the rerun resumes with at most the chunk
that was in flight redone. (The real vLLM engine's EngineCore child: ``test_engine_signal.py``.)"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pyarrow.parquet as pq
import pytest

from stepkit.runner import OutputLock
from tests.faults.common import (
    MC_LABEL,
    committed,
    log_events,
    manifest,
    one_error_line,
    rows_lost,
    start,
    stepkit,
    wait_for_parts,
)


def gone_within(procs: list[psutil.Process], seconds: float) -> float:
    """Seconds until none of ``procs`` is alive (a zombie counts as gone); fails after ``seconds``."""
    t0 = time.monotonic()
    while True:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < seconds, f"still alive after {seconds} s: {[p.cmdline() for p in alive]}"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_stopped_mid_generation_cleans_up_and_resumes(solutions, reference, tmp_path, how, fault_table):
    out = tmp_path / "lab.parquet"
    lock = tmp_path / ".lab.parquet.lock"
    proc = start("mc-label", solutions, out, *MC_LABEL, delay=0.15)
    try:
        wait_for_parts(out, 3, proc)
        children = psutil.Process(proc.pid).children(recursive=True)
        workers = [c for c in children if "multiprocessing" in " ".join(c.cmdline())]
        assert len(workers) >= 2, [c.cmdline() for c in children]  # the answer checker's pool (and its tracker)
        assert lock.read_text() == str(proc.pid)
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches every process of the group
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    seconds = gone_within(children, 30)
    signum = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
    line = one_error_line(proc)
    kept = len(committed(out))
    assert proc.returncode == 128 + signum
    assert line == (f"error: {out}: stopped by {signum.name}; {kept} committed chunk(s) kept in {out}.parts: run the "
                    "same command again to resume")
    assert not lock.exists()
    with OutputLock(out):  # free
        pass
    events = log_events(out)
    started = [e["chunk"] for e in events if e["event"] == "chunk_start"]
    assert len(started) - kept <= 1 and events[-1]["event"] == "interrupted"

    p = stepkit("mc-label", solutions, out, *MC_LABEL)
    m = manifest(out)
    assert m["run"]["resumed_chunks"] == kept and m["run"]["chunks_this_run"] == 12 - kept
    assert pq.read_table(out).to_pylist() == pq.read_table(reference).to_pylist()
    lost = rows_lost(solutions, out)
    # (scripted:echo's K continuations of a prefix are copies: mc-label's distinct-share line is not a fault's)
    assert lost == 0 and not [x for x in p.stderr.splitlines() if "warning" in x and "distinct share" not in x]
    fault_table.add(f"{how} during generation (scripted engine, {'to the process' if how == 'SIGTERM' else 'to the process group'})",
                    f"unwound like Ctrl-C: one line `stopped by {signum.name}; N committed chunk(s) kept`, exit "
                    f"{128 + signum}; lock file removed; checker workers gone; the rerun resumed", lost,
                    f"{len(children)} children gone {seconds:.1f} s after exit; {kept} chunks kept, "
                    f"{len(started) - kept} in flight redone")


def test_a_stage_opened_for_a_shard_that_fails_is_closed_before_the_lock_goes(solutions, tmp_path):
    """The executor closes a stage only after a shard returned; one whose first shard is interrupted (or
    fails) is closed by run_shard itself, while the lock is still held, so its engine's processes never
    outlive the run."""
    from stepkit.errors import Interrupted
    from stepkit.runner import run_stage
    from tests.toy_stage import ToyConfig, ToyStage

    out = tmp_path / "o.parquet"
    events = []

    class Stopped(ToyStage):
        def open(self):
            events.append("open")

        def process(self, rows):
            if len(events) == 3:
                raise KeyboardInterrupt  # Ctrl-C in the third chunk
            events.append("chunk")
            return super().process(rows)

        def close(self):
            events.append(f"close, lock held: {(tmp_path / '.o.parquet.lock').exists()}")

    with pytest.raises(Interrupted, match=r"o.parquet: stopped by SIGINT; 2 committed chunk\(s\) kept"):
        run_stage(Stopped(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), solutions, out, progress=False)
    assert events == ["open", "chunk", "chunk", "close, lock held: True"]
    assert not (tmp_path / ".o.parquet.lock").exists()
