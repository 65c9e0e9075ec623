"""The architecture's seams (docs/architecture.md): a new stage's wiring, side outputs and side inputs
through kill and resume, typed row errors, configs that refuse bad values, per-engine options."""

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
from click.testing import CliRunner

from stepkit.engines.base import EngineSpec, SamplingConfig, make_engine
from stepkit.errors import ConfigError, InputError, RowError, StepkitError
from stepkit.runner import run_stage
from stepkit.stage import Stage
from tests.conftest import DATA, ROOT, run_cli
from tests.toy_stage import ToyConfig, ToyStage

TOY = [sys.executable, "-m", "tests.toy_stage", "toy-steps"]


@pytest.fixture(scope="module")
def solutions(tmp_path_factory) -> Path:
    """12 real GSM8K model solutions (3 problems x 4 generators)."""
    out = tmp_path_factory.mktemp("sol") / "solutions.parquet"
    run_cli("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", out, "--limit", "3")
    return out


def toy(*args, env=None, check=True):
    p = subprocess.run([*TOY, *map(str, args), "--no-progress"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, **(env or {})}, timeout=120)
    if check and p.returncode:
        raise AssertionError(p.stderr)
    return p


def notes_for(solutions, path, drop=()):
    pids = sorted(set(pq.read_table(solutions, columns=["problem_id"]).column("problem_id").to_pylist()))
    rows = [{"problem_id": p, "note": f"note of {p}"} for p in pids if p not in drop]
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("problem_id", pa.string()), ("note", pa.string())])), path)
    return path


