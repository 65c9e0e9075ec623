"""train-prm on a real export (4 ProcessBench gsm8k rows, their human first-error labels as hard step labels).

The base model is a one-layer Llama with the bundled model's tokenizer and a random initialisation, built here:
the bundled SmolLM2-135M takes about a minute per optimizer step on this shared 2-core machine, and what these
tests check (label positions, truncation counts, losses, the saved folder, resume) does not depend on its size.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

import stepkit.cli as cli
from stepkit.errors import InputError, StepkitError
from stepkit.stages.train_prm import PRM_FILE, TrainPRMConfig, train_prm
from tests.conftest import DATA

SEP = "\n\n"  # ProcessBench's paragraphs
MAX_LEN = 256  # cuts 12 of the 19 steps of these rows (checked below from the tokenizer's own lengths)


def invoke(*args):
    r = CliRunner().invoke(cli.main, [str(a) for a in args])
    assert r.exit_code == 0, r.output + (r.stderr if r.stderr_bytes else "")
    return r


def build_tiny_base(out: Path) -> Path:
    """A one-layer Llama (hidden 64, head size 32) with the bundled model's tokenizer, saved as a model folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from stepkit.models import resolve_model

    src = resolve_model("smollm2-135m")
    cfg = LlamaConfig.from_pretrained(src)
    cfg.update({"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 32})
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return build_tiny_base(tmp_path_factory.mktemp("tiny") / "base")


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    invoke("ingest", "processbench", DATA / "processbench" / "gsm8k.json", d / "pb.parquet", "--limit", 4)
    invoke("export", d / "pb.parquet", d / "trl", "--format", "trl", "--labels", "reference_first_error")
    return d / "trl"


def expected_cut(folder: Path, base: Path) -> tuple[int, int]:
    """(labels kept, labels dropped) at MAX_LEN, from each piece's token count by the tokenizer itself."""
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    n = lambda s: len(tok(s, add_special_tokens=False).input_ids)  # noqa: E731
    kept = dropped = 0
    for r in datasets.load_dataset(str(folder))["train"]:
        used = n(r["prompt"]) + n(SEP)
        for step in r["completions"]:
            used += n(step) + n(SEP)
            if used <= MAX_LEN:
                kept += 1
            else:
                dropped += 1
    return kept, dropped


@pytest.fixture(scope="module")
def hard(export, tiny_base, tmp_path_factory):
    out = tmp_path_factory.mktemp("prm") / "hard"
    r = invoke("train-prm", export, out, "--base-model", tiny_base, "--max-length", MAX_LEN, "--step-separator", SEP,
               "--max-steps", 3, "--batch-size", 2, "--learning-rate", 1e-3, "--no-progress")
    return out, r


def test_hard_labels_train_and_load_back(hard, export, tiny_base):
    import torch
    from transformers import AutoModelForTokenClassification

    out, r = hard
    doc = json.loads((out / PRM_FILE).read_text())
    kept, dropped = expected_cut(export, tiny_base)
    assert (kept, dropped) == (7, 12)
    c = doc["counts"]
    assert c["labels"] == 19 and c["labels_trained"] == kept and c["labels_dropped"] == dropped
    assert f"{dropped} of 19 labels dropped" in r.stderr  # printed, never silent
    assert doc["labels"] == "hard" and doc["step_separator"] == SEP and doc["train"]["steps"] == 3
    assert all(math.isfinite(x) for x in (doc["train"]["first_loss"], doc["train"]["last_loss"]))
    model = AutoModelForTokenClassification.from_pretrained(out)
    assert type(model).__name__ == "LlamaForTokenClassification" and model.config.num_labels == 2
    assert model.config.id2label[1] == "correct"
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 2)
    assert not (out / "checkpoints").exists()


def test_the_card_names_dataset_lineage_settings_and_dropped_labels(hard, export):
    from stepkit.stages.dataset_card import public_lineage
    from stepkit.stages.export import read_export_manifest

    out, _ = hard
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers")
    assert str(export) in card and "labels dropped by truncation | `12`" in card
    assert "| ingest |" in card and "hard labels from the first-error index `reference_first_error`" in card
    assert "| learning_rate | `0.001` |" in card and "PR #7133" in card
    assert json.loads((out / "lineage.json").read_text()) == json.loads(json.dumps(public_lineage(
        read_export_manifest(export))))


def test_soft_labels_train_by_binary_cross_entropy(export, tiny_base, tmp_path):
    """A dataset saved on disk (save_to_disk) with List(float32) labels: the export's, as floats."""
    import datasets

    ds = datasets.load_dataset(str(export))
    soft = ds.cast_column("labels", datasets.List(datasets.Value("float32")))
    soft.save_to_disk(tmp_path / "soft")
    doc = train_prm(str(tmp_path / "soft"), tmp_path / "out", TrainPRMConfig(
        base_model=str(tiny_base), max_length=MAX_LEN, step_separator=SEP, max_steps=2, batch_size=2,
        learning_rate=1e-3), progress=False, log=lambda m: None)
    assert doc["labels"] == "soft" and doc["loss"].startswith("binary cross-entropy")
    assert doc["counts"]["labels_dropped"] == 12 and doc["dataset"]["loaded_as"] == "saved dataset"
    from transformers import AutoModelForTokenClassification

    assert AutoModelForTokenClassification.from_pretrained(tmp_path / "out").config.num_labels == 2


def test_soft_loss_is_the_two_class_cross_entropy_on_hard_labels():
    import torch

    from stepkit.stages.train_prm import soft_loss

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 2)
    hard = torch.tensor([[-100, 1, -100, 0, 1], [0, -100, -100, -100, 1]])
    ce = torch.nn.functional.cross_entropy(logits.view(-1, 2), hard.view(-1), ignore_index=-100)
    assert torch.isclose(soft_loss(logits, hard.float()), ce, atol=1e-6)
    values = torch.tensor([[-100, 0.25, -100, 0.5, 1.0], [0.0, -100, -100, -100, 0.75]])
    mask = values != -100
    z = (logits[..., 1] - logits[..., 0])[mask]
    v = values[mask]
    manual = -(v * torch.log(torch.sigmoid(z)) + (1 - v) * torch.log(1 - torch.sigmoid(z))).mean()
    assert torch.isclose(soft_loss(logits, values), manual, atol=1e-6)


