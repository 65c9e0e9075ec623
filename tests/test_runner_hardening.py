"""Defects of the runner and its commands found by the hardening issue, one test (or a few) each:
row errors kept whatever the input's columns, reports that never write over a shard's own files, parts
deleted mid-run, symlink loops, the output lock, folders whose shards come from different settings."""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.engines.base import Completion, EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine, judge_policy
from stepkit.errors import InputError, StepkitError
from stepkit.runner import run_stage
from tests.conftest import DATA, run_cli
from tests.toy_stage import ToyConfig, ToyStage

SCRIPTED = ["--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--no-progress"]


@pytest.fixture(scope="module")
def solutions(tmp_path_factory) -> Path:
    """12 real GSM8K model solutions (3 problems x 4 generators)."""
    out = tmp_path_factory.mktemp("sol") / "solutions.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", out, "--limit", "3")
    return out


def one_error_line(p) -> str:
    lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


# --- D3: a stage's output always carries `error` ------------------------------------------------------------

@pytest.fixture
def no_error_column(solutions, tmp_path) -> Path:
    """The solutions as another tool writes them: no `error` column, row 0 without a reference answer."""
    t = pq.read_table(solutions).drop(["error"])
    refs = t.column("reference_answer").to_pylist()
    refs[0] = None
    t = t.set_column(t.schema.get_field_index("reference_answer"), "reference_answer", pa.array(refs, pa.string()))
    path = tmp_path / "other-tool.parquet"
    pq.write_table(t, path)
    return path


def test_mc_label_keeps_its_row_error_when_the_input_has_no_error_column(no_error_column, tmp_path):
    out = tmp_path / "lab.parquet"
    run_cli("mc-label", no_error_column, out, *SCRIPTED, "--max-error-rate", "1")
    errors = pq.read_table(out, columns=["error"]).column("error").to_pylist()
    assert errors[0].startswith("mc-label: no reference_answer") and errors[1:] == [None] * 11
    assert pq.read_schema(out).field("error").type == pa.string()
    stats = run_cli("stats", out).stdout
    assert "no reference_answer" in stats  # the errors-by-reason table
    assert json.loads((tmp_path / "lab.manifest.json").read_text())["counts"]["errors"] == 1


def test_judge_keeps_its_row_error_when_the_input_has_no_error_column(no_error_column, tmp_path):
    def failing(prompt, j, n):  # the engine fails on one row's prompt
        if "Janet" in prompt:
            return Completion("server went away", "error")
        return judge_policy(prompt, j, n)

    from stepkit.stages.judge import JudgeConfig, JudgeStage

    stage = JudgeStage(JudgeConfig(), EngineSpec.of(ScriptedEngine(failing, "scripted:judge")), SamplingConfig())
    out = tmp_path / "judged.parquet"
    (res,) = run_stage(stage, no_error_column, out, progress=False, max_error_rate=1.0)
    rows = pq.read_table(out).to_pylist()
    failed = [r for r in rows if r["error"]]
    assert res.errors == len(failed) > 0
    assert all(r["error"] == "judge: engine: server went away" and "Janet" in r["prompt"] for r in failed)


def test_every_stage_output_has_an_error_column_and_a_wrongly_typed_one_is_bad_input(solutions, tmp_path):
    """The toy stage declares no `error` column: the runner adds it, for every stage."""
    src = tmp_path / "in.parquet"
    pq.write_table(pq.read_table(solutions).drop(["error"]), src)
    stage = ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"), min_length=10_000))
    (res,) = run_stage(stage, src, tmp_path / "o.parquet", progress=False, max_error_rate=1.0)
    errors = pq.read_table(tmp_path / "o.parquet", columns=["error"]).column("error").to_pylist()
    assert res.errors == 12 and all(e.startswith("toy-steps: short step") for e in errors)

    t = pq.read_table(solutions)
    bad = tmp_path / "int-error.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("error"), "error", pa.array([0] * t.num_rows)), bad)
    with pytest.raises(InputError, match=r"int-error.parquet: column 'error': expected type string, found int64"):
        run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s2.parquet"))), bad, tmp_path / "o2.parquet",
                  progress=False)
    nulls = tmp_path / "null-error.parquet"  # all-null, typed null (as pandas writes an empty object column)
    pq.write_table(t.set_column(t.schema.get_field_index("error"), "error", pa.nulls(t.num_rows)), nulls)
    run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s3.parquet"), min_length=10_000)), nulls,
              tmp_path / "o3.parquet", progress=False, max_error_rate=1.0)
    assert pq.read_schema(tmp_path / "o3.parquet").field("error").type == pa.string()


