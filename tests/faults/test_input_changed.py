"""The input shard changed between a killed run and its rerun: refused with one clear line unless --force."""

from __future__ import annotations

import os
import signal

import pyarrow as pa
import pyarrow.parquet as pq

from tests.faults.common import (
    MC_LABEL,
    committed,
    ids,
    manifest,
    one_error_line,
    parts_of,
    rows_lost,
    start,
    stepkit,
    wait_for_parts,
)


def test_changed_input_is_refused_unless_force(solutions, tmp_path, fault_table):
    inp = tmp_path / "in.parquet"
    inp.write_bytes(solutions.read_bytes())
    out = tmp_path / "lab.parquet"
    proc = start("mc-label", inp, out, *MC_LABEL, delay=0.1)
    wait_for_parts(out, 3, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p.name: p.read_bytes() for p in parts_of(out).iterdir()}
    stale = len(committed(out))

    t = pq.read_table(inp)  # another tool rewrites the shard: one step edited, the last row dropped
    steps = t.column("steps").to_pylist()
    steps[0] = steps[0][:-1] + [steps[0][-1] + " (edited)"]
    t = t.set_column(t.schema.get_field_index("steps"), "steps", pa.array(steps, pa.list_(pa.string()))).slice(0, 11)
    pq.write_table(t, inp)

    p = stepkit("mc-label", inp, out, *MC_LABEL, check=False)
    line = one_error_line(p)
    assert line == (f"error: {parts_of(out)}: partial run from a different configuration (the input file changed); "
                    "use --force to discard it")
    assert {q.name: q.read_bytes() for q in parts_of(out).iterdir()} == before and not out.exists()

    stepkit("mc-label", inp, out, *MC_LABEL, "--force")
    assert ids(out) == ids(inp) and manifest(out)["run"]["resumed_chunks"] == 0
    assert pq.read_table(out).column("steps").to_pylist()[0][-1].endswith("(edited)")
    lost = rows_lost(inp, out)
    assert lost == 0
    fault_table.add("input shard rewritten between a kill and the rerun",
                    "refused: one line `partial run from a different configuration (the input file changed); use "
                    "--force to discard it`, parts untouched; with --force redone from the new input", lost,
                    f"{stale} stale parts kept by the refusal, discarded by --force")
