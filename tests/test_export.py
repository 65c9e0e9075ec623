"""stepkit export: every format with explicit features, label rules, null labels, splits by problem, and the
export_trl / parquet_io cases of ../shared/cases/cases.jsonl."""

from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.columns import fields
from stepkit.errors import ConfigError, InputError, StepkitError
from stepkit.schema import REFERENCE_FIELDS, TRAJECTORY_SCHEMA, extend_schema
from stepkit.shards import rows_to_table
from stepkit.stages import mc_label
from stepkit.stages.export import ExportConfig, export
from stepkit.stages.mcts_label import PAIR_SCHEMA
from tests.conftest import run_cli
from tests.test_filter import real_rows

SCHEMA = extend_schema(TRAJECTORY_SCHEMA, REFERENCE_FIELDS + fields(mc_label.COLUMNS))


def write(path, rows, schema=SCHEMA):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows_to_table(rows, schema), path)
    return path


def load(folder, split="train"):
    m = json.loads((folder / "stepkit.manifest.json").read_text())
    files = [str(folder / f) for f in m["splits"][split]["files"]]
    return datasets.load_dataset("parquet", data_files={split: files}, cache_dir=str(folder.parent / "cache"))[split]


def labelled(n=4):
    rows = real_rows(n)
    for r in rows:
        k, m = r["reference_first_error"], len(r["steps"])
        r["mc_label"] = [k == -1 or s < k for s in range(m)]
        r["mc_value"] = [0.75 if x else 0.0 for x in r["mc_label"]]
        r["mc_first_error"] = k
        r["source"] = f"processbench/gsm8k/{r['id'].split('-')[-1]}"
    return rows


def test_case_soft_labels_never_truncated_by_the_trainer(tmp_path, cases):
    case = cases["trl-prm-soft-labels-truncated"]
    row = {**real_rows(1)[0], "id": "case", "prompt": case["input"]["row"]["prompt"],
           "steps": case["input"]["row"]["completions"], "mc_value": case["input"]["row"]["labels"]}
    inp = write(tmp_path / "in.parquet", [row])
    export(inp, tmp_path / "hard", ExportConfig(labels="mc_value"))  # Math-Shepherd hard estimate: value > 0
    ds = load(tmp_path / "hard")
    assert ds.features["labels"] == datasets.List(datasets.Value("bool"))
    assert ds[0]["labels"] == [True, True, True]
    assert ds[0]["soft_labels"] == [1.0, 0.75, 0.125]  # the soft values kept beside them
    assert len(ds[0]["labels"]) == len(ds[0]["completions"])
    export(inp, tmp_path / "half", ExportConfig(labels="mc_value", threshold=0.5))
    assert load(tmp_path / "half")[0]["labels"] == [True, True, False]
    m = json.loads((tmp_path / "half" / "stepkit.manifest.json").read_text())
    assert m["label_rule"] == "hard labels: value > 0.5 of the step values `mc_value` (kept as soft_labels)"
    # soft: the float values survive, typed float32, and the CLI warns about int()
    p = run_cli("export", inp, tmp_path / "soft", "--labels", "mc_value", "--soft")
    assert "PRMTrainer (trl <= 1.13.0, trl.experimental.prm; later trl has none) converts each label with int()" in p.stderr
    soft = load(tmp_path / "soft")
    assert soft.features["labels"] == datasets.List(datasets.Value("float32"))
    assert soft[0]["labels"] == [1.0, 0.75, 0.125]


def test_case_labels_not_cast_back_to_bool(tmp_path, cases):
    case = cases["trl-labels-cast-back-to-bool"]
    r = case["input"]["stepwise_row"]
    row = {**real_rows(1)[0], "id": "case", "prompt": r["prompt"], "steps": r["completions"], "mc_label": r["labels"]}
    export(write(tmp_path / "in.parquet", [row]), tmp_path / "out", ExportConfig(labels="mc_label"))
    ds = load(tmp_path / "out")
    assert ds.features["labels"] == datasets.List(datasets.Value("bool"))
    # what a PRM trainer's tokenisation does: token labels with the ignore index; nothing casts them back
    intended = case["input"]["intended_token_labels"]  # -100 except at each step's last token
    # the fault is real with this datasets: map keeps the column's bool type and -100 becomes True ...
    naive = ds.map(lambda x: {"labels": intended})
    assert naive[0]["labels"] == case["input"]["observed_token_labels"]
    # ... so token labels must declare their features (what the card says); then -100 survives as int64
    token = ds.map(lambda x: {"labels": intended},
                   features=datasets.Features({**ds.features, "labels": datasets.List(datasets.Value("int64"))}))
    assert token.features["labels"] == datasets.List(datasets.Value("int64"))
    assert token[0]["labels"] == intended


