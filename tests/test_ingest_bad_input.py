"""ingest on bad input: every fault is one ``error: <file>: row R, column 'C': <what>`` line, never a traceback
or a shard that a later stage rejects, and never a silently wrong value. Built on real rows of
../shared/data (GSM8K, MATH-500, ProcessBench) with one bad row or value put in."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepkit.errors import ConfigError, InputError
from stepkit.grading.verify import checker_settings
from stepkit.stages.ingest import IngestOptions, ingest
from tests.conftest import DATA, run_cli

GSM8K = DATA / "gsm8k" / "test.jsonl"
SOLUTIONS = DATA / "gsm8k" / "example_model_solutions.jsonl"
MATH500 = DATA / "math500" / "test.jsonl"
PB_GSM8K = DATA / "processbench" / "gsm8k.json"
MATH_COLS = dict(prompt_col="problem", steps_col="solution", reference_col="answer")


def rows_of(path):
    return pq.read_table(path).to_pylist()


def real_lines(path, n):
    return path.read_text(encoding="utf-8").splitlines()[:n]


def write_jsonl(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")
    return path


def math500_rows(n=5):
    return [json.loads(x) for x in real_lines(MATH500, n)]


def pb_rows(n=3):
    return json.loads(PB_GSM8K.read_text())[:n]


def run(fmt, src, out, checker, **opts):
    return ingest(fmt, src, out, IngestOptions(**opts), checker, checker_settings())


# ---- D1: every --*-col flag names an existing column -------------------------------------------------
COL_FLAGS = ["prompt_col", "steps_col", "answer_col", "reference_col", "id_col", "problem_id_col", "labels_col",
             "first_error_col"]


@pytest.mark.parametrize("field", COL_FLAGS)
def test_a_col_flag_naming_no_column_is_refused(tmp_path, checker, field):
    src = write_jsonl(tmp_path / "math500.jsonl", math500_rows())
    flag = "--" + field.replace("_", "-")
    with pytest.raises(InputError) as e:
        run("jsonl", src, tmp_path / "o.parquet", checker, **{**MATH_COLS, field: "anwser"})
    assert str(e.value) == (f"{src}: column 'anwser': {flag} names no column of the file "
                            "(its columns: problem, solution, answer, subject, level)")
    assert not (tmp_path / "o.parquet").exists()


def test_a_col_flag_naming_no_parquet_column_is_refused(tmp_path, checker):
    src = tmp_path / "math500.parquet"
    pq.write_table(pa.Table.from_pylist(math500_rows()), src)
    run("parquet", src, tmp_path / "ok.parquet", checker, **MATH_COLS)  # the right names work
    assert all(r["outcome_correct"] is not None for r in rows_of(tmp_path / "ok.parquet"))
    with pytest.raises(InputError, match=r"math500.parquet: column 'gold': --reference-col names no column of the "
                                         r"file \(its columns: problem, solution, answer, subject, level\)"):
        run("parquet", src, tmp_path / "o.parquet", checker, **{**MATH_COLS, "reference_col": "gold"})


def test_a_row_without_a_named_column_is_refused_but_null_is_no_value(tmp_path, checker):
    recs = math500_rows()
    recs[2]["answer"] = None  # a null reference: that row is not graded
    src = write_jsonl(tmp_path / "m.jsonl", recs)
    run("jsonl", src, tmp_path / "o.parquet", checker, **MATH_COLS)
    rows = rows_of(tmp_path / "o.parquet")
    assert rows[2]["reference_answer"] is None and rows[2]["outcome_correct"] is None
    assert rows[1]["outcome_correct"] is not None
    del recs[3]["answer"]  # a row that lacks the column is a broken row, not an ungraded one
    write_jsonl(src, recs)
    with pytest.raises(InputError, match=r"m.jsonl: row 3, column 'answer': missing \(named by --reference-col; "
                                         r"the row has: problem, solution, subject, level\)"):
        run("jsonl", src, tmp_path / "o.parquet", checker, **MATH_COLS)


# ---- D6: a long gold answer is never cut ---------------------------------------------------------------
BIG = "7" * 2000  # longer than the 1,000 characters an answer phrase of model output is read for


def test_gsm8k_long_gold_answer_is_kept_whole(tmp_path, checker):
    objs = [json.loads(x) for x in real_lines(GSM8K, 3)]
    objs[1]["answer"] = objs[1]["answer"].rsplit("####", 1)[0] + "#### " + BIG
    objs[2]["answer"] = objs[2]["answer"].rsplit("####", 1)[0] + "#### 1,234,567"
    run("gsm8k", write_jsonl(tmp_path / "test.jsonl", objs), tmp_path / "o.parquet", checker)
    assert [r["reference_answer"] for r in rows_of(tmp_path / "o.parquet")] == ["18", BIG, "1234567"]


def test_gsm8k_solutions_long_gold_answer_is_kept_whole(tmp_path, checker):
    objs = [json.loads(x) for x in real_lines(SOLUTIONS, 2)]
    objs[1]["ground_truth"] = objs[1]["ground_truth"].rsplit("A:", 1)[0] + "A: " + BIG
    m = run("gsm8k-solutions", write_jsonl(tmp_path / "s.jsonl", objs), tmp_path / "o.parquet", checker)
    rows = rows_of(tmp_path / "o.parquet")
    assert {r["reference_answer"] for r in rows[4:]} == {BIG} and rows[0]["reference_answer"] == "18"
    assert all(r["outcome_correct"] is False for r in rows[4:])  # graded against the whole number
    assert "reference: unusable" not in m["counts"]


def test_long_gold_text_that_cannot_be_read_whole_is_refused(tmp_path, checker):
    objs = [json.loads(x) for x in real_lines(GSM8K, 2)]
    objs[1]["answer"] += " " + "x + " * 400  # a 1,600-character line after '####' that is not a number
    with pytest.raises(InputError, match=r"test.jsonl: row 1, column 'answer': the answer after '####' is \d+ "
                                         r"characters of text"):
        run("gsm8k", write_jsonl(tmp_path / "test.jsonl", objs), tmp_path / "o.parquet", checker)


# ---- D8: processbench --answers values ------------------------------------------------------------------
def _pb_and_answers(tmp_path, answer_values):
    """ProcessBench gsm8k rows 0-2 (GSM8K test problems 193, 734, 1180) in a folder with no GSM8K/MATH-500
    siblings, and an --answers file with those problems and the given answer values."""
    (tmp_path / "pb").mkdir()
    pb = tmp_path / "pb" / "gsm8k.json"
    pb.write_text(json.dumps(pb_rows()))
    gsm = GSM8K.read_text().splitlines()
    qs = [json.loads(gsm[i])["question"] for i in (193, 734, 1180)]
    answers = write_jsonl(tmp_path / "answers.jsonl", [{"question": q, "answer": a} for q, a in zip(qs, answer_values)])
    return pb, answers


def test_processbench_numeric_answers_are_gold_text(tmp_path, checker):
    gold = [json.loads(GSM8K.read_text().splitlines()[i])["answer"].rsplit("####", 1)[1].strip() for i in (193, 734, 1180)]
    pb, answers = _pb_and_answers(tmp_path, [int(gold[0]), float(gold[1]), f"Some work.\n#### {gold[2]}"])
    m = run("processbench", pb, tmp_path / "o.parquet", checker, answers=(str(answers),))
    assert [r["reference_answer"] for r in rows_of(tmp_path / "o.parquet")] == gold
    assert m["counts"]["reference: matched problem text"] == 3


@pytest.mark.parametrize("bad, found", [(None, "found null"), ([1, 2], "found a list"),
                                        (True, "found true/false"), ("no marker", "no '#### N' final answer line")])
def test_processbench_unusable_answers_are_refused(tmp_path, checker, bad, found):
    pb, answers = _pb_and_answers(tmp_path, ["#### 1", bad, "#### 3"])
    with pytest.raises(InputError, match=rf"answers.jsonl: row 1, column 'answer': .*{found}"):
        run("processbench", pb, tmp_path / "o.parquet", checker, answers=(str(answers),))


def test_processbench_answers_rows_need_a_problem_and_an_answer(tmp_path, checker):
    pb, answers = _pb_and_answers(tmp_path, ["#### 1", "#### 2", "#### 3"])
    answers.write_text(answers.read_text() + json.dumps({"query": "What?", "answer": "1"}) + "\n")
    with pytest.raises(InputError, match=r"answers.jsonl: row 3: expected 'question' and 'answer' \(GSM8K\) or "
                                         r"'problem' and 'answer' \(MATH-500\); the row has: query, answer"):
        run("processbench", pb, tmp_path / "o.parquet", checker, answers=(str(answers),))


# ---- D9: ids and prompts that later stages reject are refused at ingest --------------------------------
@pytest.mark.parametrize("edit, msg", [
    ({"id": "gsm8k-0"}, r"row 2, column 'id': duplicate id 'gsm8k-0' \(also row 0\)"),
    ({"id": ""}, r"row 2, column 'id': empty"),
    ({"id": "  "}, r"row 2, column 'id': empty"),
    ({"problem": " \n "}, r"row 2, column 'problem': empty"),
])
def test_processbench_bad_ids_and_prompts_are_refused(tmp_path, checker, edit, msg):
    rows = pb_rows()
    rows[2].update(edit)
    src = tmp_path / "gsm8k.json"
    src.write_text(json.dumps(rows))
    with pytest.raises(InputError, match=rf"gsm8k.json: {msg}"):
        run("processbench", src, tmp_path / "o.parquet", checker)
    assert not (tmp_path / "o.parquet").exists()


def test_a_repeated_generator_is_refused():
    with pytest.raises(ConfigError, match="--generator 6b_finetuning is given twice"):
        IngestOptions(generators=("6b_finetuning", "175b_verification", "6b_finetuning"))


@pytest.mark.parametrize("edit, msg", [
    ({"uid": ""}, r"row 1, column 'uid': empty"),
    ({"uid": "math500-0"}, r"row 1, column 'uid': duplicate id 'math500-0' \(also row 0\)"),
    ({"problem": "   "}, r"row 1, column 'problem': empty"),
    ({"subject": ""}, r"row 1, column 'subject': empty"),
])
def test_jsonl_bad_ids_and_prompts_are_refused(tmp_path, checker, edit, msg):
    recs = [{**r, "uid": f"math500-{i}"} for i, r in enumerate(math500_rows(3))]
    recs[1].update(edit)
    src = write_jsonl(tmp_path / "m.jsonl", recs)
    with pytest.raises(InputError, match=rf"m.jsonl: {msg}"):
        run("jsonl", src, tmp_path / "o.parquet", checker, **MATH_COLS, id_col="uid", problem_id_col="subject")


def test_jsonl_generator_is_text_not_the_repr_of_an_object(tmp_path, checker):
    recs = [{**r, "generator": g} for r, g in zip(math500_rows(3), ["gpt-4o", None, {"name": "x"}])]
    src = write_jsonl(tmp_path / "m.jsonl", recs)
    with pytest.raises(InputError, match=r"m.jsonl: row 2, column 'generator': expected str, found dict"):
        run("jsonl", src, tmp_path / "o.parquet", checker, **MATH_COLS)
    write_jsonl(src, recs[:2])
    run("jsonl", src, tmp_path / "o.parquet", checker, **MATH_COLS)
    assert [r["generator"] for r in rows_of(tmp_path / "o.parquet")] == ["gpt-4o", "unknown"]


def test_gsm8k_blank_question_is_refused(tmp_path, checker):
    objs = [json.loads(x) for x in real_lines(GSM8K, 3)]
    objs[2]["question"] = "\t"
    with pytest.raises(InputError, match=r"test.jsonl: row 2, column 'question': empty"):
        run("gsm8k", write_jsonl(tmp_path / "test.jsonl", objs), tmp_path / "o.parquet", checker)


# ---- D11: a pipe is read once, and its hash is of what was read ---------------------------------------
def _feed(path_or_fd, data):
    def write():
        if isinstance(path_or_fd, int):
            os.write(path_or_fd, data)
            os.close(path_or_fd)
        else:
            with open(path_or_fd, "wb") as f:
                f.write(data)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


def test_ingest_from_a_named_pipe(tmp_path):
    data = ("\n".join(real_lines(GSM8K, 5)) + "\n").encode()
    fifo = tmp_path / "test.jsonl"
    os.mkfifo(fifo)
    _feed(fifo, data)
    p = run_cli("ingest", "gsm8k", fifo, tmp_path / "o.parquet", check=False)  # before: blocked forever re-opening the pipe
    assert p.returncode == 0, p.stderr
    m = json.loads((tmp_path / "o.manifest.json").read_text())
    assert m["input"]["sha256"] == hashlib.sha256(data).hexdigest() and m["counts"]["rows"] == 5


def test_ingest_from_process_substitution_hashes_the_bytes_read(tmp_path):
    data = ("\n".join(real_lines(GSM8K, 4)) + "\n").encode()
    r, w = os.pipe()
    _feed(w, data)
    p = subprocess.run([sys.executable, "-m", "stepkit.cli", "ingest", "gsm8k", f"/dev/fd/{r}",
                        str(tmp_path / "o.parquet")], capture_output=True, text=True, timeout=90, pass_fds=(r,))
    os.close(r)
    assert p.returncode == 0, p.stderr
    m = json.loads((tmp_path / "o.manifest.json").read_text())
    assert m["input"]["sha256"] == hashlib.sha256(data).hexdigest() != hashlib.sha256(b"").hexdigest()


def test_manifest_hash_is_the_file_hash(tmp_path, checker):
    m = run("processbench", PB_GSM8K, tmp_path / "o.parquet", checker, limit=2)
    assert m["input"]["sha256"] == hashlib.sha256(PB_GSM8K.read_bytes()).hexdigest()
    assert [a["sha256"] for a in m["input"]["answers"]] == [
        hashlib.sha256(f.read_bytes()).hexdigest() for f in (GSM8K, MATH500)]


# ---- D12: never write over the input or a shard's own files ---------------------------------------------
def test_input_named_like_outs_manifest_is_not_overwritten(tmp_path, checker):
    src = tmp_path / "foo.manifest.json"
    src.write_text("\n".join(real_lines(GSM8K, 3)) + "\n")
    before = src.read_bytes()
    with pytest.raises(InputError, match=r"foo.manifest.json: is the input, and it is where OUT .*foo.parquet writes its manifest"):
        run("gsm8k", src, tmp_path / "foo.parquet", checker)
    assert src.read_bytes() == before and not (tmp_path / "foo.parquet").exists()
    link = tmp_path / "bar.manifest.json"
    os.link(src, link)  # another name of the input
    with pytest.raises(InputError, match=r"bar.manifest.json: is the input \(.*foo.manifest.json\), and it is where OUT "):
        run("gsm8k", src, tmp_path / "bar.parquet", checker)
    assert src.read_bytes() == before


def test_answers_file_is_never_an_output(tmp_path, checker):
    answers = tmp_path / "o.manifest.json"
    answers.write_bytes(GSM8K.read_bytes())
    with pytest.raises(InputError, match=r"o.manifest.json: is an --answers file, and it is where OUT .*o.parquet writes its manifest"):
        run("processbench", PB_GSM8K, tmp_path / "o.parquet", checker, limit=2, answers=(str(answers),))
    assert answers.read_bytes() == GSM8K.read_bytes()


def test_out_that_ingest_did_not_write_is_not_replaced(tmp_path, checker):
    out = tmp_path / "labeled.parquet"
    pq.write_table(pa.table({"x": [1]}), out)  # not a stepkit shard
    with pytest.raises(InputError, match=r"labeled.parquet: exists and was not written by ingest"):
        run("gsm8k", GSM8K, out, checker, limit=2)
    assert pq.read_table(out).to_pylist() == [{"x": 1}]
    run("gsm8k", GSM8K, tmp_path / "p.parquet", checker, limit=2)
    run("gsm8k", GSM8K, tmp_path / "p.parquet", checker, limit=3)  # ingest's own output is rewritten
    assert len(rows_of(tmp_path / "p.parquet")) == 3
    parts = tmp_path / "mc.parquet.parts"
    parts.mkdir()
    with pytest.raises(InputError, match=r"is inside the parts folder of .*mc.parquet"):
        run("gsm8k", GSM8K, parts / "part-00000.parquet", checker, limit=2)
    (tmp_path / "p.manifest.json").unlink()
    (tmp_path / "p.manifest.json").mkdir()  # the new shard would be written, its manifest not
    with pytest.raises(InputError, match=r"p.manifest.json: is a folder, and it is where OUT"):
        run("gsm8k", GSM8K, tmp_path / "p.parquet", checker, limit=1)
    assert len(rows_of(tmp_path / "p.parquet")) == 3


# ---- D13: JSON that json refuses without a JSONDecodeError ------------------------------------------------
# (an integer of more than 4,300 digits is no longer refused: it is kept as its digits, D19 in test_grading_values)
BAD_JSON = [
    ('{"question": ' + "[" * 100_000 + "]" * 100_000 + "}", r"row 1: not valid JSON \(nested too deeply\)"),
    ('{"question": "\\ud800", "answer": "#### 1"}',
     r"row 1, column 'question': a lone surrogate \\ud800 in a string \(not encodable as UTF-8\)"),
]


@pytest.mark.parametrize("line, msg", BAD_JSON)
def test_jsonl_that_json_refuses_is_one_error(tmp_path, checker, line, msg):
    src = tmp_path / "test.jsonl"
    src.write_text(real_lines(GSM8K, 1)[0] + "\n" + line + "\n" + real_lines(GSM8K, 2)[1] + "\n")
    with pytest.raises(InputError, match=rf"test.jsonl: {msg}"):
        run("gsm8k", src, tmp_path / "o.parquet", checker)


@pytest.mark.parametrize("value, msg", [
    ("[" * 100_000 + "]" * 100_000, r"row 1: not valid JSON \(nested too deeply\)"),
    ('"\\udfff"', r"row 1, column 'problem': a lone surrogate \\udfff"),
])
def test_processbench_json_that_json_refuses_is_one_error(tmp_path, checker, value, msg):
    rows = [json.dumps(r) for r in pb_rows()]
    rows[1] = rows[1].replace('"problem": ', f'"problem": {value}, "problem_": ', 1)
    src = tmp_path / "gsm8k.json"
    src.write_text("[" + ",\n".join(rows) + "]")
    with pytest.raises(InputError, match=rf"gsm8k.json: {msg}"):
        run("processbench", src, tmp_path / "o.parquet", checker)


def test_json_errors_are_one_line_on_the_command_line(tmp_path):
    src = tmp_path / "test.jsonl"
    src.write_text(real_lines(GSM8K, 1)[0] + '\n{"question": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    p = run_cli("ingest", "gsm8k", src, tmp_path / "o.parquet", check=False)
    assert p.returncode == 1 and p.stderr == f"error: {src}: row 1: not valid JSON (nested too deeply)\n"
    pb = tmp_path / "pb.json"
    pb.write_text(json.dumps(pb_rows(2))[:-1] + ', {"id": ' + "[" * 100_000 + "]" * 100_000 + "}]")
    p = run_cli("ingest", "processbench", pb, tmp_path / "o.parquet", check=False)
    assert p.returncode == 1
    assert p.stderr == f"error: {pb}: row 2: not valid JSON (nested too deeply)\n"


# ---- D15: invalid UTF-8 names its row and byte ---------------------------------------------------------------
def test_invalid_utf8_names_the_right_row_and_byte(tmp_path, checker):
    lines = GSM8K.read_bytes().splitlines(keepends=True)[:60]  # 60 real rows: past the decoder's 8 KB chunks
    lines[40] = lines[40][:17] + b"\xff" + lines[40][18:]
    src = tmp_path / "test.jsonl"
    src.write_bytes(b"".join(lines))
    offset = sum(map(len, lines[:40])) + 17
    with pytest.raises(InputError) as e:
        run("gsm8k", src, tmp_path / "o.parquet", checker)
    assert str(e.value) == (f"{src}: row 40: not UTF-8 text (invalid start byte 0xff at byte 17 of the row, "
                            f"byte {offset} of the file)")


def test_invalid_utf8_in_processbench_names_row_and_byte(tmp_path, checker):
    text = "[" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in pb_rows()) + "]"
    data = text.encode()
    at = data.index(b'"problem"', data.index(b'"gsm8k-2"')) + 20  # inside row 2's problem text
    src = tmp_path / "gsm8k.json"
    src.write_bytes(data[:at] + b"\xc3\x28" + data[at + 2:])
    with pytest.raises(InputError, match=rf"gsm8k.json: row 2: not UTF-8 text \(invalid continuation byte 0xc3 "
                                         rf"at byte {at} of the file\)"):
        run("processbench", src, tmp_path / "o.parquet", checker)


# ---- D22: options that do not apply to the format, and format hints ----------------------------------------
@pytest.mark.parametrize("fmt, src, args, msg", [
    ("gsm8k", GSM8K, ["--generator", "6b_finetuning"], "--generator applies only to format gsm8k-solutions"),
    ("processbench", PB_GSM8K, ["--id-col", "id"], "--id-col applies only to formats jsonl, parquet"),
    ("gsm8k-solutions", SOLUTIONS, ["--answers", str(GSM8K)], "--answers applies only to format processbench"),
    ("gsm8k", GSM8K, ["--split", "blank"], "--split applies only to formats jsonl, parquet"),
    ("gsm8k", GSM8K, ["--seed", "3"], "--seed has no effect without --sample"),
    ("jsonl", MATH500, ["--prompt-col", "problem", "--neutral-as", "negative"],
     "--neutral-as has no effect without --labels-col"),
])
def test_options_that_do_not_apply_are_usage_errors(tmp_path, fmt, src, args, msg):
    p = run_cli("ingest", fmt, src, tmp_path / "o.parquet", *args, check=False)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_options_that_do_not_apply_are_refused_from_python(tmp_path, checker):
    with pytest.raises(ConfigError, match="--generator applies only to format gsm8k-solutions, not gsm8k"):
        run("gsm8k", GSM8K, tmp_path / "o.parquet", checker, generators=("6b_finetuning",))


def test_unknown_generator_is_not_called_a_column(tmp_path, checker):
    with pytest.raises(InputError) as e:
        run("gsm8k-solutions", SOLUTIONS, tmp_path / "o.parquet", checker, limit=1, generators=("gpt5",))
    assert str(e.value) == (f"{SOLUTIONS}: row 0: --generator gpt5: no such generator (the row has: 6b_finetuning, "
                            "6b_verification, 175b_finetuning, 175b_verification)")


@pytest.mark.parametrize("fmt, src, hint", [
    ("gsm8k", SOLUTIONS, "the file looks like gsm8k-solutions input"),
    ("gsm8k-solutions", GSM8K, "the file looks like gsm8k input"),
    ("jsonl", GSM8K, "the file looks like gsm8k input"),
    ("jsonl", PB_GSM8K, "the file looks like processbench input"),
    ("processbench", GSM8K, "the file looks like gsm8k input"),
    ("parquet", MATH500, "the file looks like jsonl input"),
])
def test_wrong_format_errors_name_the_format_the_file_looks_like(tmp_path, checker, fmt, src, hint):
    with pytest.raises(InputError, match=rf"{src.name}: .*; {hint} \(stepkit ingest "):
        run(fmt, src, tmp_path / "o.parquet", checker)


def test_a_symlink_loop_as_out_is_one_error_line(tmp_path):
    (tmp_path / "c.parquet").symlink_to(tmp_path / "d.parquet")
    (tmp_path / "d.parquet").symlink_to(tmp_path / "c.parquet")
    p = run_cli("ingest", "gsm8k", GSM8K, tmp_path / "c.parquet", "--limit", "2", check=False)
    assert p.returncode == 1 and p.stderr.strip() == f"error: {tmp_path / 'c.parquet'}: is a symlink loop (a link that points back to itself)"
