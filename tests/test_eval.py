"""eval: ProcessBench F1 on a constructed set (hand-computed), the oracle on real ProcessBench rows, and the
agreement matrix."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.errors import InputError
from stepkit.grading.verdicts import labels_from_first_error
from stepkit.stages.evaluate import agreement_report, processbench_report
from tests.conftest import DATA, run_cli

# split, gold first error, predicted first error (None: missing), number of steps
CONSTRUCTED = [
    ("gsm8k", 2, 2, 4), ("gsm8k", 0, 1, 3), ("gsm8k", 1, None, 3),
    ("gsm8k", -1, -1, 2), ("gsm8k", -1, -1, 5), ("gsm8k", -1, 3, 5),
    ("math", 0, 0, 2), ("math", -1, -1, 3),
    ("math", None, 1, 3),  # no gold label (e.g. flagged inconsistent at import): left out
]


def write(path, rows, extra=None):
    schema = pa.schema([("id", pa.string()), ("source", pa.string()), ("reference_first_error", pa.int32()),
                        ("pred", pa.int32()), ("pred_labels", pa.list_(pa.bool_())), ("error", pa.string()),
                        *(extra or [])])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


@pytest.fixture
def constructed(tmp_path):
    rows = [{"id": str(i), "source": f"processbench/{s}/{i}", "reference_first_error": g, "pred": p,
             "pred_labels": None if p is None else labels_from_first_error(p, m), "error": None}
            for i, (s, g, p, m) in enumerate(CONSTRUCTED)]
    return write(tmp_path / "c.parquet", rows)


def test_hand_computed_f1(constructed):
    r = processbench_report(constructed, "pred")
    g = r["splits"]["gsm8k"]
    # erroneous: gold 2 -> 2 right, 0 -> 1 wrong, 1 -> missing (wrong): 1/3; correct: 2 of 3 say -1
    assert g["acc_erroneous"] == pytest.approx(1 / 3) and g["acc_correct"] == pytest.approx(2 / 3)
    assert g["f1"] == pytest.approx(2 * (1 / 3) * (2 / 3) / (1 / 3 + 2 / 3))  # 4/9
    assert g["missing"] == 1 and g["coverage"] == pytest.approx(5 / 6)
    assert g["f1_answered"] == pytest.approx(2 * (1 / 2) * (2 / 3) / (1 / 2 + 2 / 3))  # 4/7
    assert r["splits"]["math"]["f1"] == 1.0 and r["splits"]["math"]["rows"] == 2
    assert r["no_gold"] == 1
    assert r["average"]["f1"] == pytest.approx((4 / 9 + 1) / 2)
    # step labels read as the first False give the same scores
    assert processbench_report(constructed, "pred_labels")["splits"] == r["splits"]


def test_null_prediction_is_missing_and_a_later_stage_error_hides_nothing(tmp_path):
    rows = [{"id": "a", "source": "processbench/gsm8k/a", "reference_first_error": 1, "pred": None, "error": "judge: engine: x"},
            {"id": "b", "source": "processbench/gsm8k/b", "reference_first_error": 2, "pred": 2,
             "error": "mc-label: no reference_answer"},  # the judge's column was written before mc-label failed
            {"id": "c", "source": "processbench/gsm8k/c", "reference_first_error": -1, "pred": -1, "error": None}]
    r = processbench_report(write(tmp_path / "e.parquet", rows), "pred")["splits"]["gsm8k"]
    assert r["acc_erroneous"] == 0.5 and r["missing"] == 1 and r["f1"] == pytest.approx(2 / 3)


def test_oracle_scores_100_on_real_processbench(tmp_path):
    out = tmp_path / "pb.parquet"
    run_cli("ingest", "processbench", DATA / "processbench" / "gsm8k.json", out)
    t = pq.read_table(out)
    gold = t.column("reference_first_error").to_pylist()
    labels = [labels_from_first_error(g, len(s)) for g, s in zip(gold, t.column("steps").to_pylist())]
    t = t.append_column("oracle_label", pa.array(labels, pa.list_(pa.bool_())))
    t = t.append_column("always_none", pa.array([-1] * t.num_rows, pa.int32()))
    pq.write_table(t, out)
    for col in ("reference_first_error", "oracle_label"):
        r = processbench_report(out, col)
        g = r["splits"]["gsm8k"]
        assert (g["rows"], g["n_erroneous"], g["n_correct"]) == (400, 207, 193)
        assert g["f1"] == 1.0 and g["acc_erroneous"] == 1.0 and g["acc_correct"] == 1.0
    # a labeler that always says "no error" is right on every correct sample and no erroneous one: F1 0
    g = processbench_report(out, "always_none")["splits"]["gsm8k"]
    assert (g["acc_erroneous"], g["acc_correct"], g["f1"]) == (0.0, 1.0, 0.0)


def test_agreement_matrix(tmp_path):
    a = [-1, 0, 2, None, 1]
    b = [-1, 1, 2, 0, None]
    rows = [{"id": str(i), "source": "x", "reference_first_error": x, "pred": y, "error": None}
            for i, (x, y) in enumerate(zip(a, b))]
    r = agreement_report(write(tmp_path / "a.parquet", rows), "reference_first_error", "pred")
    assert r["rows"] == 5 and r["both"] == 3
    assert r["exact"] == pytest.approx(2 / 3) and r["error_vs_none"] == 1.0 and r["kappa"] == pytest.approx(1.0)
    assert (r["a_earlier"], r["b_earlier"], r["a_missing"], r["b_missing"]) == (1, 0, 1, 1)
    assert r["matrix"] == {"-1": {"-1": 1}, "0": {"1": 1}, "1": {"none": 1}, "2": {"2": 1}, "none": {"0": 1}}


def test_bad_columns(constructed, tmp_path):
    with pytest.raises(InputError, match="column 'nope': missing column"):
        processbench_report(constructed, "nope")
    with pytest.raises(InputError, match="column 'source': expected a first-error index"):
        processbench_report(constructed, "source")
    p = run_cli("eval", "agreement", constructed, "--a", "pred", "--b", "id", check=False)
    assert p.returncode == 1 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1
    assert "c.parquet: column 'id'" in p.stderr
    p = run_cli("eval", "processbench", tmp_path / "missing.parquet", "--pred", "pred", check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1


def test_impossible_values_name_row_and_column(tmp_path):
    schema = pa.schema([("id", pa.string()), ("source", pa.string()), ("steps", pa.list_(pa.string())),
                        ("reference_first_error", pa.int32()), ("pred", pa.int32()), ("labels", pa.list_(pa.bool_()))])

    def shard(name, **row):
        base = {"id": name, "source": "processbench/gsm8k/0", "steps": ["a", "b"], "reference_first_error": 0,
                "pred": 0, "labels": [True, False]}
        return pq.write_table(pa.Table.from_pylist([{**base, **row}], schema=schema), tmp_path / f"{name}.parquet") or tmp_path / f"{name}.parquet"

    with pytest.raises(InputError, match=r"row 0, column 'reference_first_error': first-error index -5 outside -1..1"):
        processbench_report(shard("g", reference_first_error=-5), "pred")
    with pytest.raises(InputError, match=r"column 'pred': first-error index 2 outside -1..1"):
        processbench_report(shard("p", pred=2), "pred")
    with pytest.raises(InputError, match=r"column 'labels': 3 labels for 2 steps"):
        processbench_report(shard("l", labels=[True, True, True]), "labels")


def test_folder_checks_kinds_ids_and_unfinished_runs(constructed, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    t = pq.read_table(constructed)
    pq.write_table(t, folder / "a.parquet")
    pq.write_table(t, folder / "b.parquet")
    with pytest.raises(InputError, match=r"b.parquet: row 0, column 'id': duplicate id '0' \(also in a.parquet\)"):
        processbench_report(folder, "pred")
    # the same column as indices in one shard and as step labels in another
    b = t.set_column(t.schema.get_field_index("id"), "id", pa.array([f"b{i}" for i in range(t.num_rows)]))
    b = b.drop(["pred"]).rename_columns([c if c != "pred_labels" else "pred" for c in b.drop(["pred"]).column_names])
    pq.write_table(b, folder / "b.parquet")
    with pytest.raises(InputError, match="b.parquet: column 'pred': holds step labels but a.parquet holds first-error"):
        processbench_report(folder, "pred")
    (folder / "b.parquet").unlink()
    (folder / "c.parquet.parts").mkdir()
    r = processbench_report(folder, "pred")
    assert r["unfinished"] == [str(folder / "c.parquet.parts")]
    p = run_cli("eval", "processbench", folder, "--pred", "pred", check=False)
    assert p.returncode == 0 and "unfinished run(s) in the folder" in p.stdout
    assert p.stderr.count("warning:") == 1 and "1 run(s) not finished (c.parquet.parts)" in p.stderr


def test_empty_label_list_without_steps_is_missing(tmp_path):
    rows = [{"id": "a", "source": "processbench/gsm8k/a", "reference_first_error": -1, "pred_labels": [], "error": None}]
    r = processbench_report(write(tmp_path / "e.parquet", rows), "pred_labels")["splits"]["gsm8k"]
    assert r["missing"] == 1 and r["acc_correct"] == 0


def test_json_report_never_overwrites_a_shard(constructed):
    before = constructed.read_bytes()
    p = run_cli("eval", "processbench", constructed, "--pred", "pred", "--json", constructed, check=False)
    assert p.returncode == 2 and "must end in .json" in p.stderr and constructed.read_bytes() == before
