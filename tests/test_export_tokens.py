"""export --tokenizer / --max-length / --on-too-long on real ProcessBench math rows with the bundled model's
tokeniser: per-row token lengths and the labels a step-label trainer with that limit cuts, checked against
the trainer's own tokenisation (prompt ids + each step's ids + the separator's ids, cut to max_length:
TRL's PRMTrainer.tokenize_row up to trl 1.13.0, written here from its documented behaviour)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepkit.errors import ConfigError, InputError
from stepkit.grading.verdicts import labels_from_first_error
from stepkit.models import model_dir
from stepkit.stages.export import ExportConfig, export
from tests.conftest import DATA
from tests.test_export_text import ok

LIMIT = 200


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    if not (model_dir("smollm2-135m") / "tokenizer.json").is_file():
        pytest.fail("the bundled model is not prepared: run make model (make test does)")
    d = tmp_path_factory.mktemp("tok")
    ok("ingest", "processbench", DATA / "processbench" / "math.json", d / "m.parquet", "--limit", "8")
    return d / "m.parquet"


def trainer_cut(tok, prompt, steps, labels, sep, max_length):
    """(tokens, labels the cut drops by value) as a stepwise trainer tokenises a row."""
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    ends = []
    for s in steps:
        ids = ids + tok(s, add_special_tokens=False)["input_ids"] + tok(sep, add_special_tokens=False)["input_ids"]
        ends.append(len(ids))
    kept = ids[:max_length]
    cut = {"true": 0, "false": 0}
    for end, lab in zip(ends, labels):
        if end > len(kept):
            cut["true" if lab else "false"] += 1
    return len(ids), cut


def test_token_lengths_and_cut_labels_match_the_trainers_tokenisation(shard, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir("smollm2-135m"))
    r = ok("export", shard, tmp_path / "ds", "--labels", "reference_first_error", "--tokenizer", "smollm2-135m",
           "--max-length", LIMIT)
    m = json.loads((tmp_path / "ds" / "stepkit.manifest.json").read_text())
    tl = m["token_lengths"]
    rows = pq.read_table(shard).to_pylist()
    want_len, want_cut = [], {"true": 0, "false": 0}
    for row in rows:
        labels = labels_from_first_error(row["reference_first_error"], len(row["steps"]))
        n, cut = trainer_cut(tok, row["prompt"], row["steps"], labels, "\n\n", LIMIT)
        want_len.append(n)
        for k in cut:
            want_cut[k] += cut[k]
    # the tokenizer may merge a step's end with the separator: counted per piece, within a token a step
    assert tl["rows"] == len(rows) and abs(tl["max"] - max(want_len)) <= len(rows[0]["steps"]) + 2
    assert tl["rows_over"] == sum(n > LIMIT for n in want_len) > 0
    assert tl["labels_cut"]["false"] + tl["labels_cut"]["true"] == pytest.approx(sum(want_cut.values()), abs=2)
    assert tl["labels_cut"]["false"] > 0  # the wrong-step labels sit late in a solution: they are the ones cut
    assert f"over --max-length {LIMIT}" in r.output
    card = ok("publish", tmp_path / "ds", "--dry-run").output
    assert card and f"With a {LIMIT}-token limit" in (tmp_path / "ds" / "README.md").read_text()


def test_on_too_long_drop_and_error(shard, tmp_path):
    m = export(shard, tmp_path / "d", ExportConfig(labels="reference_first_error", tokenizer="smollm2-135m",
                                                   max_length=LIMIT, on_too_long="drop"))
    over = m["token_lengths"]["rows_over"]
    assert over > 0 and m["counts"]["too_long"] == over and m["counts"]["rows_out"] == 8 - over
    with pytest.raises(InputError, match=f"tokens \\(smollm2-135m\\) over --max-length {LIMIT}"):
        export(shard, tmp_path / "e", ExportConfig(labels="reference_first_error", tokenizer="smollm2-135m",
                                                   max_length=LIMIT, on_too_long="error"))
    with pytest.raises(ConfigError, match="need --tokenizer"):
        ExportConfig(labels="x", max_length=10)