def test_a_new_stage_is_its_module_plus_one_registration_line(solutions, tmp_path, monkeypatch):
    """tests/toy_stage.py holds a whole stage (logic, command, stats/show view); wiring it in is the one
    COMMANDS line below: no shared file has a branch for it."""
    import stepkit.cli as cli

    monkeypatch.setitem(cli.COMMANDS, "toy-steps", ("tests.toy_stage", "Step lengths (a toy stage)."))
    runner = CliRunner()
    out, steps = tmp_path / "toy.parquet", tmp_path / "steps.parquet"
    r = runner.invoke(cli.main, ["toy-steps", str(solutions), str(out), "--steps-out", str(steps), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "toy-steps" in runner.invoke(cli.main, ["--help"]).output
    stats = runner.invoke(cli.main, ["stats", str(out)])
    assert stats.exit_code == 0 and "toy: " in stats.output
    show = runner.invoke(cli.main, ["show", str(out)])
    assert show.exit_code == 0 and "chars" in show.output


@pytest.fixture(scope="module")
def processbench(tmp_path_factory) -> Path:
    """8 real ProcessBench gsm8k rows with human first errors (some rows have an error before their end)."""
    out = tmp_path_factory.mktemp("pb") / "pb.parquet"
    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", out, "--limit", "8")
    return out


def test_a_new_stages_per_step_column_is_cut_by_filter(processbench, tmp_path, monkeypatch):
    """The toy declares ``toy_lengths`` per step in its own module only; ``filter`` reads that from the shard
    and cuts it with the steps (it kept 5 entries for 3 steps when per-step columns were a shared table)."""
    import stepkit.cli as cli

    monkeypatch.setitem(cli.COMMANDS, "toy-steps", ("tests.toy_stage", "Step lengths (a toy stage)."))
    runner = CliRunner()
    toyed, cut = tmp_path / "toy.parquet", tmp_path / "cut.parquet"
    r = runner.invoke(cli.main, ["toy-steps", str(processbench), str(toyed), "--steps-out", str(tmp_path / "s.parquet"),
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli.main, ["filter", str(toyed), str(cut), "--rule",
                                 "truncate-after-first-error:reference_first_error", "--dropped", str(tmp_path / "dropped.parquet"),
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    before = {x["id"]: x for x in pq.read_table(toyed).to_pylist()}
    rows = pq.read_table(cut).to_pylist()
    shortened = [x for x in rows if len(x["steps"]) < len(before[x["id"]]["steps"])]
    assert shortened  # some rows were cut, and each per-step column with them
    for x in rows:
        assert x["toy_lengths"] == [len(t) for t in x["steps"]]
        assert x["toy_lengths"] == before[x["id"]]["toy_lengths"][:len(x["steps"])]


class ScoreStage(Stage):
    """A stage written for this test alone: a 0-10 score per step (its own declaration, no shared edit)."""

    name = "score-steps"
    required_columns = ("id", "steps")

    def __init__(self):
        from stepkit.columns import Column

        self.columns = (
            Column("tscore_score", pa.list_(pa.float32()), "0-10 per step: 10 minus the step's length over 40",
                   per_step=True, role="value", scale="score", range=(0.0, 10.0), status="tscore_status"),
            Column("tscore_status", pa.string(), "ok, or skipped (no labels)", role="status",
                   values=("ok", "skipped"), no_labels=("skipped",)),
        )

    def process(self, rows):
        out = []
        for k, r in enumerate(rows):
            skipped = k == 0  # the first row of each chunk says it has no labels
            scores = [max(0.0, 10.0 - len(t) / 40) for t in r["steps"]]
            out.append({**r, "tscore_score": [0.0] * len(scores) if skipped else scores,
                        "tscore_status": "skipped" if skipped else "ok"})
        return out, {}


def test_a_stage_of_its_own_declares_a_score_and_export_reads_it(processbench, tmp_path):
    """A 0-10 score column declared by a stage that no shared file knows: ``export`` refuses ``--soft`` and
    a hard label without ``--threshold`` on it, honours its status ("skipped": no labels) and, after a
    filter cut, writes labels aligned with the kept steps."""
    scored, cut = tmp_path / "scored.parquet", tmp_path / "cut.parquet"
    run_stage(ScoreStage(), processbench, scored, progress=False, chunk_size=4)
    runner = CliRunner()
    import stepkit.cli as cli

    r = runner.invoke(cli.main, ["export", str(scored), str(tmp_path / "soft"), "--labels", "tscore_score", "--soft"])
    assert r.exit_code == 1 and "0-10 scores" in r.output and "no soft labels" in r.output
    r = runner.invoke(cli.main, ["export", str(scored), str(tmp_path / "hard"), "--labels", "tscore_score"])
    assert r.exit_code == 1 and "--threshold" in r.output
    r = runner.invoke(cli.main, ["filter", str(scored), str(cut), "--rule",
                                 "truncate-after-first-error:reference_first_error", "--dropped", str(tmp_path / "dropped.parquet"),
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "ds"
    r = runner.invoke(cli.main, ["export", str(cut), str(out), "--labels", "tscore_score", "--threshold", "5",
                                 "--on-null", "drop"])
    assert r.exit_code == 0, r.output
    got = {x["id"]: x for x in pq.read_table(next((out / "data").glob("*.parquet"))).to_pylist()}
    rows = pq.read_table(cut).to_pylist()
    assert any(x["filter_cut_by"] for x in rows if x["id"] in got)  # labels of cut rows are checked below
    assert {x["id"] for x in rows if x["tscore_status"] == "ok"} == set(got)  # skipped rows have no labels
    for x in rows:
        if x["id"] in got:
            assert got[x["id"]]["completions"] == x["steps"]
            assert got[x["id"]]["labels"] == [v > 5 for v in x["tscore_score"]]


def test_side_output_is_committed_with_the_parts_and_survives_a_kill(solutions, tmp_path):
    ref, ref_steps = tmp_path / "ref.parquet", tmp_path / "ref-steps.parquet"
    toy(solutions, ref, "--steps-out", ref_steps, "--chunk-size", "1")
    n_steps = sum(len(s) for s in pq.read_table(solutions, columns=["steps"]).column("steps").to_pylist())
    assert pq.read_table(ref_steps).num_rows == n_steps

    out, steps = tmp_path / "out.parquet", tmp_path / "steps.parquet"
    parts = out.with_name(out.name + ".parts")
    proc = subprocess.Popen([*TOY, str(solutions), str(out), "--steps-out", str(steps), "--chunk-size", "1",
                             "--no-progress"], cwd=ROOT, env={**os.environ, "TOY_DELAY": "0.3"},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while len(list(parts.glob("part-*.parquet"))) < 3 and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    committed = len(list(parts.glob("part-*.parquet")))
    assert 3 <= committed < 12 and not out.exists() and not steps.exists()
    assert len(list(parts.glob("steps-*.parquet"))) >= committed  # side rows are written before the part

    toy(solutions, out, "--steps-out", steps, "--chunk-size", "1")
    m = json.loads(out.with_name("out.manifest.json").read_text())
    assert m["run"]["resumed_chunks"] == committed
    assert m["side_outputs"]["steps"] == {"path": str(steps), "rows": n_steps}
    side = pq.read_table(steps).to_pylist()
    assert side == pq.read_table(ref_steps).to_pylist()  # complete, in order, no duplicates
    assert len({(r["id"], r["step_index"]) for r in side}) == n_steps
    side_manifest = json.loads(steps.with_name("steps.manifest.json").read_text())
    assert side_manifest["side_output_of"] == str(out.resolve())
    assert not parts.exists()

    assert "up to date" in toy(solutions, out, "--steps-out", steps, "--chunk-size", "1").stderr
    steps.unlink()  # a finished shard whose side output is gone is not "up to date"
    p = toy(solutions, out, "--steps-out", steps, "--chunk-size", "1", check=False)
    assert p.returncode == 1 and "its steps output" in p.stderr and "missing" in p.stderr


def test_side_output_cannot_overwrite_in_or_out(solutions, tmp_path):
    out = tmp_path / "o.parquet"
    p = toy(solutions, out, "--steps-out", out, check=False)
    assert p.returncode == 1 and "would overwrite" in p.stderr and p.stderr.count("\n") == 1
    p = toy(solutions, out, "--steps-out", solutions, check=False)
    assert p.returncode == 1 and "would overwrite" in p.stderr


def test_side_input_is_joined_by_key(solutions, tmp_path):
    notes = notes_for(solutions, tmp_path / "notes.parquet")
    out = tmp_path / "o.parquet"
    toy(solutions, out, "--steps-out", tmp_path / "s.parquet", "--notes", notes)
    rows = pq.read_table(out).to_pylist()
    assert all(r["toy_note"] == f"note of {r['problem_id']}" for r in rows)
    assert "_notes" not in pq.read_table(out).column_names  # joined rows are handed over, never written
    m = json.loads((tmp_path / "o.manifest.json").read_text())
    assert list(m["identity"]["side_inputs_sha256"]) == ["notes"]


def test_side_input_missing_a_key_is_one_line_before_any_work(solutions, tmp_path):
    first = pq.read_table(solutions, columns=["problem_id"]).column("problem_id")[0].as_py()
    notes = notes_for(solutions, tmp_path / "notes.parquet", drop=(first,))
    out = tmp_path / "o.parquet"
    p = toy(solutions, out, "--steps-out", tmp_path / "s.parquet", "--notes", notes, check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert f"{solutions}: row 0, column 'problem_id': no row with problem_id {first!r} in the notes input" in p.stderr
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()


def test_side_input_with_a_repeated_key_or_that_changed_is_refused(solutions, tmp_path):
    notes = notes_for(solutions, tmp_path / "notes.parquet")
    t = pq.read_table(notes)
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), dup)
    with pytest.raises(InputError, match=r"dup.parquet: row 3, column 'problem_id': duplicate value"):
        run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"), notes=str(dup))), solutions,
                  tmp_path / "o.parquet", progress=False)
    cfg = ToyConfig(steps_out=str(tmp_path / "s.parquet"), notes=str(notes))
    run_stage(ToyStage(cfg), solutions, tmp_path / "o.parquet", progress=False)
    pq.write_table(t.set_column(1, "note", pa.array(["changed"] * t.num_rows)), notes)
    with pytest.raises(ConfigError, match="a side input changed"):
        run_stage(ToyStage(cfg), solutions, tmp_path / "o.parquet", progress=False)


def test_row_errors_are_attributed_by_type(solutions, tmp_path):
    stage = ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"), min_length=10_000))
    (res,) = run_stage(stage, solutions, tmp_path / "o.parquet", progress=False, max_error_rate=1.0)
    errors = pq.read_table(tmp_path / "o.parquet", columns=["error"]).column("error").to_pylist()
    assert res.errors == 12 and all(e.startswith("toy-steps: short step: ") for e in errors)
    assert not any(isinstance(e, RowError) for e in errors)  # written as plain text

    class Sloppy(ToyStage):  # writes a string where a RowError belongs: it would never be counted
        def process(self, rows):
            out, counters, side = super().process(rows)
            out[0]["error"] = "toy-steps: oops"
            return out, counters, side

    with pytest.raises(StepkitError, match="plain-string error"):
        run_stage(Sloppy(ToyConfig(steps_out=str(tmp_path / "s2.parquet"))), solutions, tmp_path / "o2.parquet",
                  progress=False)


def test_undeclared_side_output_is_an_internal_error(solutions, tmp_path):
    class Undeclared(Stage):
        name = "undeclared"

        def process(self, rows):
            return rows, {}, {"tree": [{"x": 1}]}

    with pytest.raises(StepkitError, match="undeclared side output"):
        run_stage(Undeclared(), solutions, tmp_path / "o.parquet", progress=False)


def test_configs_refuse_bad_values_from_any_source():
    from stepkit.stages.judge import JudgeConfig
    from stepkit.stages.mc_label import MCLabelConfig

    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ConfigError, match="--temperature"):
            SamplingConfig(temperature=bad)
    with pytest.raises(ConfigError, match="--seed must be <= 4294967295"):
        SamplingConfig(seed=2**32)
    with pytest.raises(ConfigError, match="--continuations must be >= 1"):
        MCLabelConfig(continuations=0)
    with pytest.raises(ConfigError, match="--mode must be one of exhaustive, binary"):
        MCLabelConfig(mode="tree")
    with pytest.raises(ConfigError, match="--votes must be >= 1"):
        JudgeConfig(votes=0)


def test_engine_options_belong_to_one_engine(solutions, tmp_path):
    with pytest.raises(ConfigError, match="engine scripted has no option 'concurrency'"):
        make_engine("scripted", "scripted:echo", concurrency=4)
    with pytest.raises(ConfigError, match="--engine openai needs --base-url"):
        EngineSpec("openai", "m")
    ident = EngineSpec("openai", "m", 0, {"base_url": "http://127.0.0.1:1/v1", "concurrency": 8}).identity()
    assert "base_url" not in ident and "concurrency" not in ident and ident["per_request_seed"] is False
    p = run_cli("mc-label", solutions, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:echo",
                "--concurrency", "4", check=False)
    assert p.returncode == 2 and "--concurrency is an option of --engine openai" in p.stderr
    p = run_cli("mc-label", solutions, tmp_path / "o.parquet", "--engine", "scripted", "--model", "scripted:echo",
                "--temperature", "nan", check=False)
    assert p.returncode == 2 and "not a finite number" in p.stderr


def test_show_and_stats_print_text_as_written(tmp_path):
    """Step text is data: rich markup in it is shown, never interpreted (and never crashes)."""
    steps = ["Take \\sqrt[n]{x} and [bold]this[/bold].", "[asy]draw((0,0));[/asy] then [/] closes.",
             "The answer is 3."]
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"prompt": "[red]Q[/red]?", "steps": steps, "reference": "3"}) + "\n")
    shard = tmp_path / "t.parquet"
    run_cli("ingest", "jsonl", src, shard, "--reference-col", "reference")
    out = tmp_path / "l.parquet"
    run_cli("mc-label", shard, out, "--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--no-progress")
    show = run_cli("show", out)
    flat = " ".join(show.stdout.split())
    for text in ("\\sqrt[n]{x}", "[bold]this[/bold]", "[asy]draw((0,0));[/asy]", "[/] closes", "[red]Q[/red]?"):
        assert text in flat, text
    stats = run_cli("stats", out)
    assert "first error" in stats.stdout and "MC value by step position" in stats.stdout


# --- found by a breaking session ----------------------------------------------------------------------

def test_outputs_never_overwrite_a_side_input(solutions, tmp_path):
    notes = notes_for(solutions, tmp_path / "notes.parquet")
    before = notes.read_bytes()
    for args in (("--steps-out", notes, "--notes", notes), ("--steps-out", tmp_path / "s.parquet", "--notes", notes)):
        out = notes if args[0] == "--steps-out" and args[1] != notes else tmp_path / "o.parquet"
        p = toy(solutions, out, *args, "--force", check=False)
        assert p.returncode == 1 and ("side input" in p.stderr), p.stderr
        assert notes.read_bytes() == before


def test_a_side_output_never_replaces_a_file_it_did_not_write(solutions, tmp_path):
    shared = tmp_path / "steps.parquet"
    toy(solutions, tmp_path / "a.parquet", "--steps-out", shared)
    before = shared.read_bytes()
    p = toy(solutions, tmp_path / "b.parquet", "--steps-out", shared, check=False)
    assert p.returncode == 1 and "is not the steps output of" in p.stderr and shared.read_bytes() == before
    assert "up to date" in toy(solutions, tmp_path / "a.parquet", "--steps-out", shared).stderr


def test_side_outputs_are_part_of_the_identity(solutions, tmp_path):
    class Fewer(ToyStage):
        def side_outputs(self):
            return {}

        def process(self, rows):
            return super().process(rows)[:2]

    cfg = ToyConfig(steps_out=str(tmp_path / "s.parquet"))
    run_stage(ToyStage(cfg), solutions, tmp_path / "o.parquet", progress=False)
    with pytest.raises(ConfigError, match=r"side outputs \['steps'\] -> \[\]"):
        run_stage(Fewer(cfg), solutions, tmp_path / "o.parquet", progress=False)


def test_plain_string_error_on_a_row_changed_in_place_is_caught(solutions, tmp_path):
    class InPlace(ToyStage):
        def process(self, rows):
            out, counters, side = super().process(rows)
            rows[0]["error"] = out[0]["error"] = "oops"  # mutates the input row too
            return out, counters, side

    with pytest.raises(StepkitError, match="plain-string error"):
        run_stage(InPlace(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), solutions, tmp_path / "o.parquet",
                  progress=False)


def test_a_locked_output_is_refused_before_the_model_loads(solutions, tmp_path):
    from stepkit.runner import OutputLock

    class Opens(ToyStage):
        opened = False

        def open(self):
            Opens.opened = True

    out = tmp_path / "o.parquet"
    with OutputLock(out):
        with pytest.raises(ConfigError, match="another stepkit run is writing this output"):
            run_stage(Opens(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), solutions, out, progress=False)
    assert not Opens.opened


def test_finished_shard_is_found_from_its_parquet_metadata_and_leftover_parts_are_removed(solutions, tmp_path):
    out = tmp_path / "o.parquet"
    cfg = ToyConfig(steps_out=str(tmp_path / "s.parquet"))
    run_stage(ToyStage(cfg), solutions, out, progress=False)
    (tmp_path / "o.manifest.json").unlink()  # as if killed between the two writes of an older version
    (tmp_path / "o.parquet.parts").mkdir()  # as if killed before the parts were removed
    (res,) = run_stage(ToyStage(cfg), solutions, out, progress=False)
    assert res.status == "up to date" and not (tmp_path / "o.parquet.parts").exists()


def test_error_rate_message_names_only_this_stages_reasons(solutions, tmp_path):
    t = pq.read_table(solutions)
    errs = ["rollout: engine: boom"] * 6 + [None] * (t.num_rows - 6)
    src = tmp_path / "up.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("error"), "error", pa.array(errs, pa.string())), src)
    with pytest.raises(StepkitError) as e:
        run_stage(ToyStage(ToyConfig(steps_out=str(tmp_path / "s.parquet"), min_length=10_000)), src,
                  tmp_path / "o.parquet", progress=False)
    assert "6 of 12 rows failed (short step: 6)" in str(e.value) and "engine" not in str(e.value)


def test_a_stage_row_that_does_not_fit_its_schema_is_an_internal_error(solutions, tmp_path):
    class Bad(ToyStage):
        def process(self, rows):
            out, counters, side = super().process(rows)
            side["steps"][0]["length"] = "long"
            return out, counters, side

    with pytest.raises(StepkitError, match=r"toy-steps: internal error, its steps output does not fit its schema"):
        run_stage(Bad(ToyConfig(steps_out=str(tmp_path / "s.parquet"))), solutions, tmp_path / "o.parquet",
                  progress=False)


def test_recipe_int_and_flag_float_are_one_configuration(tmp_path):
    problems = tmp_path / "p.parquet"
    run_cli("ingest", "gsm8k", DATA / "gsm8k" / "test.jsonl", problems, "--limit", "2")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("temperature: 1\nsamples: 2\n")
    common = ["--engine", "scripted", "--model", "scripted:echo", "--no-progress"]
    run_cli("rollout", problems, tmp_path / "o.parquet", *common, "--recipe", recipe)
    p = run_cli("rollout", problems, tmp_path / "o.parquet", *common, "-n", "2", "--temperature", "1")
    assert "up to date" in p.stderr


@pytest.mark.parametrize("split", ["a{4294967296}", "(" * 3000 + ")" * 3000, "x*", ""])
def test_split_regexes_that_cannot_split_are_one_line(split, tmp_path):
    p = run_cli("ingest", "jsonl", tmp_path / "none.jsonl", tmp_path / "o.parquet", "--split", split, check=False)
    assert p.returncode in (1, 2) and "Traceback" not in p.stderr and ("regex" in p.stderr or "split" in p.stderr)


def test_option_bounds_and_templates_without_a_mode(solutions, tmp_path):
    common = ["--engine", "scripted", "--model", "scripted:echo"]
    p = run_cli("mc-label", solutions, tmp_path / "o.parquet", *common, "-k", "100000", check=False)
    assert p.returncode == 2 and "-k" in p.stderr
    tmpl = tmp_path / "t.yaml"
    tmpl.write_text("version: mine\nuser: 'Judge {problem} {steps}'\n")
    p = run_cli("judge", solutions, tmp_path / "j.parquet", "--engine", "scripted", "--model", "scripted:judge",
                "--mode", "per-step", "--template", tmpl, check=False)
    assert p.returncode == 2 and "has no 'mode' key" in p.stderr and "mode: per-step" in p.stderr
    with pytest.raises(ConfigError, match="--seed"):
        EngineSpec("scripted", "scripted:echo", -1)
    with pytest.raises(ConfigError, match="--temperature must be a finite number"):
        SamplingConfig(temperature=10**400)


# --- found by a new-user trial -----------------------------------------------------------------------------

def test_a_changed_setting_is_named_by_its_own_key_and_scripted_models_need_their_engine(solutions, tmp_path):
    common = ["--engine", "scripted", "--model", "scripted:echo", "-k", "2", "--no-progress"]
    run_cli("mc-label", solutions, tmp_path / "o.parquet", *common)
    p = run_cli("mc-label", solutions, tmp_path / "o.parquet", *common, "--temperature", "0.5", check=False)
    assert p.returncode == 1 and "sampling.temperature 0.8 -> 0.5" in p.stderr and "top_p" not in p.stderr
    p = run_cli("mc-label", solutions, tmp_path / "x.parquet", "--model", "scripted:echo", check=False)
    assert p.returncode == 2 and "add --engine scripted" in p.stderr


def test_help_texts_name_every_column_they_promise():
    """`show --help` lists every stage's status column with its declared values; `clue recover/score --help`
    name every column they write (the columns' declarations are the truth, the help text follows them)."""
    import importlib
    import pkgutil

    import stepkit.stages
    from stepkit import cli
    from stepkit.columns import Column

    declared = []
    for m in pkgutil.iter_modules(stepkit.stages.__path__):
        mod = importlib.import_module(f"stepkit.stages.{m.name}")
        for value in vars(mod).values():
            if isinstance(value, tuple) and value and all(isinstance(c, Column) for c in value):
                declared += [c for c in value if c.role == "status"]
    assert {c.name for c in declared} >= {"mc_status", "judge_status", "clue_status", "check_status"}
    runner = CliRunner()
    show = " ".join(runner.invoke(cli.main, ["show", "--help"], terminal_width=400).output.split())
    for c in declared:
        assert c.name in show, c.name
        for v in c.values or ():
            assert v in show, (c.name, v)
    from stepkit.stages.clue_recover import RECOVER_COLUMNS
    from stepkit.stages.clue_score import SCORE_COLUMNS
    for sub, columns in (("recover", RECOVER_COLUMNS), ("score", SCORE_COLUMNS)):
        text = runner.invoke(cli.main, ["clue", sub, "--help"], terminal_width=400).output
        assert [c.name for c in columns if c.name not in text] == [], sub