# --- D4: an eval report never writes over a shard's own files ------------------------------------------------

def test_eval_report_never_writes_over_a_shards_manifest_parts_or_shard(solutions, tmp_path):
    out = tmp_path / "lab.parquet"
    run_cli("mc-label", solutions, out, *SCRIPTED)
    manifest = tmp_path / "lab.manifest.json"
    before = manifest.read_bytes()
    parts = tmp_path / "other.parquet.parts"
    parts.mkdir()
    (parts / "part-00000.json").write_text('{"rows": 1, "counters": {}}')
    copy = tmp_path / "copy.json"
    copy.write_bytes(before)
    disguised = tmp_path / "shard.json"
    disguised.write_bytes(out.read_bytes())
    refused = {manifest: "is the manifest of the shard", parts / "part-00000.json": "is inside the parts folder",
               parts / "run.json": "is inside the parts folder", copy: "is the manifest of a mc-label shard",
               disguised: "is a Parquet shard"}
    for cmd in (["agreement", out, "--a", "mc_first_error", "--b", "mc_first_error"],
                ["processbench", out, "--pred", "mc_first_error", "--gold", "mc_first_error"]):
        for path, why in refused.items():
            line = one_error_line(run_cli("eval", *cmd, "--json", path, check=False))
            assert f"{path}: {why}" in line
    assert manifest.read_bytes() == before and copy.read_bytes() == before
    assert (parts / "part-00000.json").read_text() == '{"rows": 1, "counters": {}}' and not (parts / "run.json").exists()
    assert "up to date" in run_cli("mc-label", solutions, out, *SCRIPTED).stderr  # provenance intact
    report = tmp_path / "report.json"
    run_cli("eval", "agreement", out, "--a", "mc_first_error", "--b", "mc_first_error", "--json", report)
    run_cli("eval", "agreement", out, "--a", "mc_first_error", "--b", "mc_first_error", "--json", report)
    assert "matrix" in json.loads(report.read_text())  # an earlier report is replaced, as before


# --- D14: a symlink loop is one error line ------------------------------------------------------------------

def test_a_symlink_loop_as_in_or_out_is_one_error_line(solutions, tmp_path):
    loop = tmp_path / "loop.parquet"
    loop.symlink_to(tmp_path / "back.parquet")
    (tmp_path / "back.parquet").symlink_to(loop)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / solutions.name).symlink_to(out_dir / solutions.name)  # OUT/<shard name> points to itself
    loops = {("mc-label", loop, tmp_path / "o.parquet", *SCRIPTED): loop,
             ("mc-label", solutions, loop, *SCRIPTED): loop,
             ("mc-label", solutions, out_dir, *SCRIPTED): out_dir / solutions.name,
             ("rollout", loop, tmp_path / "r.parquet", *SCRIPTED[:4]): loop,
             ("stats", loop): loop,
             ("eval", "processbench", loop, "--pred", "mc_first_error"): loop}
    for args, where in loops.items():
        line = one_error_line(run_cli(*args, check=False))
        assert line == f"error: {where}: is a symlink loop (a link that points back to itself)", args
    with pytest.raises(InputError, match="is a symlink loop"):
        run_stage(ToyStage(ToyConfig(steps_out=str(loop))), solutions, tmp_path / "t.parquet", progress=False)
    broken = tmp_path / "broken.parquet"
    broken.symlink_to(tmp_path / "nowhere.parquet")
    assert "is a broken symlink" in one_error_line(run_cli("mc-label", broken, tmp_path / "b.parquet", *SCRIPTED,
                                                           check=False))


