"""Defects a breaking session found in filter / export / publish, each as a test (real ProcessBench rows)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.errors import ConfigError, InputError, StepkitError
from stepkit.runner import OutputLock, run_stage
from stepkit.stages.export import ExportConfig, export
from stepkit.stages.filter import FilterConfig, FilterStage
from stepkit.stages.mcts_label import PAIR_SCHEMA
from stepkit.stages.publish import PublishConfig, publish
from tests.conftest import run_cli
from tests.hub_server import FakeHub, hub_env
from tests.test_export import SCHEMA, labelled, load, write

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


def filt(inp, out, *rules, **kw):
    kw.setdefault("dropped", str(out.with_name(out.stem + "-dropped.parquet")))
    force = kw.pop("force", False)
    return run_stage(FilterStage(FilterConfig(rule=rules, **kw)), inp, out, progress=False, force=force)


def test_a_failed_force_run_keeps_the_finished_output_and_side_output(tmp_path):
    good = write(tmp_path / "good.parquet", labelled(3))
    out = tmp_path / "out.parquet"
    filt(good, out, "dedupe")
    before = out.read_bytes(), out.with_name("out-dropped.parquet").read_bytes()
    bad_rows = labelled(2)
    bad_rows[1]["mc_label"] = bad_rows[1]["mc_label"][:-1]
    bad = write(tmp_path / "bad.parquet", bad_rows)
    with pytest.raises(InputError):
        filt(bad, out, "dedupe", force=True)
    assert (out.read_bytes(), out.with_name("out-dropped.parquet").read_bytes()) == before


def test_a_side_output_in_use_by_another_run_is_refused(tmp_path):
    inp = write(tmp_path / "in.parquet", labelled(2))
    shared = tmp_path / "dropped.parquet"
    with OutputLock(shared):  # another run is writing its own --dropped here
        with pytest.raises(ConfigError, match="another stepkit run is writing this output"):
            filt(inp, tmp_path / "b.parquet", "dedupe", dropped=str(shared))


def test_filter_rules_refuse_silent_drops(tmp_path):
    rows = labelled(4)
    rows[0]["mc_value"] = [float("nan")] + [0.9] * (len(rows[0]["steps"]) - 1)
    rows[1]["mc_value"] = [0.9] * (len(rows[1]["steps"]) - 1) + [float("nan")]
    inp = write(tmp_path / "in.parquet", rows[:2])
    filt(inp, tmp_path / "v.parquet", "min-value:mc_value>=0.5")  # NaN is null wherever it sits
    assert len(pq.read_table(tmp_path / "v.parquet")) == 2
    inp = write(tmp_path / "in4.parquet", rows)
    with pytest.raises(ConfigError, match="no input row has mc_status okk, .*okk is not a value mc_status declares .*a typo would drop"):
        filt(inp, tmp_path / "s.parquet", "status:mc_status=okk")
    filt(inp, tmp_path / "b.parquet", "status:outcome_correct=true")  # typed: true reads as a bool
    assert len(pq.read_table(tmp_path / "b.parquet")) == sum(r["outcome_correct"] for r in rows)
    with pytest.raises(InputError, match="is not a bool value"):
        filt(inp, tmp_path / "c.parquet", "status:outcome_correct=yes")
    with pytest.raises(InputError, match="compares a whole cell, found a list column"):
        filt(inp, tmp_path / "d.parquet", "status:mc_value=0")
    with pytest.raises(ConfigError, match="with itself"):
        FilterConfig(rule=("consensus:mc_label,mc_label",), flag_only=True)
    rows[2]["steps"] = None
    with pytest.raises(InputError, match="row 2, column 'steps': null or empty steps"):
        filt(write(tmp_path / "n.parquet", rows, SCHEMA.set(SCHEMA.get_field_index("steps"),
                                                                pa.field("steps", pa.list_(pa.string())))),
             tmp_path / "e.parquet", "dedupe")


def test_a_later_filter_applies_the_cuts_a_flag_only_run_left_pending(tmp_path):
    rows = [r for r in labelled(8) if r["reference_first_error"] >= 1][:2]
    inp = write(tmp_path / "in.parquet", rows)
    filt(inp, tmp_path / "f.parquet", "truncate-after-first-error:mc_label", flag_only=True, dropped=None)
    filt(tmp_path / "f.parquet", tmp_path / "g.parquet", "no-error")
    got = pq.read_table(tmp_path / "g.parquet").to_pylist()
    assert [len(r["steps"]) for r in got] == [r["reference_first_error"] + 1 for r in rows]
    assert all(r["filter_cut_by"] == "truncate-after-first-error:mc_label" for r in got)


def test_export_refuses_wrong_types_and_bad_rows_in_one_line(tmp_path):
    rows = labelled(2)
    as_text = pa.schema([pa.field("steps", pa.string()) if f.name == "steps" else f for f in SCHEMA])
    with pytest.raises(InputError, match="column 'steps': expected type list<item: string>, found string"):
        export(write(tmp_path / "s.parquet", [{**r, "steps": "\n".join(r["steps"])} for r in rows], as_text),
               tmp_path / "o", ExportConfig(labels="mc_first_error"))
    int_id = pa.schema([pa.field("id", pa.int64()) if f.name == "id" else f for f in SCHEMA])
    with pytest.raises(InputError, match="column 'id': expected type string"):
        export(write(tmp_path / "i.parquet", [{**r, "id": k} for k, r in enumerate(rows)], int_id), tmp_path / "o",
               ExportConfig(labels="mc_label"))
    dup = [rows[0], {**rows[1], "id": rows[0]["id"]}]
    with pytest.raises(InputError, match="row 1, column 'id': duplicate id"):
        export(write(tmp_path / "d.parquet", dup), tmp_path / "o", ExportConfig(labels="mc_label"))
    tagged = [{**rows[0], "prompt": rows[0]["prompt"] + " ки"}]
    with pytest.raises(InputError, match="column 'prompt': holds 'ки': Math-Shepherd's step tag"):
        export(write(tmp_path / "t.parquet", tagged), tmp_path / "o", ExportConfig(format="math-shepherd",
                                                                                 labels="mc_label"))
    # TRL's converter reads every "ки" as a tag, inside a word too ("кино"): refused, naming the step
    russian = [{**rows[0], "steps": ["Покупки стоят 5 рублей, кино 3."] + rows[0]["steps"][1:]}]
    with pytest.raises(InputError, match=r"column 'steps': holds 'ки' \(step 0\)"):
        export(write(tmp_path / "r.parquet", russian), tmp_path / "ru", ExportConfig(format="math-shepherd",
                                                                                   labels="mc_label"))
    export(write(tmp_path / "r2.parquet", [{**rows[0], "steps": ["Билет стоит 5 рублей, фильм 3."]
                                            + rows[0]["steps"][1:]}]), tmp_path / "ru", ExportConfig(
        format="math-shepherd", labels="mc_label", separator_in_step="rejoin"))  # Cyrillic without the tag
    pairs = pa.schema([pa.field("chosen", pa.string()) if f.name == "chosen" else f for f in PAIR_SCHEMA])
    pq.write_table(pa.Table.from_pylist([{"prompt": "Q", "prefix_steps": [], "chosen": "one step",
                                          "rejected": ["x"]}], schema=pairs), tmp_path / "p.parquet")
    with pytest.raises(InputError, match="column 'chosen': expected a list of step strings"):
        export(tmp_path / "p.parquet", tmp_path / "o", ExportConfig(format="pairs"))


def test_test_split_needs_problem_ids_in_every_shard(tmp_path):
    rows = labelled(4)
    no_pid = pa.schema([f for f in SCHEMA if f.name != "problem_id"])
    write(tmp_path / "mix" / "a.parquet", rows[:2], no_pid)
    write(tmp_path / "mix" / "b.parquet", rows[2:])
    with pytest.raises(InputError, match="a.parquet: column 'problem_id': has no problem_id column"):
        export(tmp_path / "mix", tmp_path / "o", ExportConfig(labels="mc_label", test_size=0.5))
    export(tmp_path / "mix", tmp_path / "o", ExportConfig(labels="mc_label"))  # no split: fine


def test_export_into_the_current_folder(tmp_path, monkeypatch):
    inp = write(tmp_path / "in.parquet", labelled(2))
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    export(inp, ".", ExportConfig(labels="mc_label"))
    assert (tmp_path / "here" / "data" / "train-00000-of-00001.parquet").exists()
    publish(".", PublishConfig(dry_run=True))
    assert (tmp_path / "here" / "README.md").exists()


def test_publish_refuses_tampered_folders_and_bad_repo_ids(tmp_path):
    rows = labelled(4)
    export(write(tmp_path / "a.parquet", rows), tmp_path / "a", ExportConfig(labels="mc_label"))
    export(write(tmp_path / "b.parquet", rows[:2]), tmp_path / "b", ExportConfig(labels="mc_label"))
    f = "data/train-00000-of-00001.parquet"
    (tmp_path / "a" / f).write_bytes((tmp_path / "b" / f).read_bytes())  # swapped in from another export
    with pytest.raises(ConfigError, match="not the file the export wrote"):
        publish(tmp_path / "a", PublishConfig(dry_run=True))
    m = json.loads((tmp_path / "b" / "stepkit.manifest.json").read_text())
    del m["splits"]
    (tmp_path / "b" / "stepkit.manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match="damaged"):
        publish(tmp_path / "b", PublishConfig(dry_run=True))
    for bad in ("org/my dataset", "org/..", "org/a--b"):
        with pytest.raises(ConfigError, match="not a Hub repository id"):
            PublishConfig(repo_id=bad, dry_run=True)
    # a publish killed earlier left its staging folder: the next one removes it (its pid is gone)
    stale = tmp_path / ".b.publish-999999999"
    stale.mkdir()
    assert not os.path.exists("/proc/999999999")
    export(write(tmp_path / "b.parquet", rows[:2]), tmp_path / "b", ExportConfig(labels="mc_label"), force=True)
    publish(tmp_path / "b", PublishConfig(dry_run=True))
    assert not stale.exists()


def test_retry_after_is_capped_and_other_upload_errors_are_one_line(monkeypatch, tmp_path):
    import stepkit.stages.publish as pub

    waits = []
    monkeypatch.setattr(pub.time, "sleep", waits.append)
    export(write(tmp_path / "a.parquet", labelled(2)), tmp_path / "a", ExportConfig(labels="mc_label"))
    with FakeHub(tokens={"hf_test"}) as hub:
        hub_env(monkeypatch, hub, tmp_path / "hf-home")
        hub.fail_next("commit", status=429, times=1, retry_after=3600)
        publish(tmp_path / "a", PublishConfig(repo_id="org/ds", retry_wait=0.0))
        assert waits == [pub.MAX_WAIT]
    assert load(tmp_path / "a").num_rows == 2
    with pytest.raises(StepkitError, match=r"the thing failed \(RuntimeError: Error while uploading"):
        pub.with_retries(lambda: (_ for _ in ()).throw(RuntimeError("Error while uploading x")), "the thing",
                         PublishConfig(dry_run=True), "http://hub")



def test_status_typo_check_is_over_the_whole_folder(tmp_path):
    """A shard with no row of the value is no typo when another shard of the folder has it."""
    rows = labelled(4)
    for r in rows[:2]:
        r["mc_status"] = "ok"
    for r in rows[2:]:
        r["mc_status"] = "no_signal"
    folder = tmp_path / "in"
    folder.mkdir()
    write(folder / "a.parquet", rows[:2])
    write(folder / "b.parquet", rows[2:])
    out = tmp_path / "out"
    run_stage(FilterStage(FilterConfig(rule=("status:mc_status=no_signal",), flag_only=True)), folder, out,
              progress=False)
    flags = [r["filter_reason"] for p in sorted(out.glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert flags == ["status", "status", None, None]
    with pytest.raises(ConfigError, match="no input row has mc_status okk"):
        run_stage(FilterStage(FilterConfig(rule=("status:mc_status=okk",), flag_only=True)), folder,
                  tmp_path / "out2", progress=False)


def _ids(folder):
    return sorted(r["id"] for p in sorted(folder.glob("*.parquet")) for r in pq.read_table(p).to_pylist())


def test_dedupe_acts_across_the_shards_of_a_folder(tmp_path):
    """Breaking run E6: a row in two shards of a folder IN survived dedupe twice."""
    rows = labelled(4)
    write(tmp_path / "dup" / "a.parquet", rows)
    write(tmp_path / "dup" / "b.parquet", rows)  # the same rows again, ids and all
    run_cli("filter", tmp_path / "dup", tmp_path / "kept", "--rule", "dedupe", "--dropped", tmp_path / "drop",
            "--no-progress")
    assert _ids(tmp_path / "kept") == sorted(r["id"] for r in rows)  # the first of equal rows: shard a's
    assert len(pq.read_table(tmp_path / "kept" / "b.parquet")) == 0
    assert {r["filter_reason"] for r in pq.read_table(tmp_path / "drop" / "b.parquet").to_pylist()} == {"dedupe"}
    # dedupe after another rule: a's copy dropped by no-error leaves b's copy as the first kept one
    errs = [dict(r, error="rollout: engine failed" if i == 0 else None) for i, r in enumerate(rows)]
    write(tmp_path / "dup2" / "a.parquet", errs)
    write(tmp_path / "dup2" / "b.parquet", [dict(r, id=r["id"] + "-copy") for r in rows])
    run_cli("filter", tmp_path / "dup2", tmp_path / "kept2", "--rule", "no-error", "--rule", "dedupe",
            "--dropped", tmp_path / "drop2", "--no-progress")
    assert rows[0]["id"] not in _ids(tmp_path / "kept2")
    assert [r["id"] for r in pq.read_table(tmp_path / "kept2" / "b.parquet").to_pylist()] == [rows[0]["id"] + "-copy"]


def test_prof_removes_per_problem_across_the_shards_of_a_folder(tmp_path):
    """E6: a problem whose rows span two shards lost --remove N rows in each; now as if in one shard."""
    rows = labelled(8)
    for i, r in enumerate(rows):
        r["problem_id"] = f"P{i % 2}"
        r["mc_value"] = [round(0.1 * ((i * 7 + s) % 10), 2) for s in range(len(r["steps"]))]
    one = write(tmp_path / "one.parquet", rows)
    write(tmp_path / "two" / "a.parquet", rows[:3])
    write(tmp_path / "two" / "b.parquet", rows[3:])
    args = ["--rule", "prof:mc_value", "--remove", "2", "--no-progress"]
    run_cli("filter", one, tmp_path / "one-kept.parquet", "--dropped", tmp_path / "one-drop.parquet", *args)
    run_cli("filter", tmp_path / "two", tmp_path / "two-kept", "--dropped", tmp_path / "two-drop", *args)
    dropped_one = sorted(r["id"] for r in pq.read_table(tmp_path / "one-drop.parquet").to_pylist())
    assert len(dropped_one) == 4  # two per problem
    assert _ids(tmp_path / "two-drop") == dropped_one
