"""export's text layouts on real rows: Math-Shepherd's released layout read back by TRL's Math-Shepherd converter
logic (written here from its documented behaviour), the real task values (also after a generic jsonl ingest),
the step separator (rows' own, disagreeing rows, steps holding it) and pairs joined with it."""

from __future__ import annotations

import json
import re

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import stepkit.cli as cli
from stepkit.errors import ConfigError, InputError
from stepkit.stages.export import ExportConfig, export
from stepkit.stages.export_text import CONVERTER_SKIPS
from tests.conftest import DATA


def invoke(*args):
    """The stepkit CLI in this process; returns click's result (exit code checked by the caller)."""
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def ok(*args):
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    return r


def load(folder, split="train"):
    m = json.loads((folder / "stepkit.manifest.json").read_text())
    files = [str(folder / f) for f in m["splits"][split]["files"]]
    return datasets.load_dataset("parquet", data_files={split: files}, cache_dir=str(folder.parent / "cache"))[split]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Real rows with human first errors: 4 ProcessBench gsm8k rows and 6 ProcessBench math rows (steps
    joined by blank lines, some holding a newline), and 4 MATH-500 problems ingested as generic jsonl (their
    reference solutions split at blank lines, source ``test.jsonl/<i>``), labelled all correct, as reference
    solutions are."""
    d = tmp_path_factory.mktemp("text")
    ok("ingest", "processbench", DATA / "processbench" / "gsm8k.json", d / "pb-gsm8k.parquet", "--limit", "4")
    ok("ingest", "processbench", DATA / "processbench" / "math.json", d / "pb-math.parquet", "--limit", "6")
    ok("ingest", "jsonl", DATA / "math500" / "test.jsonl", d / "m500.parquet", "--prompt-col", "problem",
       "--steps-col", "solution", "--split", "blank", "--limit", "4")
    t = pq.read_table(d / "m500.parquet")  # the ingest manifest stays in the file's metadata
    labels = pa.array([[True] * len(s) for s in t.column("steps").to_pylist()], pa.list_(pa.bool_()))
    (d / "m500").mkdir()
    pq.write_table(t.append_column("gold_label", labels), d / "m500" / "m500.parquet")
    return d


def trl_math_shepherd(example: dict) -> dict:
    """What TRL's Math-Shepherd converter (``examples/datasets/math_shepherd.py``) makes of a row, from its
    documented behaviour: every ``ки`` in ``input`` is a tag whose position in ``label`` holds ``+`` or ``-``;
    the text before the first tag is the problem and the first step, told apart at ``Step 1:`` (then
    ``step 1:``, then the one ``?``: ``prompt.split("?")`` unpacked into two parts, so zero or two ``?`` raise),
    except for the listed annotation-error openings, whose first label it drops; the other steps are the
    texts between tags, stripped. Raises AssertionError / ValueError where the converter raises."""
    flat = example["input"].replace("ки", "\0")  # one character per tag, as the converter does
    label = example["label"]
    tags = [i for i, c in enumerate(flat) if c == "\0"]
    assert all(label[i] in "+-" for i in tags), "a tag's position in label is not + or -"
    labels = [label[i] == "+" for i in tags]
    pieces = flat.split("\0")[:-1]  # the text before each tag (what follows the last one is dropped)
    head, completions = pieces[0], [p.strip() for p in pieces[1:]]
    if head.startswith(CONVERTER_SKIPS):
        labels, prompt = labels[1:], head
    else:
        marker = "Step 1:" if "Step 1:" in head else "step 1:" if "step 1:" in head else "?" if "?" in head else None
        if marker is None:
            raise ValueError(f"Prompt can't be processed: {head[:60]}")
        prompt, first = head.split(marker)  # ValueError unless the marker occurs once
        if marker == "?":
            prompt, first = prompt + "?", first
        else:
            first = marker + first
        completions = [first.strip(), *completions]
    assert len(completions) == len(labels)
    return {"prompt": prompt.strip(), "completions": completions, "labels": labels}


def test_math_shepherd_rows_read_back_by_trls_converter(shards, tmp_path):
    out = tmp_path / "ms"
    ok("export", shards / "pb-gsm8k.parquet", out, "--format", "math-shepherd", "--labels", "reference_first_error",
       "--separator-in-step", "rejoin")
    rows = pq.read_table(shards / "pb-gsm8k.parquet").to_pylist()
    ms = load(out)
    assert ms.features == datasets.Features({k: datasets.Value("string") for k in ("id", "input", "label", "task")})
    for row, rec in zip(rows, ms):
        got = trl_math_shepherd(rec)
        k, n = row["reference_first_error"], len(row["steps"])
        assert got["prompt"] == row["prompt"].strip()
        assert got["labels"] == [k == -1 or i < k for i in range(n)]
        assert [re.sub(r"^Step \d+: ", "", c) for c in got["completions"]] == [
            " ".join(x.strip() for x in s.strip().split("\n")) for s in row["steps"]]
        assert [c.split(":")[0] for c in got["completions"]] == [f"Step {i + 1}" for i in range(n)]
        assert rec["input"].count("\n") == n - 1 and rec["task"] == "GSM8K"
    m = json.loads((out / "stepkit.manifest.json").read_text())
    assert m["step_separator"] == {"value": "\n", "from": "format", "rows_joined_otherwise": 4}
    assert m["counts"]["steps_rejoined"] >= 1  # real ProcessBench steps hold newlines


def test_math_rows_with_zero_or_two_question_marks_and_their_task(shards, tmp_path):
    for shard, task in ((shards / "pb-math.parquet", "MATH"), (shards / "m500", "MATH")):
        out = tmp_path / shard.stem
        labels = "reference_first_error" if shard.suffix else "gold_label"
        ok("export", shard, out, "--format", "math-shepherd", "--labels", labels, "--separator-in-step", "rejoin")
        ms = load(out)
        prompts = [trl_math_shepherd(r)["prompt"] for r in ms]
        assert [r["task"] for r in ms] == [task] * len(ms)  # not the jsonl file's name
        assert any(p.count("?") != 1 for p in prompts)  # the rows the converter's "?" rule cannot split
        # the layout stepkit wrote before (no "Step k:") is what the converter cannot read on these rows
        old = [r for r in ms if trl_math_shepherd(r)["prompt"].count("?") != 1][0]
        bare = {k: re.sub(r"Step \d+: ", "", old[k]) for k in ("input", "label")}
        with pytest.raises((ValueError, AssertionError)):
            trl_math_shepherd(bare)


def test_math_shepherd_refusals_in_one_line(shards, tmp_path):
    r = invoke("export", shards / "pb-gsm8k.parquet", tmp_path / "x", "--format", "math-shepherd", "--labels",
               "reference_first_error")
    assert r.exit_code == 1 and "step separator '\\n'" in r.output and "--separator-in-step rejoin" in r.output
    assert len(r.output.strip().splitlines()) == 1
    rows = pq.read_table(shards / "pb-gsm8k.parquet").to_pylist()[:1]
    t = pq.read_table(shards / "pb-gsm8k.parquet").schema
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{**rows[0], "prompt": "Follow Step 1: below. " + rows[0]["prompt"]}],
                                        schema=t), bad)
    with pytest.raises(InputError, match="row 0, column 'prompt': holds 'Step 1:'"):
        export(bad, tmp_path / "y", ExportConfig(format="math-shepherd", labels="reference_first_error",
                                                 separator_in_step="rejoin"))
    nosrc = tmp_path / "nosrc.parquet"
    pq.write_table(pa.Table.from_pylist([{**rows[0], "source": "mine.jsonl/0"}], schema=t.remove_metadata()), nosrc)
    with pytest.raises(InputError, match="give --task GSM8K or --task MATH"):
        export(nosrc, tmp_path / "z", ExportConfig(format="math-shepherd", labels="reference_first_error",
                                                   separator_in_step="rejoin"))
    export(nosrc, tmp_path / "z", ExportConfig(format="math-shepherd", labels="reference_first_error",
                                               separator_in_step="rejoin", task="GSM8K"))
    with pytest.raises(ConfigError):
        ExportConfig(format="math-shepherd", labels="x", task="mine")
