"""ingest on the real files in ../shared/data, plus generic jsonl with column mapping and bad input."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.errors import InputError
from stepkit.grading.verify import checker_settings
from stepkit.schema import TRAJECTORY_SCHEMA
from stepkit.stages.ingest import IngestOptions, first_error_status, ingest, ratings_to_labels
from tests.conftest import DATA, run_cli


def rows_of(path):
    return pq.read_table(path).to_pylist()


def test_gsm8k_problems(tmp_path, checker):
    out = tmp_path / "p.parquet"
    m = ingest("gsm8k", DATA / "gsm8k" / "test.jsonl", out, IngestOptions(limit=5), checker, checker_settings())
    rows = rows_of(out)
    assert len(rows) == 5 == m["counts"]["rows"]
    assert rows[0]["reference_answer"] == "18" and rows[0]["problem_id"] == "gsm8k-test-0"
    assert rows[0]["reference_steps"][0] == "Janet sells 16 - 3 - 4 = 9 duck eggs a day."  # <<..>> stripped
    assert not any("<<" in s for r in rows for s in r["reference_steps"])
    assert not any(s.startswith("####") for r in rows for s in r["reference_steps"])


def test_gsm8k_solutions_outcome_matches_the_file(tmp_path, checker):
    out = tmp_path / "s.parquet"
    m = ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", out,
               IngestOptions(limit=150), checker, checker_settings())
    rows = rows_of(out)
    assert len(rows) == 600  # one row per generator
    assert {r["generator"] for r in rows} == {"6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"}
    assert m["counts"]["agree_with_source"] == 600  # recomputed outcome == the file's is_correct
    r0 = rows[0]
    assert r0["id"] == "gsm8k-test-0:6b_finetuning" and r0["step_separator"] == "\n"
    assert r0["steps"][-1] == "A: 26" and r0["final_answer"] == "26" and r0["outcome_correct"] is False
    assert pq.read_schema(out).field("steps").type == TRAJECTORY_SCHEMA.field("steps").type


def test_gsm8k_solutions_degenerate_rows_have_null_answer(tmp_path, checker):
    # The 11 degenerate GPT-3 solutions (repetitions, no answer line): null final answer, incorrect.
    src = DATA / "gsm8k" / "example_model_solutions.jsonl"
    lines = src.read_text().splitlines()
    picked = [i for i, line in enumerate(lines)
              if any("A:" not in v["solution"] for k, v in json.loads(line).items() if isinstance(v, dict))][:3]
    assert picked, "the file has solutions with no answer line"
    sub = tmp_path / "sub.jsonl"
    sub.write_text("\n".join(lines[i] for i in picked) + "\n")
    out = tmp_path / "s.parquet"
    m = ingest("gsm8k-solutions", sub, out, IngestOptions(), checker, checker_settings())
    rows = [r for r in rows_of(out) if r["final_answer"] is None]
    assert rows and all(r["outcome_correct"] is False for r in rows)
    assert m["counts"]["no_final_answer"] == len(rows)


def test_gsm8k_solutions_one_generator(tmp_path, checker):
    out = tmp_path / "s.parquet"
    ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", out,
           IngestOptions(limit=3, generators=("175b_verification",)), checker, checker_settings())
    assert [r["id"] for r in rows_of(out)] == [f"gsm8k-test-{i}:175b_verification" for i in range(3)]
    with pytest.raises(InputError, match="row 0: --generator gpt5: no such generator"):
        ingest("gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", tmp_path / "x.parquet",
               IngestOptions(limit=1, generators=("gpt5",)), checker, checker_settings())


def test_processbench_gsm8k_keeps_human_labels_and_finds_gold(tmp_path, checker):
    out = tmp_path / "pb.parquet"
    m = ingest("processbench", DATA / "processbench" / "gsm8k.json", out, IngestOptions(), checker, checker_settings())
    rows = rows_of(out)
    src = json.loads((DATA / "processbench" / "gsm8k.json").read_text())
    assert len(rows) == 400 and m["counts"]["reference: matched problem text"] == 400
    assert [r["reference_first_error"] for r in rows] == [x["label"] for x in src]
    assert all(r["reference_status"] == "ok" for r in rows)
    assert rows[0]["step_separator"] == "\n\n" and rows[0]["steps"] == [s.strip() for s in src[0]["steps"]]
    # Recomputed outcomes agree with ProcessBench's final_answer_correct on most rows (measured: 384/400;
    # the rest are free-text answers with no answer marker, and 2 rows the dataset marks wrong).
    assert m["counts"]["agree_with_source"] >= 380


def test_sample_is_seeded_keeps_file_order_and_both_classes(tmp_path, checker):
    # ProcessBench lists every erroneous sample first: a --limit slice holds one class, --sample both.
    src = DATA / "processbench" / "gsm8k.json"

    def ids(seed, out):
        ingest("processbench", src, out, IngestOptions(sample=20, seed=seed), checker, checker_settings())
        return rows_of(out)

    a, b, c = ids(0, tmp_path / "a.parquet"), ids(0, tmp_path / "b.parquet"), ids(1, tmp_path / "c.parquet")
    order = {x["id"]: i for i, x in enumerate(json.loads(src.read_text()))}
    assert len(a) == 20 and [r["id"] for r in a] == [r["id"] for r in b] != [r["id"] for r in c]
    assert [order[r["id"]] for r in a] == sorted(order[r["id"]] for r in a)
    labels = [r["reference_first_error"] for r in a]
    assert any(x == -1 for x in labels) and any(x >= 0 for x in labels)


def test_processbench_math_reports_reference_coverage(tmp_path, checker):
    out = tmp_path / "pbm.parquet"
    m = ingest("processbench", DATA / "processbench" / "math.json", out, IngestOptions(), checker, checker_settings())
    c = m["counts"]
    assert c["rows"] == 1000
    assert c["reference: matched problem text"] == 112  # MATH-500 problems
    assert c["reference: from a correct row of the same problem"] > 400
    assert c["reference: none"] + c["reference: matched problem text"] + c["reference: from a correct row of the same problem"] == 1000


def test_jsonl_column_mapping_ratings_and_first_error(tmp_path, checker, cases):
    src = tmp_path / "in.jsonl"
    recs = [
        {"q": "What is 2+2?", "sol": "Step 1: 2+2 = 4.\nStep 2: The answer is 4.", "gold": "4", "r": [1, 0],
         "fe": -1, "uid": "a"},
        {"q": "What is 3+3?", "sol": ["3+3 = 7.", "The answer is 7."], "gold": "6", "r": [-1, -1], "fe": 0, "uid": "b"},
        # released data with an undocumented third class (case first-error-step-missing-for-incorrect)
        {"q": "What is 5+5?", "sol": ["5+5 = 11.", "The answer is 11."], "gold": "10", "r": [1, 0], "fe": "N/A",
         "uid": "c"},
    ]
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = tmp_path / "t.parquet"
    opts = IngestOptions(prompt_col="q", steps_col="sol", reference_col="gold", labels_col="r", id_col="uid",
                         first_error_col="fe", neutral_as="negative")
    m = ingest("jsonl", src, out, opts, checker, checker_settings())
    rows = rows_of(out)
    assert rows[0]["steps"] == ["Step 1: 2+2 = 4.", "Step 2: The answer is 4."]
    assert [r["outcome_correct"] for r in rows] == [True, False, False]
    assert rows[0]["reference_labels"] == [True, False]  # TRL convention: neutral 0 -> False
    assert rows[2]["reference_status"].startswith("inconsistent") and rows[2]["reference_first_error"] is None
    assert m["counts"]["reference_inconsistent"] == 1
    assert m["config"]["options"]["neutral_as"] == "negative"


def test_prm800k_neutral_rating_mapping(cases):
    c = cases["prm800k-neutral-rating-mapping"]
    ratings = c["input"]["step_ratings"]
    assert ratings_to_labels(ratings, "positive") == c["expected"]["paper_or_qwen_convention"]
    assert ratings_to_labels(ratings, "negative") == c["expected"]["trl_script_convention"]
    with pytest.raises(ValueError):
        ratings_to_labels([2])


def test_first_error_invariant(cases):
    c = cases["first-error-step-missing-for-incorrect"]
    status = first_error_status(c["input"]["solution_correctness"] == "right", c["input"]["first_error_step"],
                                c["input"]["n_steps"])
    assert status.startswith("inconsistent")
    assert first_error_status(False, -1, 4).startswith("inconsistent")  # incorrect with no error step
    assert first_error_status(False, 4, 4).startswith("inconsistent")  # out of range
    assert first_error_status(True, 2, 4) == "ok"  # a correct answer may hide a process error
    assert first_error_status(False, 0, 4) == "ok" and first_error_status(True, -1, 4) == "ok"


def test_bad_jsonl_line_names_file_and_row(tmp_path, checker):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"prompt": "a", "steps": ["x"]}\n{not json}\n')
    with pytest.raises(InputError, match=r"bad.jsonl: row 1: not valid JSON"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())
    src.write_text('{"prompt": "a", "steps": ["x"]}\n{"prompt": "b"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl: row 1, column 'steps': missing"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())
    src.write_text('{"prompt": "a", "steps": []}\n')
    with pytest.raises(InputError, match=r"row 0, column 'steps': empty steps"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())
    assert not (tmp_path / "o.parquet").exists()


def test_cli_ingest_error_is_one_line(tmp_path):
    p = run_cli("ingest", "gsm8k", tmp_path / "nope.jsonl", tmp_path / "o.parquet", check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == f"error: {tmp_path / 'nope.jsonl'}: no such file"


def test_wrong_types_name_row_and_column(tmp_path, checker):
    src = tmp_path / "t.jsonl"
    src.write_text('{"prompt": "a", "steps": ["x"]}\n{"prompt": 5, "steps": ["x"]}\n')
    with pytest.raises(InputError, match=r"row 1, column 'prompt': expected str"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())
    src.write_text('{"prompt": "a", "steps": ["x"], "gold": [2]}\n')
    with pytest.raises(InputError, match=r"row 0, column 'gold': expected a string or number"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(reference_col="gold"), checker, checker_settings())
    src.write_bytes(b'{"prompt": "a", "steps": ["x"]}\n{"prompt": "\xff\xfe"}\n')
    with pytest.raises(InputError, match="not UTF-8"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())
    src.write_text("")
    with pytest.raises(InputError, match="no records"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())


def test_numeric_reference_keeps_its_value(tmp_path, checker):
    src = tmp_path / "t.jsonl"
    src.write_text('{"prompt": "a", "steps": ["The answer is 0.0000001."], "gold": 0.0000001}\n')
    ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(reference_col="gold"), checker, checker_settings())
    (row,) = rows_of(tmp_path / "o.parquet")
    assert row["reference_answer"] == "0.0000001" and row["outcome_correct"] is True


def test_processbench_malformed_rows(tmp_path, checker):
    good = {"id": "g-0", "generator": "m", "problem": "What is 1+1?", "steps": ["1+1 = 2.", "The answer is 2."],
            "final_answer_correct": True, "label": -1}
    src = tmp_path / "pb.json"
    src.write_text(json.dumps([good, {**good, "id": "g-1", "label": "N/A", "final_answer_correct": False}]))
    ingest("processbench", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())
    rows = rows_of(tmp_path / "o.parquet")
    assert rows[1]["reference_first_error"] is None and rows[1]["reference_status"].startswith("inconsistent")
    for bad, msg in (({"steps": "1+1=2"}, "expected a list of strings"), ({"steps": []}, "empty steps"),
                     ({"problem": 5}, "expected str")):
        src.write_text(json.dumps([good, {**good, "id": "g-1", **bad}]))
        with pytest.raises(InputError, match=rf"row 1, column '\w+': {msg}"):
            ingest("processbench", src, tmp_path / "o.parquet", IngestOptions(), checker, checker_settings())


def test_unusable_reference_names_row_and_column(tmp_path, checker):
    src = tmp_path / "t.jsonl"
    src.write_text('{"prompt": "a", "steps": ["The answer is 2."], "gold": "2"}\n'
                   '{"prompt": "b", "steps": ["The answer is 2."], "gold": "}"}\n')
    with pytest.raises(InputError, match=r"t.jsonl: row 1, column 'gold': unusable reference answer"):
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(reference_col="gold"), checker, checker_settings())
