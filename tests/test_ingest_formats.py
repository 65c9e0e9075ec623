"""A format of ``ingest`` is one :class:`IngestFormat` class plus one registry entry: a toy format registered
here (and nowhere else) reads the real MATH-500 file, and the options a format accepts come from its
declaration."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pyarrow.parquet as pq
import pytest

from stepkit.errors import ConfigError, InputError
from stepkit.grading.verify import checker_settings
from stepkit.schema import PROBLEM_SCHEMA
from stepkit.stages.ingest import FORMATS, IngestOptions, ingest, option_conflicts
from stepkit.stages.ingest_formats import COMMON_OPTIONS, IngestFormat
from stepkit.stages.ingest_read import need, need_text, scalar_text
from tests.conftest import DATA

MATH500 = DATA / "math500" / "test.jsonl"
GSM8K = DATA / "gsm8k" / "test.jsonl"


class Math500(IngestFormat):
    """MATH-500 problems (JSON Lines ``{problem, solution, answer}``) -> a problems shard."""

    name = "math500"
    options = ("prompt_col",)
    schema = PROBLEM_SCHEMA

    def rows(self):
        rows = []
        for i, obj in self.take(self.source.jsonl()):
            answer = scalar_text(need(obj, "answer", self.path, i), self.path, i, "answer", gold=True)
            rows.append({"problem_id": f"math500-{i}", "source": f"math500/{i}", "_row": i,
                         "prompt": need_text(obj, self.opts.prompt_col, self.path, i, "--prompt-col"),
                         "reference_answer": answer,
                         "reference_steps": need(obj, "solution", self.path, i, str).split("\n\n")})
        return rows


@pytest.fixture
def math500(monkeypatch):
    """The toy format, registered for one test."""
    monkeypatch.setitem(FORMATS, Math500.name, Math500)


def test_a_registered_format_ingests_a_real_file(tmp_path, checker, math500):
    out = tmp_path / "p.parquet"
    m = ingest("math500", MATH500, out, IngestOptions(prompt_col="problem", skip=2, limit=3), checker,
               checker_settings())
    source = [json.loads(line) for line in MATH500.read_text(encoding="utf-8").splitlines()][2:5]
    rows = pq.read_table(out).to_pylist()
    assert [r["problem_id"] for r in rows] == ["math500-2", "math500-3", "math500-4"]
    assert [r["prompt"] for r in rows] == [s["problem"] for s in source]
    assert [r["reference_answer"] for r in rows] == [s["answer"] for s in source]
    assert rows[0]["reference_steps"] == source[0]["solution"].split("\n\n")
    assert m["config"]["format"] == "math500" and m["counts"] == {"rows": 3}
    assert m["input"]["sha256"] == hashlib.sha256(MATH500.read_bytes()).hexdigest()  # the whole file, read once


def test_a_registered_format_gets_the_shared_checks(tmp_path, checker, math500):
    with pytest.raises(ConfigError, match="--id-col applies only to formats jsonl, parquet, messages, not math500"):
        ingest("math500", MATH500, tmp_path / "o.parquet", IngestOptions(id_col="x"), checker, checker_settings())
    # a layout error (the default --prompt-col names no MATH-500 key) names the format the file looks like
    with pytest.raises(InputError, match=r"test.jsonl: row 0, column 'prompt': missing \(named by --prompt-col; "
                                         r"the row has: problem, solution, answer, subject, level\); the file looks "
                                         r"like jsonl input \(stepkit ingest jsonl FILE OUT with --prompt-col"):
        ingest("math500", MATH500, tmp_path / "o.parquet", IngestOptions(limit=1), checker, checker_settings())
    with pytest.raises(InputError, match=r"; the file looks like gsm8k input \(stepkit ingest gsm8k FILE OUT\)$"):
        ingest("math500", GSM8K, tmp_path / "o.parquet", IngestOptions(prompt_col="question"), checker,
               checker_settings())
    assert not (tmp_path / "o.parquet").exists()


def test_the_formats_an_option_applies_to_come_from_their_declarations(math500):
    assert option_conflicts("gsm8k", IngestOptions(), ["prompt_col", "limit"]) == [
        "--prompt-col applies only to formats jsonl, parquet, math500, not gsm8k"]
    assert option_conflicts("math500", IngestOptions(prompt_col="problem"), ["prompt_col", "skip"]) == []
    assert option_conflicts("math500", IngestOptions(), ["generators"]) == [
        "--generator applies only to format gsm8k-solutions, not math500"]


def test_every_option_is_declared_by_a_format_and_every_declaration_is_an_option():
    fields = {f.name for f in dataclasses.fields(IngestOptions)}
    declared = {o for f in FORMATS.values() for o in f.options}
    assert declared <= fields and set(COMMON_OPTIONS) <= fields  # a misspelt declaration would refuse its option
    assert fields == declared | set(COMMON_OPTIONS)  # an option no format accepts would be refused everywhere
    assert all(name == f.name for name, f in FORMATS.items())