# --- the output lock keeps its holder's pid -------------------------------------------------------------------

def test_a_refused_run_leaves_the_lock_holders_pid(solutions, tmp_path):
    from stepkit.runner import OutputLock

    out = tmp_path / "lab.parquet"
    lock = tmp_path / ".lab.parquet.lock"
    with OutputLock(out):
        assert lock.read_text() == str(os.getpid())
        line = one_error_line(run_cli("mc-label", solutions, out, *SCRIPTED, check=False))
        assert f"another stepkit run is writing this output (pid {os.getpid()}, lock {lock})" in line
        assert lock.read_text() == str(os.getpid())  # the refused run did not truncate it
    assert not lock.exists() and not out.exists()
    run_cli("mc-label", solutions, out, *SCRIPTED)  # the lock is free again
    assert out.exists() and not lock.exists()


# --- D7: parts deleted mid-run are redone -------------------------------------------------------------------

class Deleting(ToyStage):
    """Deletes ``victim`` (OUT.parts or OUT's folder) while it processes chunk ``at`` (calls counted from 0),
    and again at every ``again``-th later call: a user cleaning up mid-run."""

    def __init__(self, cfg, victim, at=2, again=None):
        super().__init__(cfg)
        self.victim, self.at, self.again, self.calls = victim, at, again, 0

    def process(self, rows):
        if self.calls == self.at or (self.again and self.calls > self.at and self.calls % self.again == 0):
            shutil.rmtree(self.victim)
        self.calls += 1
        return super().process(rows)


@pytest.mark.parametrize("victim", ["parts", "folder"])
def test_parts_deleted_mid_run_are_redone(solutions, tmp_path, victim):
    ref = tmp_path / "ref" / "o.parquet"
    run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "ref" / "s.parquet"))), solutions, ref, progress=False)
    out, steps = tmp_path / "run" / "o.parquet", tmp_path / "run" / "s.parquet"
    gone = out.with_name("o.parquet.parts") if victim == "parts" else out.parent
    stage = Deleting(ToyConfig(steps_out=str(steps)), gone, at=3)
    (res,) = run_stage(stage, solutions, out, progress=False)
    assert stage.calls == 6 + 3  # 6 chunks of 2 rows; the 3 committed before the deletion are redone
    assert pq.read_table(out).to_pylist() == pq.read_table(ref).to_pylist()
    assert pq.read_table(steps).to_pylist() == pq.read_table(ref.with_name("s.parquet")).to_pylist()
    m = json.loads(out.with_name("o.manifest.json").read_text())
    assert m["counts"]["rows"] == 12 and m["counts"]["steps"] == json.loads(
        ref.with_name("o.manifest.json").read_text())["counts"]["steps"]
    assert res.resumed_chunks == 0 and not out.with_name("o.parquet.parts").exists()
    assert "up to date" == run_stage(ToyStage(ToyConfig(steps_out=str(steps))), solutions, out,
                                     progress=False)[0].status


def test_parts_that_keep_disappearing_or_vanish_at_the_gather_are_one_line(solutions, tmp_path, monkeypatch):
    import stepkit.runner.shard as runner  # the module that calls _uncommitted_chunks

    out = tmp_path / "o.parquet"
    parts = tmp_path / "o.parquet.parts"
    with pytest.raises(StepkitError, match=r"o.parquet.parts: committed parts of chunks \[.*\] disappeared twice"):
        run_stage(Deleting(ToyConfig(steps_out=str(tmp_path / "s.parquet")), parts, at=1, again=2), solutions, out,
                  progress=False)
    assert not out.exists()

    chunks = runner._uncommitted_chunks

    def then_delete(*args):  # every chunk committed, then one part goes before the gather reads it
        yield from chunks(*args)
        (parts / "part-00004.json").unlink()

    monkeypatch.setattr(runner, "_uncommitted_chunks", then_delete)
    with pytest.raises(StepkitError, match=r"part-00004.json: a committed part disappeared while the shard was "
                                           r"gathered; run the same command again"):
        run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), solutions, out, progress=False)
    monkeypatch.undo()
    (res,) = run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), solutions, out, progress=False)
    assert res.resumed_chunks == 5 and pq.read_table(out).num_rows == 12  # only the chunk that lost a file