def test_rerun_is_up_to_date_resumes_and_refuses_another_configuration(export, tiny_base, tmp_path):
    cfg = TrainPRMConfig(base_model=str(tiny_base), max_length=MAX_LEN, step_separator=SEP, max_steps=2,
                         batch_size=2, save_steps=1, keep_checkpoints=True)
    out = tmp_path / "out"
    first = train_prm(str(export), out, cfg, progress=False, log=lambda m: None)
    assert first["status"] == "trained" and (out / "checkpoints" / "checkpoint-1").is_dir()
    assert train_prm(str(export), out, cfg, progress=False)["status"] == "up to date"
    (out / PRM_FILE).unlink()  # as if the run had stopped after its first checkpoint
    logs = []
    again = train_prm(str(export), out, cfg, progress=False, log=logs.append)
    assert again["train"]["resumed_from"].endswith("checkpoint-1") and again["train"]["steps"] == 2
    assert any("resuming from" in m for m in logs)
    other = TrainPRMConfig(**{**cfg.__dict__, "learning_rate": 3e-5})
    with pytest.raises(StepkitError, match="another configuration"):
        train_prm(str(export), out, other, progress=False)
    # --force that fails (every label cut by --max-length) puts the old model back (breaking run D2)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    failing = TrainPRMConfig(**{**cfg.__dict__, "max_length": 8})
    with pytest.raises(StepkitError, match="no training example keeps a label"):
        train_prm(str(export), out, failing, force=True, progress=False, log=lambda m: None)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert not list(tmp_path.glob(".out.replaced-*"))


def test_force_never_deletes_the_dataset_or_a_folder_of_another_tool(export, tiny_base, tmp_path):
    """Breaking run D1/D2: ``train-prm DS DS --force`` deleted the dataset; ``--force`` onto any folder
    deleted it before training."""
    import shutil

    cfg = TrainPRMConfig(base_model=str(tiny_base), max_length=MAX_LEN, step_separator=SEP, max_steps=1)
    copy = tmp_path / "ds"
    shutil.copytree(export, copy)
    for out in (copy, copy / "model", tmp_path):
        with pytest.raises(StepkitError, match="OUT is, holds or lies in the dataset"):
            train_prm(str(copy), out, cfg, force=True, progress=False)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("precious")
    with pytest.raises(StepkitError, match="is not a train-prm folder .nothing was changed."):
        train_prm(str(copy), victim, cfg, force=True, progress=False)
    assert (victim / "notes.txt").read_text() == "precious" and (copy / "stepkit.manifest.json").exists()


