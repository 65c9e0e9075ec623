"""A full disk while a part file is written: one clear line, the committed parts intact, the rerun resumes."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stepkit.shards import file_sha256
from tests.faults.common import (
    MC_LABEL,
    committed,
    manifest,
    one_error_line,
    parts_of,
    rows_lost,
    start,
    stepkit,
    wait_for_parts,
)


def assert_parts_intact(out: Path) -> int:
    """Every committed part matches the sha256 recorded with it, and no temporary file is left; returns how
    many chunks are committed."""
    parts = parts_of(out)
    for p in committed(out):
        meta = json.loads(p.with_suffix(".json").read_text())
        assert meta["sha256"]["part"] == file_sha256(p), p
        assert pq.read_table(p).num_rows == meta["rows"]
    leftovers = [p.name for p in parts.iterdir() if p.name.startswith(".")]
    assert not leftovers, f"temporary files left in {parts}: {leftovers}"
    return len(committed(out))


def test_enospc_while_a_part_file_is_written(solutions, reference, tmp_path, fault_table):
    out = tmp_path / "lab.parquet"
    p = stepkit("mc-label", solutions, out, *MC_LABEL, inject="enospc:part-00004.parquet", check=False)
    line = one_error_line(p)
    assert line == (f"error: {parts_of(out) / 'part-00004.parquet'}: cannot write it (No space left on device); "
                    f"the chunks committed so far are kept in {parts_of(out)}: free some space and run the same "
                    "command again to resume")
    assert p.returncode == 1 and not out.exists()
    kept = assert_parts_intact(out)
    assert kept == 4 and not (parts_of(out) / "part-00004.parquet").exists()

    stepkit("mc-label", solutions, out, *MC_LABEL)  # the disk has room again
    m = manifest(out)
    assert m["run"]["resumed_chunks"] == 4 and m["run"]["chunks_this_run"] == 8
    assert pq.read_table(out).to_pylist() == pq.read_table(reference).to_pylist()
    lost = rows_lost(solutions, out)
    assert lost == 0
    fault_table.add("disk full while a part is written (injected `ENOSPC` in the Parquet writer of part 4)",
                    "one line naming the part and 'No space left on device', exit 1; parts 0-3 intact (sha256), "
                    "no temp file left; the rerun resumed", lost, "resumed 4 of 12 chunks, redid 8")


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (needs root and mount rights; skipped otherwise)."""
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip() or p.returncode})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path) -> Path:
    """Write a file on ``disk`` until it is full; returns it."""
    filler = disk / "filler.bin"
    block = b"\0" * 65536
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def test_a_real_full_disk_mid_run(solutions, reference, small_disk, fault_table):
    """OUT on a small tmpfs that fills up while mc-label runs: the write that finds no room is one line."""
    out = small_disk / "lab.parquet"
    proc = start("mc-label", solutions, out, *MC_LABEL, delay=0.1)
    try:
        wait_for_parts(out, 3, proc)
        filler = fill(small_disk)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    line = one_error_line(proc)
    assert "No space left on device" in line and str(parts_of(out)) in line and "run the same command again" in line
    assert proc.returncode == 1 and not out.exists()
    filler.unlink()
    kept = assert_parts_intact(out)
    assert 3 <= kept < 12

    stepkit("mc-label", solutions, out, *MC_LABEL)
    assert manifest(out)["run"]["resumed_chunks"] == kept
    assert pq.read_table(out).to_pylist() == pq.read_table(reference).to_pylist()
    lost = rows_lost(solutions, out)
    assert lost == 0
    shutil.rmtree(parts_of(out), ignore_errors=True)
    fault_table.add("disk full mid-run (OUT on a 4 MiB tmpfs, filled once 3 parts were committed)",
                    f"one line: `{Path(line.removeprefix('error: ').split(': ', 1)[0]).name}: cannot write it (No "
                    "space left on device)`, exit 1; committed parts intact; the rerun resumed", lost,
                    f"{kept} of 12 chunks kept and resumed")
