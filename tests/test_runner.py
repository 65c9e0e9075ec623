"""The runner contract through the CLI with the scripted engine: resume after a kill, atomic output,
manifest, refusal on a changed configuration, --rank/--world-size, --max-error-rate, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA, run_cli

STEPKIT = [sys.executable, "-m", "stepkit.cli"]
SCRIPTED = ["--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--no-progress"]


def run(*args, env=None, check=True):
    """``stepkit ARGS``: in-process (tests.conftest.run_cli), or in a process of its own when ``env`` is given."""
    if env is None:
        p = run_cli(*args, check=False)
    else:
        p = subprocess.run([*STEPKIT, *map(str, args)], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"stepkit {args} failed ({p.returncode}):\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def solutions(tmp_path_factory) -> Path:
    """12 real GSM8K model solutions (3 problems x 4 generators)."""
    out = tmp_path_factory.mktemp("sol") / "solutions.parquet"
    run("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", out, "--limit", "3")
    return out


def kill_after_parts(solutions, out, n_parts, delay):
    """Start `mc-label` (chunks of one row, one at a time, slowed by ``delay`` s per request), SIGKILL its whole
    process group once ``n_parts`` chunks are committed; return the parts folder. (Several chunks in flight
    killed: ``tests/faults/test_window_resume.py``.)"""
    parts = out.with_name(out.name + ".parts")
    proc = subprocess.Popen([*STEPKIT, "mc-label", str(solutions), str(out), *SCRIPTED, "--chunk-size", "1",
                             "--chunks-in-flight", "1"],
                            env={**os.environ, "STEPKIT_SCRIPTED_DELAY": str(delay)}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(list(parts.glob("part-*.parquet"))) < n_parts and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole process group, as with a vLLM engine-core child
    proc.wait()
    return parts


def ids(path):
    return pq.read_table(path, columns=["id"]).column("id").to_pylist()


def test_resume_after_kill_redoes_at_most_the_chunk_in_flight(solutions, tmp_path):
    ref = tmp_path / "ref.parquet"
    run("mc-label", solutions, ref, *SCRIPTED, "--chunk-size", "1")

    out = tmp_path / "out.parquet"
    parts = kill_after_parts(solutions, out, 3, 0.15)
    assert not out.exists(), "output must appear only when the shard is complete"
    committed = sorted(parts.glob("part-*.parquet"))
    assert 3 <= len(committed) < 12
    before = {p.name: pq.read_table(p) for p in committed}
    started = [json.loads(line) for line in (parts / "log.jsonl").read_text().splitlines()]
    started = [e["chunk"] for e in started if e["event"] == "chunk_start"]
    assert len(started) - len(committed) <= 1, "only the chunk in flight is lost"

    run("mc-label", solutions, out, *SCRIPTED, "--chunk-size", "1")
    manifest = json.loads((tmp_path / "out.manifest.json").read_text())
    assert manifest["run"]["resumed_chunks"] == len(committed)
    assert manifest["run"]["chunks_this_run"] == 12 - len(committed)
    assert ids(out) == ids(ref)
    final = pq.read_table(out)
    for name, table in before.items():  # committed part files are unchanged in the output
        i = int(name[5:10])
        assert final.slice(i, 1).to_pylist() == table.to_pylist()
    assert final.to_pylist() == pq.read_table(ref).to_pylist()  # scripted engine: deterministic
    assert not parts.exists()


def test_manifest_and_parquet_metadata(solutions, tmp_path):
    out = tmp_path / "lab.parquet"
    run("mc-label", solutions, out, *SCRIPTED, "--temperature", "0.7", "--max-tokens", "99")
    m = json.loads((tmp_path / "lab.manifest.json").read_text())
    assert m["stage"] == "mc-label" and m["stepkit_version"]
    assert m["config"]["engine"] == {"name": "scripted", "model": "scripted:echo"}
    assert m["config"]["sampling"]["temperature"] == 0.7 and m["config"]["sampling"]["max_tokens"] == 99
    assert m["config"]["prompt_template"]["hash"]
    assert m["config"]["grader"]["float_rounding"] is not None
    assert len(m["identity"]["input_sha256"]) == 64
    assert m["counts"]["rows"] == 12 and m["counts"]["continuations"] > 0
    assert m["input"]["manifest"]["stage"] == "ingest"  # lineage
    meta = json.loads(pq.read_schema(out).metadata[b"stepkit"])
    assert meta["identity"] == m["identity"]
    schema = pq.read_schema(out)
    assert schema.field("mc_value").type == pa.list_(pa.float32())
    assert schema.field("mc_label").type == pa.list_(pa.bool_())


def test_changed_configuration_refuses_unless_force(solutions, tmp_path):
    out = tmp_path / "lab.parquet"
    run("mc-label", solutions, out, *SCRIPTED)
    before = out.read_bytes()
    again = run("mc-label", solutions, out, *SCRIPTED)
    assert "up to date" in again.stderr and out.read_bytes() == before
    p = run("mc-label", solutions, out, *SCRIPTED[:4], "-k", "3", "--no-progress", check=False)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].startswith("error:") and "continuations 2 -> 3" in p.stderr
    assert "--force" in p.stderr and out.read_bytes() == before  # nothing already written is lost
    run("mc-label", solutions, out, *SCRIPTED[:4], "-k", "3", "--no-progress", "--force")
    assert json.loads((tmp_path / "lab.manifest.json").read_text())["config"]["continuations"] == 3


def test_partial_run_from_other_configuration_refuses(solutions, tmp_path):
    out = tmp_path / "lab.parquet"
    parts = tmp_path / "lab.parquet.parts"
    parts.mkdir()
    (parts / "run.json").write_text(json.dumps({"config_hash": "other", "config": {"continuations": 9}}))
    (parts / "part-00000.parquet").write_bytes(b"kept")
    p = run("mc-label", solutions, out, *SCRIPTED, check=False)
    assert p.returncode == 1 and "partial run from a different configuration" in p.stderr
    assert (parts / "part-00000.parquet").read_bytes() == b"kept"


def test_rank_and_world_size_split_a_folder(solutions, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    table = pq.read_table(solutions)
    for i in range(3):
        pq.write_table(table.slice(4 * i, 4), folder / f"shard-{i}.parquet")
    out = tmp_path / "out"
    run("mc-label", folder, out, *SCRIPTED, "--rank", "1", "--world-size", "2")
    assert sorted(p.name for p in out.glob("*.parquet")) == ["shard-1.parquet"]
    run("mc-label", folder, out, *SCRIPTED, "--rank", "0", "--world-size", "2")
    assert sorted(p.name for p in out.glob("*.parquet")) == ["shard-0.parquet", "shard-1.parquet", "shard-2.parquet"]
    assert ids(out / "shard-2.parquet") == table.slice(8, 4).column("id").to_pylist()


def test_max_error_rate(solutions, tmp_path):
    table = pq.read_table(solutions)
    refs = table.column("reference_answer").to_pylist()
    refs[0] = refs[5] = None  # 2 of 12 rows cannot be graded -> per-row error
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("reference_answer"), "reference_answer",
                                    pa.array(refs, pa.string())), bad)
    out = tmp_path / "lab.parquet"
    p = run("mc-label", bad, out, *SCRIPTED, "--max-error-rate", "0.1", check=False)
    assert p.returncode == 1 and "2 of 12 rows failed" in p.stderr and not out.exists()
    p = run("mc-label", bad, out, *SCRIPTED, "--max-error-rate", "0.2")
    errors = pq.read_table(out, columns=["error"]).column("error").to_pylist()
    assert sum(e is not None for e in errors) == 2 and errors[0].startswith("mc-label:")


def _one_error_line(p):
    lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
    assert p.returncode != 0
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def test_bad_input_missing_column(solutions, tmp_path):
    bad = tmp_path / "nosteps.parquet"
    pq.write_table(pq.read_table(solutions).drop(["steps"]), bad)
    line = _one_error_line(run("mc-label", bad, tmp_path / "o.parquet", *SCRIPTED, check=False))
    assert "nosteps.parquet" in line and "column 'steps'" in line and "missing" in line


def test_bad_input_empty_steps(solutions, tmp_path):
    table = pq.read_table(solutions)
    steps = table.column("steps").to_pylist()
    steps[7] = []
    bad = tmp_path / "empty.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("steps"), "steps",
                                    pa.array(steps, pa.list_(pa.string()))), bad)
    line = _one_error_line(run("mc-label", bad, tmp_path / "o.parquet", *SCRIPTED, check=False))
    assert "empty.parquet: row 7, column 'steps'" in line
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "o.parquet.parts").exists()


def test_bad_input_not_parquet(tmp_path):
    bad = tmp_path / "notes.parquet"
    bad.write_text("this is not parquet\n")
    line = _one_error_line(run("mc-label", bad, tmp_path / "o.parquet", *SCRIPTED, check=False))
    assert "notes.parquet" in line and "not a readable Parquet file" in line


def test_bad_input_wrong_type(solutions, tmp_path):
    table = pq.read_table(solutions)
    bad = tmp_path / "typed.parquet"
    joined = pa.array(["\n".join(s) for s in table.column("steps").to_pylist()])
    pq.write_table(table.set_column(table.schema.get_field_index("steps"), "steps", joined), bad)
    line = _one_error_line(run("mc-label", bad, tmp_path / "o.parquet", *SCRIPTED, check=False))
    assert "column 'steps'" in line and "expected type list<item: string>" in line


def test_unknown_model_path_keeps_earlier_output(solutions, tmp_path):
    out = tmp_path / "lab.parquet"
    run("mc-label", solutions, out, *SCRIPTED)
    before = out.read_bytes()
    other = tmp_path / "other.parquet"
    line = _one_error_line(run("mc-label", solutions, other, "--model", tmp_path / "no-such-model",
                               "-k", "2", "--no-progress", check=False))
    assert "no-such-model" in line
    assert out.read_bytes() == before and not other.exists()


def test_help_is_fast_and_imports_no_torch():
    code = ("import sys, time; t=time.time(); from stepkit.cli import main\n"
            "for args in (['--help'], ['mc-label', '--help']):\n"
            "    try:\n        main(args)\n    except SystemExit: pass\n"
            "    heavy = {'torch', 'vllm', 'ray'} & set(sys.modules)\n"
            "    assert not heavy, f'{args}: heavy import {heavy}'\n"
            "print(time.time()-t)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "--executor [local|ray]" in p.stdout and "--gpus-per-shard" in p.stdout  # every model stage's flags
    for cmd in ("mc-label", "ingest", "stats", "show", "models"):
        q = run(cmd, "--help")
        assert "Usage:" in q.stdout


def test_out_equal_to_in_is_refused_and_input_kept(solutions, tmp_path):
    copy = tmp_path / "x.parquet"
    copy.write_bytes(solutions.read_bytes())
    for extra in ([], ["--force"]):
        line = _one_error_line(run("mc-label", copy, copy, *SCRIPTED, *extra, check=False))
        assert "same as IN" in line or "same file as IN" in line
    assert copy.read_bytes() == solutions.read_bytes()
    line = _one_error_line(run("ingest", "jsonl", DATA / "gsm8k" / "test.jsonl", DATA / "gsm8k" / "test.jsonl",
                               check=False))
    assert "same file" in line


def test_folder_in_needs_folder_out(solutions, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.parquet").write_bytes(solutions.read_bytes())
    line = _one_error_line(run("mc-label", folder, tmp_path / "o.parquet", *SCRIPTED, check=False))
    assert "must be a folder" in line


def test_second_writer_of_the_same_output_is_refused(solutions, tmp_path):
    out = tmp_path / "lab.parquet"
    first = subprocess.Popen([*STEPKIT, "mc-label", str(solutions), str(out), *SCRIPTED, "--chunk-size", "1",
                              "--chunks-in-flight", "1"], env={**os.environ, "STEPKIT_SCRIPTED_DELAY": "0.1"},
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        parts = tmp_path / "lab.parquet.parts"
        deadline = time.time() + 120
        while not list(parts.glob("part-*.parquet")) and time.time() < deadline:
            time.sleep(0.05)
        line = _one_error_line(run("mc-label", solutions, out, *SCRIPTED, "--chunk-size", "1", check=False))
        assert "another stepkit run is writing" in line
    finally:
        first.wait(timeout=300)
    assert first.returncode == 0 and out.exists()
    assert not (tmp_path / ".lab.parquet.lock").exists()


def test_part_without_counters_is_not_committed(solutions, tmp_path):
    """A kill between the two writes of a chunk commit: rows (.parquet) are written last, so a part
    with counters (.json) but no rows is simply redone."""
    out = tmp_path / "lab.parquet"
    parts = kill_after_parts(solutions, out, 2, 0.1)
    n = len(list(parts.glob("part-*.parquet")))
    (parts / f"part-{n:05d}.json").write_text('{"rows": 1, "counters": {}}')  # orphan counters
    run("mc-label", solutions, out, *SCRIPTED, "--chunk-size", "1")
    assert ids(out) == pq.read_table(solutions).column("id").to_pylist()


def test_upstream_errors_do_not_count_against_this_stage(solutions, tmp_path):
    table = pq.read_table(solutions)
    errors = [None] * table.num_rows
    errors[0] = errors[1] = "rollout: empty completion"
    src = tmp_path / "up.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("error"), "error", pa.array(errors, pa.string())), src)
    out = tmp_path / "lab.parquet"
    run("mc-label", src, out, *SCRIPTED)  # 2 of 12 rows failed upstream: not this stage's error rate
    rows = pq.read_table(out).to_pylist()
    assert rows[0]["error"] == "rollout: empty completion" and rows[0]["mc_value"] is None
    m = json.loads((tmp_path / "lab.manifest.json").read_text())
    assert m["counts"]["errors"] == 0 and m["counts"]["upstream_errors"] == 2


def test_null_and_duplicate_ids_are_bad_input(solutions, tmp_path):
    table = pq.read_table(solutions)
    ids_ = table.column("id").to_pylist()
    ids_[4] = ids_[3]
    bad = tmp_path / "dup.parquet"
    pq.write_table(table.set_column(0, "id", pa.array(ids_, pa.string())), bad)
    line = _one_error_line(run("mc-label", bad, tmp_path / "o.parquet", *SCRIPTED, check=False))
    assert "dup.parquet: row 4, column 'id': duplicate value" in line


def test_corrupt_data_pages_are_one_line(solutions, tmp_path):
    data = bytearray(solutions.read_bytes())
    for i in range(200, 1200):
        data[i] ^= 0x5A  # damage the first data pages, keep the footer
    bad = tmp_path / "corrupt.parquet"
    bad.write_bytes(bytes(data))
    line = _one_error_line(run("mc-label", bad, tmp_path / "o.parquet", *SCRIPTED, check=False))
    assert "corrupt.parquet" in line