def test_bad_rows_are_one_line_naming_split_row_and_column(export, tmp_path):
    import datasets

    rows = datasets.load_dataset(str(export))["train"].to_list()
    rows[2]["labels"] = rows[2]["labels"][:-1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError) as e:
        train_prm(str(bad), tmp_path / "out", TrainPRMConfig(base_model="smollm2-135m"), progress=False)
    assert str(e.value) == (f"{bad} (split train): row 2, column 'labels': {len(rows[2]['completions']) - 1} labels "
                            f"for {len(rows[2]['completions'])} steps")
    r = CliRunner().invoke(cli.main, ["train-prm", str(export), str(tmp_path / "o"), "--base-model", "smollm2-135m",
                                      "--split", "test"])
    assert r.exit_code == 1 and r.stderr.strip() == f"error: {export}: no split 'test' (it has train)"


def test_eval_split_and_last_step_only(export, tiny_base, tmp_path):
    """An export with a test split (export --test-size 1: one problem held out): the loss on it is reported; with
    --train-on-last-step-only one label per row is trained, and when truncation cuts every last step there is
    nothing to train (one line, never a run on no labels)."""
    src = export.parent / "pb.parquet"
    invoke("export", src, tmp_path / "split", "--format", "trl", "--labels", "reference_first_error", "--test-size", 1)
    cfg = TrainPRMConfig(base_model=str(tiny_base), max_length=MAX_LEN, step_separator=SEP, max_steps=1,
                         batch_size=2, eval_split="test", train_on_last_step_only=True)
    with pytest.raises(StepkitError, match="no training example keeps a label within --max-length 256 "
                                           r"\(3 labels dropped\)"):
        train_prm(str(tmp_path / "split"), tmp_path / "cut", cfg, progress=False, log=lambda m: None)
    doc = train_prm(str(tmp_path / "split"), tmp_path / "out", TrainPRMConfig(**{**cfg.__dict__, "max_length": 2048}),
                    progress=False, log=lambda m: None)
    assert doc["counts"]["rows"] == 3 and doc["eval_counts"]["rows"] == 1
    assert doc["counts"]["labels"] == doc["counts"]["labels_trained"] == 3  # the outcome only
    assert doc["eval_counts"]["labels"] == doc["eval_counts"]["steps"]  # evaluated on every step's label
    assert doc["eval_loss"] is not None and math.isfinite(doc["eval_loss"])


def test_threads_reach_torch_for_the_run_and_are_restored(export, tiny_base, tmp_path, monkeypatch):
    """--threads N is torch.set_num_threads(N) while training (recorded in stepkit-prm.json and the card),
    the caller's count is restored afterwards, and the count is no part of the identity (a rerun with another
    count is up to date, not refused)."""
    import torch

    calls = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n))[1])
    before = torch.get_num_threads()
    real(2)
    try:
        r = invoke("train-prm", export, tmp_path / "out", "--base-model", tiny_base, "--max-length", MAX_LEN,
                   "--step-separator", SEP, "--max-steps", 1, "--batch-size", 2, "--threads", 1, "--no-progress")
        assert torch.get_num_threads() == 2  # restored
        assert calls == [1, 2]
        doc = json.loads((tmp_path / "out" / PRM_FILE).read_text())
        assert doc["train"]["threads"] == 1 and "threads" not in doc["settings"]
        assert "1 torch thread(s)" in r.stderr and "| torch threads | `1` |" in (tmp_path / "out" / "README.md").read_text()
        r = invoke("train-prm", export, tmp_path / "out", "--base-model", tiny_base, "--max-length", MAX_LEN,
                   "--step-separator", SEP, "--max-steps", 1, "--batch-size", 2, "--threads", 2, "--no-progress")
        assert "up to date" in r.stderr
    finally:
        real(before)


@pytest.mark.parametrize(("cores", "expected"), [({0}, 1), ({0, 1}, 1), (set(range(8)), 4)])
def test_threads_auto_is_half_the_usable_cores(cores, expected, monkeypatch):
    import os

    from stepkit.stages.train_prm import resolve_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores)
    assert resolve_threads("auto") == expected and resolve_threads(3) == 3
    assert TrainPRMConfig(base_model="x").threads == "auto"
    with pytest.raises(Exception, match="threads"):
        TrainPRMConfig(base_model="x", threads=0)
