"""A part file damaged in the parts folder between a killed run and its rerun: the sha256 recorded with the
part at commit finds it, the chunk is redone, and nothing damaged is ever reused."""

from __future__ import annotations

import os
import signal

import pyarrow.parquet as pq
import pytest

from stepkit.runner import run_stage
from tests.faults.common import MC_LABEL, committed, manifest, parts_of, rows_lost, start, stepkit, wait_for_parts
from tests.toy_stage import ToyConfig, ToyStage


def kill_after(solutions, out, n):
    proc = start("mc-label", solutions, out, *MC_LABEL, delay=0.1)
    wait_for_parts(out, n, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # a crash: nothing of the run is cleaned up
    proc.wait()
    return len(committed(out))


def test_truncated_bit_flipped_and_replaced_parts_are_redone(solutions, reference, tmp_path, fault_table):
    out = tmp_path / "lab.parquet"
    kept = kill_after(solutions, out, 6)
    parts = parts_of(out)
    p1, p2, p3, p4 = (parts / f"part-0000{i}.parquet" for i in (1, 2, 3, 4))
    p1.write_bytes(p1.read_bytes()[: p1.stat().st_size // 2])  # truncated
    data = bytearray(p2.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit flipped
    p2.write_bytes(bytes(data))
    p3.write_bytes((parts / "part-00000.parquet").read_bytes())  # a valid Parquet file with another chunk's rows
    assert pq.read_table(p3).num_rows == 1  # (it reads fine: only the checksum tells it is not chunk 3)
    (parts / "part-00004.json").unlink()  # the counters of a chunk gone

    p = stepkit("mc-label", solutions, out, *MC_LABEL)
    # (scripted:echo's K continuations of a prefix are copies: mc-label's distinct-share line is not a fault's)
    warnings = [line for line in p.stderr.splitlines() if line.startswith("warning: ") and "distinct share" not in line]
    assert warnings == [
        f"warning: {p1}: committed chunk 1 is damaged (part-00001.parquet does not match the sha256 recorded "
        "when it was committed (changed since)); it is redone",
        f"warning: {p2}: committed chunk 2 is damaged (part-00002.parquet does not match the sha256 recorded "
        "when it was committed (changed since)); it is redone",
        f"warning: {p3}: committed chunk 3 is damaged (part-00003.parquet does not match the sha256 recorded "
        "when it was committed (changed since)); it is redone",
        f"warning: {p4}: committed chunk 4 is damaged (its counters file part-00004.json is missing); it is redone",
    ]
    m = manifest(out)
    assert m["run"]["resumed_chunks"] == kept - 4 and m["run"]["chunks_this_run"] == 12 - kept + 4
    assert pq.read_table(out).to_pylist() == pq.read_table(reference).to_pylist()  # nothing damaged reused
    lost = rows_lost(solutions, out)
    assert lost == 0
    fault_table.add("damaged parts between a kill and the rerun: one truncated, one bit flipped, one replaced by "
                    "another chunk's (valid) part, one counters file deleted",
                    "each found by the sha256 recorded in its `part-NNNNN.json` at commit (one warning line each); "
                    "those 4 chunks redone, the others resumed; output identical to an unfaulted run", lost,
                    f"{kept} chunks committed before the kill, {kept - 4} reused, {12 - kept + 4} done by the rerun")


def test_a_damaged_side_table_is_redone_with_its_chunk(solutions, tmp_path, fault_table):
    ref, steps_ref = tmp_path / "ref.parquet", tmp_path / "ref-steps.parquet"
    run_stage(ToyStage(ToyConfig(steps_out=str(steps_ref))), solutions, ref, progress=False)

    out, steps = tmp_path / "o.parquet", tmp_path / "steps.parquet"

    class Crash(ToyStage):
        calls = 0

        def process(self, rows):
            if Crash.calls == 4:
                raise RuntimeError("killed")  # a crash after four of six chunks
            Crash.calls += 1
            return super().process(rows)

    with pytest.raises(RuntimeError):
        run_stage(Crash(ToyConfig(steps_out=str(steps))), solutions, out, progress=False)
    side = parts_of(out) / "steps-00002.parquet"
    data = bytearray(side.read_bytes())
    data[-20] ^= 0x10
    side.write_bytes(bytes(data))
    (res,) = run_stage(ToyStage(ToyConfig(steps_out=str(steps))), solutions, out, progress=False)
    assert res.resumed_chunks == 3 and res.chunks == 6
    assert pq.read_table(out).to_pylist() == pq.read_table(ref).to_pylist()
    assert pq.read_table(steps).to_pylist() == pq.read_table(steps_ref).to_pylist()
    lost = rows_lost(solutions, out)
    assert lost == 0
    fault_table.add("a side table part (`steps-00002.parquet` of a stage with a side output) bit-flipped",
                    "found by its sha256; its chunk redone with rows and side table", lost,
                    "3 of 4 committed chunks reused")