def test_hard_and_soft_never_one_dataset(tmp_path):
    rows = labelled(2)
    inp = write(tmp_path / "in.parquet", rows)
    export(inp, tmp_path / "ds", ExportConfig(labels="mc_label"))
    with pytest.raises(ConfigError, match="holds an earlier export; use --force"):
        export(inp, tmp_path / "ds", ExportConfig(labels="mc_value", soft=True))
    assert load(tmp_path / "ds").features["labels"] == datasets.List(datasets.Value("bool"))  # untouched
    export(inp, tmp_path / "ds", ExportConfig(labels="mc_value", soft=True), force=True)  # replaced whole
    assert [p.name for p in (tmp_path / "ds" / "data").iterdir()] == ["train-00000-of-00001.parquet"]
    # a folder of shards whose label column changes type is refused before anything is written
    bool_shard = write(tmp_path / "mixed" / "a.parquet", rows[:1])
    float_schema = pa.schema([f if f.name != "mc_label" else pa.field("mc_label", pa.list_(pa.float32()))
                              for f in SCHEMA])
    write(tmp_path / "mixed" / "b.parquet", [{**rows[1], "mc_label": [1.0] * len(rows[1]["steps"])}], float_schema)
    with pytest.raises(InputError, match="one dataset has one label type"):
        export(bool_shard.parent, tmp_path / "mixed-out", ExportConfig(labels="mc_label"))
    assert not (tmp_path / "mixed-out").exists()
    with pytest.raises(InputError, match="--soft needs step values"):
        export(inp, tmp_path / "x", ExportConfig(labels="mc_label", soft=True))


def test_math_shepherd_processbench_and_first_error_labels(tmp_path):
    rows = labelled(2)
    inp = write(tmp_path / "in.parquet", rows)
    export(inp, tmp_path / "ms", ExportConfig(format="math-shepherd", labels="mc_first_error",
                                              separator_in_step="rejoin"))
    ms = load(tmp_path / "ms")
    r0, k = rows[0], rows[0]["reference_first_error"]
    steps = [" ".join(x.strip() for x in s.split("\n")) for s in r0["steps"]]  # rejoined: one line per step
    assert ms[0]["input"] == r0["prompt"] + " " + "\n".join(f"Step {i + 1}: {s} ки" for i, s in enumerate(steps))
    assert ms[0]["label"] == r0["prompt"] + " " + "\n".join(
        f"Step {i + 1}: {s}" + (" +" if i < k else " -") for i, s in enumerate(steps))
    assert ms[0]["task"] == "GSM8K"  # from source processbench/gsm8k/...
    export(inp, tmp_path / "pb", ExportConfig(format="processbench", labels="mc_label"))
    pb = load(tmp_path / "pb")
    assert set(pb.features) == {"id", "generator", "problem", "steps", "final_answer_correct", "label"}
    assert [x["label"] for x in pb] == [r["reference_first_error"] for r in rows]
    assert [x["final_answer_correct"] for x in pb] == [r["outcome_correct"] for r in rows]
    assert pb.features["label"] == datasets.Value("int32")


def test_pairs_from_an_mcts_pairs_shard(tmp_path):
    steps = real_rows(1)[0]["steps"]
    pair = {"problem_id": "p", "prompt": "Q?", "node_id": "n1", "prefix_steps": steps[:1], "chosen": steps[1:3],
            "rejected": ["A wrong step."], "chosen_node_id": "n2", "rejected_node_id": "n3", "chosen_value": 0.75,
            "rejected_value": 0.0, "chosen_rollouts": 4, "chosen_successes": 3, "rejected_rollouts": 4,
            "rejected_successes": 0}
    inp = write(tmp_path / "pairs.parquet", [pair], PAIR_SCHEMA)
    with pytest.raises(ConfigError, match="drop --labels"):
        ExportConfig(format="pairs", labels="x")
    export(inp, tmp_path / "dpo", ExportConfig(format="pairs"))
    d = load(tmp_path / "dpo")[0]
    # the shard states no separator: the format's \n, between the prompt and each step, opening each side
    assert d["prompt"] == "Q?\n" + steps[0] and d["chosen"] == "\n" + "\n".join(steps[1:3])
    assert d["rejected"] == "\nA wrong step." and d["chosen_value"] == 0.75