def test_a_parts_folder_without_run_json_is_not_blamed_on_the_input(solutions, tmp_path):
    out = tmp_path / "lab.parquet"
    parts = tmp_path / "lab.parquet.parts"
    parts.mkdir()  # as left by a kill right after the folder was made: nothing to keep, the run goes on
    run_cli("mc-label", solutions, out, *SCRIPTED)
    assert out.exists() and not parts.exists()
    out.unlink()
    parts.mkdir()
    (parts / "part-00000.parquet").write_bytes(b"kept")  # parts whose configuration nobody recorded
    line = one_error_line(run_cli("mc-label", solutions, out, *SCRIPTED, check=False))
    assert f"{parts}: partial run without a readable run.json" in line and "--force" in line
    assert "input file changed" not in line
    assert (parts / "part-00000.parquet").read_bytes() == b"kept"


# --- a folder whose shards were made with different settings -------------------------------------------------

def in_process(*args) -> str:
    """Run a light command (stats, eval) in this process; its output (stdout and stderr)."""
    from click.testing import CliRunner

    from stepkit.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


def test_stats_and_eval_warn_when_a_folders_shards_mix_configurations(tmp_path):
    sols = tmp_path / "sols"
    for i in range(2):  # per-shard ingest options (--skip) are not a mixed configuration
        run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", sols / f"s{i}.parquet",
                "--skip", 4 * i, "--limit", "4")

    def toy(inp, out, rank, min_length=0):
        run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / f"{out.name}-steps"), min_length=min_length)), inp,
                  out, rank=rank, world_size=2, progress=False, max_error_rate=1.0)

    same, mixed, lab = tmp_path / "same", tmp_path / "mixed", tmp_path / "lab"
    for rank in (0, 1):  # the same settings on both ranks, then rank 1 with another --min-length
        toy(sols, same, rank)
        toy(sols, mixed, rank, min_length=rank)
    assert "warning" not in in_process("stats", same)
    toy(mixed, lab, 0)  # one uniform run over the mixed folder: the difference is in the lineage
    toy(mixed, lab, 1)
    expected = ("s0.parquet and s1.parquet were made with different settings (toy-steps#2.config.min_length: 0 vs 1),"
                " so figures over this folder mix configurations")
    assert f"warning: {lab}: {expected}" in in_process("stats", lab)

    ranks = tmp_path / "ranks"  # two ranks of mc-label with different -k
    run_cli("mc-label", sols, ranks, *SCRIPTED, "--rank", "0", "--world-size", "2")
    run_cli("mc-label", sols, ranks, *SCRIPTED[:4], "-k", "3", "--no-progress", "--rank", "1", "--world-size", "2")
    line = f"warning: {ranks}: s0.parquet and s1.parquet were made with different settings " \
           "(mc-label.config.continuations: 2 vs 3)"
    assert line in in_process("stats", ranks)
    report = tmp_path / "report.json"
    shown = in_process("eval", "agreement", ranks, "--a", "mc_first_error", "--b", "mc_first_error", "--json", report)
    assert line in shown and shown.count("warning:") == 1
    assert json.loads(report.read_text())["mixed_configuration"].startswith("s0.parquet and s1.parquet")
    shown = in_process("eval", "agreement", same, "--a", "reference_first_error", "--b", "reference_first_error",
                       "--json", report)
    assert "warning" not in shown and "mixed_configuration" not in json.loads(report.read_text())


