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

import pyarrow.parquet as pq
import pytest

from stepkit.errors import InputError
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
    p = subprocess.run([sys.executable, "-m", "stepkit.cli", "ingest", "gsm8k", str(fifo), str(tmp_path / "o.parquet")],
                       capture_output=True, text=True, timeout=90)  # before: blocked forever re-opening the pipe
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


# ---- D13: JSON that json refuses without a JSONDecodeError ------------------------------------------------
BAD_JSON = [
    ('{"question": ' + "1" * 5000 + "}", r"row 1: not valid JSON \(an integer of more than 4300 digits\)"),
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
    ("1" * 5000, r"row 1: not valid JSON \(an integer of more than 4300 digits\)"),
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
    pb.write_text(json.dumps(pb_rows(2))[:-1] + ', {"id": ' + "9" * 5000 + "}]")
    p = run_cli("ingest", "processbench", pb, tmp_path / "o.parquet", check=False)
    assert p.returncode == 1
    assert p.stderr == f"error: {pb}: row 2: not valid JSON (an integer of more than 4300 digits)\n"


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