def test_null_labels_drop_or_error_and_label_counts_checked(tmp_path):
    rows = labelled(3)
    rows[1]["mc_label"] = None
    rows[2]["mc_label"] = [None] + rows[2]["mc_label"][1:]
    inp = write(tmp_path / "in.parquet", rows)
    m = export(inp, tmp_path / "out", ExportConfig(labels="mc_label"))
    assert m["counts"]["null_labels"] == 2 and m["counts"]["rows_out"] == 1
    with pytest.raises(InputError, match=r"row 1, column 'mc_label': null labels"):
        export(inp, tmp_path / "err", ExportConfig(labels="mc_label", on_null="error"))
    assert not (tmp_path / "err").exists()
    bad = labelled(2)
    bad[1]["mc_label"] = bad[1]["mc_label"][:-1]
    with pytest.raises(InputError, match=r"row 1, column 'mc_label': \d+ labels for \d+ steps"):
        export(write(tmp_path / "bad.parquet", bad), tmp_path / "b", ExportConfig(labels="mc_label"))
    bad[1]["mc_first_error"] = 99
    with pytest.raises(InputError, match="first-error index 99 outside"):
        export(write(tmp_path / "bad2.parquet", bad), tmp_path / "b", ExportConfig(labels="mc_first_error"))
    with pytest.raises(InputError, match="missing --labels column"):
        export(inp, tmp_path / "b", ExportConfig(labels="judge_label"))


def test_test_split_is_by_problem_and_files_are_hub_named(tmp_path):
    rows = []
    for i, r in enumerate(labelled(10)):
        for j in range(2):  # two solutions per problem
            rows.append({**r, "id": f"{r['id']}:{j}", "problem_id": f"p{i}"})
    inp = write(tmp_path / "in.parquet", rows)
    m = export(inp, tmp_path / "out", ExportConfig(labels="mc_label", test_size=0.3, rows_per_file=5))
    train, test = load(tmp_path / "out"), load(tmp_path / "out", "test")
    assert (train.num_rows, test.num_rows) == (14, 6)
    assert not {i.rsplit(":", 1)[0] for i in train["id"]} & {i.rsplit(":", 1)[0] for i in test["id"]}
    assert m["splits"]["train"]["files"] == [f"data/train-0000{i}-of-00003.parquet" for i in range(3)]
    assert m["splits"]["test"]["files"] == ["data/test-00000-of-00002.parquet", "data/test-00001-of-00002.parquet"]
    with pytest.raises(ConfigError, match="nothing left to train on"):
        export(inp, tmp_path / "all", ExportConfig(labels="mc_label", test_size=10))
    with pytest.raises(ConfigError, match="a split name"):
        ExportConfig(labels="mc_label", split="my split")