def test_a_shard_with_two_columns_of_one_name_is_one_line(tmp_path):
    """A shard written by another tool may repeat a column name (pyarrow allows it); which one a stage would
    read is arbitrary, so every stage refuses it in one line (found while building export --format messages:
    a raw KeyError before)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import DATA, run_cli

    src = tmp_path / "s.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", src, "--limit", 1)
    t = pq.read_table(src)
    t = t.append_column("reference_labels", pa.array([[True]] * t.num_rows))
    pq.write_table(t, tmp_path / "d.parquet")
    for args in (("mc-label", "--engine", "scripted", "--model", "scripted", "-k", 2),
                 ("filter", "--rule", "dedupe", "--flag-only")):
        p = run_cli(args[0], tmp_path / "d.parquet", tmp_path / "o.parquet", *args[1:], check=False)
        assert p.returncode == 1 and p.stderr.strip() == (
            f"error: {tmp_path / 'd.parquet'}: column 'reference_labels': the shard has two columns of this name; "
            "rename or drop one"), p.stderr
        assert not (tmp_path / "o.parquet").exists()


class SlowToLoad(ToyStage):
    """A toy stage whose open() takes 100 s of a clock the test moves (a model load, issue 25 item 7)."""

    clock = [0.0]  # seconds added to time.time()

    def loading(self):
        return "a slow toy model"

    def open(self):
        self.clock[0] += 100.0


def test_load_time_is_reported_apart_from_labelling_time(solutions, tmp_path, capsys, monkeypatch):
    from rich.console import Console

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SlowToLoad.clock[0])
    out = tmp_path / "o.parquet"
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    (res,) = run_stage(SlowToLoad(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), solutions, out,
                       progress=True, console=console)
    assert res.load_seconds >= 100 > res.seconds  # the load is not labelling time
    run = json.loads((tmp_path / "o.manifest.json").read_text())["run"]
    assert run["load_seconds"] >= 100 > run["seconds_this_run"]
    assert "toy-steps: loading a slow toy model" in console.file.getvalue()  # the spinner said what loads

    from stepkit.cli.common import print_results

    print_results([res], "toy")
    err = capsys.readouterr().err
    assert "seconds loading (this run)" in err and "seconds labelling (this run)" in err


def test_a_finished_side_output_is_its_runs_however_the_paths_are_typed(solutions, tmp_path, monkeypatch):
    """Breaking run E9: the same finished command with absolute paths, or from another folder, was refused
    ("its steps output is not the one this run wrote"); it is up to date."""
    (tmp_path / "sol.parquet").write_bytes(solutions.read_bytes())
    monkeypatch.chdir(tmp_path)
    (res,) = run_stage(ToyStage(ToyConfig(steps_out="s.parquet")), "sol.parquet", "o.parquet", progress=False)
    assert res.status == "done"
    (res,) = run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), tmp_path / "sol.parquet",
                       tmp_path / "o.parquet", progress=False)
    assert res.status == "up to date"
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    (res,) = run_stage(ToyStage(ToyConfig(steps_out="../s.parquet")), "../sol.parquet", "../o.parquet",
                       progress=False)
    assert res.status == "up to date"
    (tmp_path / "o.parquet").unlink()  # OUT alone gone: its side output is still this command's to replace
    (res,) = run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), tmp_path / "sol.parquet",
                       tmp_path / "o.parquet", progress=False)
    assert res.status == "done"


def test_a_file_side_output_for_a_folder_in_is_refused_like_out(solutions, tmp_path):
    """Breaking run E20: ``--tree-out tree.parquet`` for a folder IN became a folder named tree.parquet."""
    from stepkit.errors import ConfigError

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.parquet").write_bytes(solutions.read_bytes())
    with pytest.raises(ConfigError, match=r"s.parquet: IN .*in is a folder of shards, so the steps output must be a "
                                          "folder too"):
        run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), folder, tmp_path / "out",
                  progress=False)
    assert not (tmp_path / "s.parquet").exists() and not (tmp_path / "out").exists()
