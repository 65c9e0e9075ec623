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


def test_the_rows_separator_is_the_exports_and_is_written_everywhere(shards, tmp_path):
    out = tmp_path / "trl"
    r = ok("export", shards / "pb-math.parquet", out, "--labels", "reference_first_error")
    assert "'\\n\\n' (the rows' own)" in r.output
    m = json.loads((out / "stepkit.manifest.json").read_text())
    assert m["step_separator"] == {"value": "\n\n", "from": "rows", "rows_joined_otherwise": 0}
    meta = pq.read_schema(out / m["splits"]["train"]["files"][0]).metadata
    assert json.loads(meta[b"stepkit.export"]) == {"format": "trl", "step_separator": "\n\n"}
    assert load(out).features["labels"] == datasets.List(datasets.Value("bool"))  # the metadata changes no feature


def test_a_folder_whose_rows_disagree_is_refused_or_normalised(shards, tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    ok("ingest", "gsm8k-solutions", DATA / "gsm8k" / "example_model_solutions.jsonl", mixed / "a.parquet",
       "--limit", "1", "--generator", "175b_verification")
    t = pq.read_table(mixed / "a.parquet")  # GSM8K lines: separator \n; no step labels: labelled by outcome here
    n = [len(s) for s in t.column("steps").to_pylist()]
    first = [-1 if ok_ else k - 1 for ok_, k in zip(t.column("outcome_correct").to_pylist(), n)]
    pq.write_table(t.append_column("first_error", pa.array(first, pa.int32())), mixed / "a.parquet")
    pb = pq.read_table(shards / "pb-gsm8k.parquet")
    pq.write_table(pb.append_column("first_error", pb.column("reference_first_error")), mixed / "b.parquet")
    r = invoke("export", mixed, tmp_path / "x", "--labels", "first_error")
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1
    assert "the rows' step separators disagree ('\\n\\n' in 4 row(s), '\\n' in 1 row(s))" in r.output
    assert not (tmp_path / "x").exists()
    # normalised to \n: the ProcessBench steps that hold a newline are refused, naming the row and step ...
    r = invoke("export", mixed, tmp_path / "x", "--labels", "first_error", "--step-separator", "\\n")
    assert r.exit_code == 1 and "b.parquet: row" in r.output and "holds the step separator '\\n'" in r.output
    # ... or rejoined, counted; never merged silently
    ok("export", mixed, tmp_path / "x", "--labels", "first_error", "--step-separator", "\\n",
       "--separator-in-step", "rejoin")
    m = json.loads((tmp_path / "x" / "stepkit.manifest.json").read_text())
    assert m["step_separator"] == {"value": "\n", "from": "option", "rows_joined_otherwise": 4}
    rows = load(tmp_path / "x")
    assert m["counts"]["steps_rejoined"] == sum("\n" in s.strip() for r in pb.to_pylist() for s in r["steps"]) > 0
    assert not any("\n" in c for r in rows for c in r["completions"])
    with pytest.raises(ConfigError, match="--step-separator ''"):
        ExportConfig(labels="x", step_separator="")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Real step preference pairs: ProcessBench math problems with a correct solution (human label -1, final
    answer correct) and an erroneous one; chosen = the correct one's first two steps (value 1), rejected = the
    erroneous one's steps up to its first wrong step (value 0), steps joined by blank lines."""
    from stepkit.stages.mcts_label import PAIR_SCHEMA

    data = json.loads((DATA / "processbench" / "math.json").read_text())
    by_problem: dict[str, list[dict]] = {}
    for d in data:
        by_problem.setdefault(d["problem"], []).append(d)
    rows = []
    for problem, ds in by_problem.items():
        good = [d for d in ds if d["label"] == -1 and d["final_answer_correct"]]
        bad = [d for d in ds if d["label"] >= 0]
        if good and bad and len(problem) < 400:
            rows.append({"problem_id": good[0]["id"], "prompt": problem, "node_id": "root", "prefix_steps": [],
                         "chosen": good[0]["steps"][:2], "rejected": bad[0]["steps"][:bad[0]["label"] + 1],
                         "chosen_node_id": good[0]["id"], "rejected_node_id": bad[0]["id"], "chosen_value": 1.0,
                         "rejected_value": 0.0, "step_separator": "\n\n"})
        if len(rows) == 4:
            break
    path = tmp_path_factory.mktemp("pairs") / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=PAIR_SCHEMA), path)
    out = path.parent / "dpo"
    ok("export", path, out, "--format", "pairs")
    return rows, out


def test_pairs_carry_the_rows_separator_between_prompt_and_step(pairs):
    rows, out = pairs
    ds = load(out)
    for row, rec in zip(rows, ds):
        assert rec["prompt"] == row["prompt"].rstrip()
        assert rec["chosen"] == "\n\n" + "\n\n".join(row["chosen"])
        assert rec["prompt"] + rec["chosen"] == "\n\n".join([row["prompt"].rstrip(), *row["chosen"]])
    m = json.loads((out / "stepkit.manifest.json").read_text())
    assert m["step_separator"]["value"] == "\n\n" and m["step_separator"]["from"] == "rows"


def test_pairs_tokenise_as_the_dpo_and_reward_trainers_read_them(pairs):
    """TRL's DPO trainer tokenises prompt and prompt + completion and keeps the prompt only if its tokens are a
    prefix of the joint ones; the reward trainer tokenises prompt + chosen. With the bundled model's tokeniser
    the separator opening the completion passes; the same separator ending the prompt does not."""
    from transformers import AutoTokenizer

    from stepkit.models import model_dir

    if not (model_dir("smollm2-135m") / "tokenizer.json").is_file():
        pytest.fail("the bundled model is not prepared: run make model (make test does)")
    tok = AutoTokenizer.from_pretrained(model_dir("smollm2-135m"))
    _, out = pairs
    for rec in load(out):
        for side in ("chosen", "rejected"):
            prompt_ids = tok(rec["prompt"])["input_ids"]
            joint = tok(rec["prompt"] + rec[side])["input_ids"]
            assert joint[:len(prompt_ids)] == prompt_ids
            assert tok.decode(joint) == rec["prompt"] + rec[side]
            moved = tok(rec["prompt"] + "\n\n")["input_ids"]  # the separator at the prompt's end instead
            assert tok(rec["prompt"] + rec[side])["input_ids"][:len(moved)] != moved