def test_case_shard_names_never_decide_splits(tmp_path, cases):
    case = cases["local-folder-split-from-filename"]
    rows = labelled(8)
    names = list(case["input"]["folders"]["s1"])  # gsm8k_test-00000-of-00002, math_rollouts-00001-of-00002
    write(tmp_path / "in" / names[0], rows[:3])
    write(tmp_path / "in" / names[1], rows[3:])
    m = export(tmp_path / "in", tmp_path / "out", ExportConfig(labels="mc_label"))
    assert {s: (v["rows"], v["files"]) for s, v in m["splits"].items()} == {
        "train": (case["expected"]["rows_loaded"]["s1"], ["data/train-00000-of-00001.parquet"])}
    run_cli("publish", tmp_path / "out", "--dry-run")
    ds = datasets.load_dataset(str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"))
    assert list(ds) == ["train"] and ds["train"].num_rows == 8  # the card's configs decide, not file names


def test_case_empty_and_null_lists_keep_their_types(tmp_path):
    rows = labelled(4)
    for i, r in enumerate(rows):
        r["problem_id"] = f"p{i}"
    # every file of every split is written with one explicit schema (a one-row test file included)
    m = export(write(tmp_path / "in.parquet", rows), tmp_path / "out", ExportConfig(labels="mc_value", test_size=1))
    schemas = {f: pq.read_schema(tmp_path / "out" / f) for s in m["splits"].values() for f in s["files"]}
    assert len(schemas) == 2 and len({s.remove_metadata().to_string() for s in schemas.values()}) == 1
    assert all(s.field("soft_labels").type == pa.list_(pa.float32()) and s.field("labels").type == pa.list_(pa.bool_())
               for s in schemas.values())
    run_cli("publish", tmp_path / "out", "--dry-run")
    ds = datasets.load_dataset(str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"))
    assert {s: d.num_rows for s, d in ds.items()} == {"train": 3, "test": 1}
    # a split left with no rows (datasets cannot load one) is refused, and nothing is written: the test problems
    # are drawn among the exported ones (breaking run E5), so one exported problem leaves none to train on
    rows[1]["mc_label"] = None
    with pytest.raises(StepkitError, match="takes 1 of 1 problems: nothing left to train on"):
        export(write(tmp_path / "in2.parquet", rows[1:2] + rows[:1]), tmp_path / "out2",
               ExportConfig(labels="mc_label", test_size=1, seed=3))
    assert not (tmp_path / "out2").exists()


def test_case_large_rows_are_written_in_bounded_row_groups(tmp_path, cases):
    assert cases["parquet-nested-string-chunked-read"]["expected"]["round_trip"]
    rows = labelled(3)
    big = "x" * (40 * 1024 * 1024)  # 3 rows of 40 MiB: over the 64 MiB row-group cap together
    for r in rows:
        r["steps"] = [big[: len(big) - i] for i in range(len(r["steps"]))][:1]
        r["mc_label"] = [True]
    export(write(tmp_path / "in.parquet", rows), tmp_path / "out", ExportConfig(labels="mc_label"))
    f = tmp_path / "out" / "data" / "train-00000-of-00001.parquet"
    assert pq.ParquetFile(f).metadata.num_row_groups >= 2
    assert load(tmp_path / "out").num_rows == 3


def test_out_never_replaces_inputs_or_other_folders(tmp_path):
    inp = write(tmp_path / "in" / "a.parquet", labelled(1))
    with pytest.raises(ConfigError, match="would hold or replace an input shard"):
        export(tmp_path / "in", tmp_path / "in", ExportConfig(labels="mc_label"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a stepkit export"):
        export(inp, tmp_path / "other", ExportConfig(labels="mc_label"))
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_flag_only_rows_are_left_out_and_cut_as_filter_would(tmp_path):
    from stepkit.runner import run_stage
    from stepkit.stages.filter import FilterConfig, FilterStage

    rows = labelled(4)
    inp = write(tmp_path / "in.parquet", rows)
    rules = ("status:outcome_correct=True", "truncate-after-first-error:mc_label")
    run_stage(FilterStage(FilterConfig(rule=rules, flag_only=True)), inp, tmp_path / "flag.parquet", progress=False)
    run_stage(FilterStage(FilterConfig(rule=rules, dropped=str(tmp_path / "d.parquet"))), inp,
              tmp_path / "real.parquet", progress=False)
    a = export(tmp_path / "flag.parquet", tmp_path / "a", ExportConfig(labels="mc_label"))
    export(tmp_path / "real.parquet", tmp_path / "b", ExportConfig(labels="mc_label"))
    assert a["counts"]["filtered"] == sum(not r["outcome_correct"] for r in rows)
    assert load(tmp_path / "a").to_list() == load(tmp_path / "b").to_list()  # flagging == filtering, exported


def test_no_signal_rows_have_no_labels_whatever_their_values(tmp_path):
    rows = labelled(2)
    rows[0]["mc_status"], rows[0]["mc_value"] = "no_signal", [0.0] * len(rows[0]["steps"])
    rows[1]["mc_status"] = "ok"
    m = export(write(tmp_path / "in.parquet", rows), tmp_path / "out", ExportConfig(labels="mc_value"))
    assert m["counts"]["null_labels"] == 1 and load(tmp_path / "out")["id"] == [rows[1]["id"]]


def test_cut_rows_keep_correct_labels_and_processbench_refuses_them(tmp_path):
    from stepkit.runner import run_stage
    from stepkit.stages.filter import FilterConfig, FilterStage

    rows = [r for r in labelled(6) if r["reference_first_error"] >= 1][:2]
    inp = write(tmp_path / "in.parquet", rows)
    cut = tmp_path / "cut.parquet"
    run_stage(FilterStage(FilterConfig(rule=("keep-correct-steps:reference_first_error",),
                                       dropped=str(tmp_path / "d.parquet"))), inp, cut, progress=False)
    export(cut, tmp_path / "trl", ExportConfig(labels="reference_first_error"))
    ds = load(tmp_path / "trl")
    assert all(all(r["labels"]) for r in ds)  # every kept step is before the error
    assert [len(r["labels"]) for r in ds] == [r["reference_first_error"] for r in rows]
    with pytest.raises(InputError, match="processbench format describes whole solutions"):
        export(cut, tmp_path / "pb", ExportConfig(format="processbench", labels="reference_first_error"))


def test_the_same_export_again_is_up_to_date(tmp_path):
    inp = write(tmp_path / "in.parquet", labelled(2))
    export(inp, tmp_path / "out", ExportConfig(labels="mc_label"))
    assert export(inp, tmp_path / "out", ExportConfig(labels="mc_label"))["status"] == "up to date"
    p = run_cli("export", inp, tmp_path / "out", "--labels", "mc_label")
    assert "is up to date" in p.stderr
    with pytest.raises(ConfigError, match="use --force"):
        export(inp, tmp_path / "out", ExportConfig(labels="mc_value"))
